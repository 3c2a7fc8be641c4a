"""README.md's runnable blocks, read by the tests that run them as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_bash_lines(heading: str) -> list[str]:
    """The non-blank lines of the first ```bash block under README.md's "## HEADING", in order."""
    text = README.read_text(encoding="utf-8")
    section = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, f"README.md has no '## {heading}' section"
    block = re.search(r"^```bash\n(.*?)^```", section.group(1), re.M | re.S)
    assert block, f"README.md's {heading} section has no ```bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]
