"""SWE-smith's 13 Python procedural modifiers (swesmith 0.0.9) as a source of candidate bugs (`--option
modifiers=swesmith`).

SWE-smith and what its modifiers import (libcst, tree-sitter >= 0.25 and its grammars) live in their own folder
under omrl's cache, installed on first use with pip (wheels only): omrl's environment cannot hold them (bfcl-eval
pins tree-sitter 0.21). Its modifiers only read the package's source (libcst), in a subprocess
(swesmith_worker.py) with that folder first on its path; omrl turns each rewrite into a Candidate.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import omrl.envs.swe.bugs as bugs
import omrl.envs.swe.packages as packages
from omrl.errors import UsageError

VERSION = "0.0.9"
REQUIREMENTS = [f"swesmith=={VERSION}", "libcst>=1.1", "astor>=0.8", "tree-sitter>=0.25",
                # its procedural and adapters packages import every language's grammar
                *(f"tree-sitter-{lang}" for lang in ("c", "cpp", "c-sharp", "go", "java", "javascript", "php", "ruby",
                                                     "rust", "typescript"))]
WORKER = Path(__file__).with_name("swesmith_worker.py")


def tool_folder(progress=print) -> Path:
    """SWE-smith's folder, installed once and then checked to import; UsageError (one line) saying what failed."""
    folder = packages.cache_dir() / "tools" / f"swesmith-{VERSION}"
    if (folder / ".omrl-complete").exists():
        return folder  # a later import failure shows as the worker's own (candidates)
    progress(f"installing SWE-smith {VERSION} and what its modifiers import into {folder} (once)")
    try:
        packages.install_folder(folder, REQUIREMENTS)
    except UsageError as exc:
        raise UsageError(f"SWE-smith's modifiers do not install here: {exc}") from None
    check = _worker(folder, "--check", timeout_s=300)
    if check.returncode != 0:
        raise UsageError(f"SWE-smith's modifiers do not import here: {_last_line(check.stderr)}")
    return folder


def candidates(tree: Path, folder: Path, seed: int = 0) -> list[bugs.Candidate]:
    """Each SWE-smith modifier's change to each function and class of the package's source (where SWE-smith's
    own likelihoods, seeded, pick it), in a seeded order; UsageError when the worker fails."""
    files = bugs.source_files(tree)
    result = _worker(folder, input=json.dumps({"root": str(tree), "files": files, "seed": seed}), timeout_s=3600)
    if result.returncode != 0:
        raise UsageError(f"SWE-smith's modifiers failed on {tree.name}: {_last_line(result.stderr)}")
    sources: dict[str, bugs._Source] = {}
    found = []
    for line in result.stdout.splitlines():
        change = json.loads(line)
        path = change["path"]
        if path not in sources:
            sources[path] = bugs._Source((tree / path).read_text(encoding="utf-8", errors="replace"))
        source = sources[path]
        indent = " " * change["indent"]  # SWE-smith writes the entity's text from column 0
        text = "".join(indent + line if line.strip() else line for line in change["rewrite"].splitlines(True))
        buggy = source.replace_lines(change["start"], change["end"], text)
        if buggy is not None and buggy != source.text:
            found.append(bugs.Candidate(path, change["function"], change["modifier"], buggy, source.text))
    random.Random(seed).shuffle(found)
    return found


def _worker(folder: Path, *args: str, input: str | None = None, timeout_s: float) -> subprocess.CompletedProcess:
    # -I: neither PYTHONPATH nor the user's site nor the current folder; the worker puts `folder` first itself
    return subprocess.run([sys.executable, "-I", str(WORKER), str(folder), *args], input=input, capture_output=True,
                          text=True, timeout=timeout_s)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
