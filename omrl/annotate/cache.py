"""Judge reply cache: valid replies keyed by prompt hash, in STORE/cache/judge/replies.jsonl.

Only replies that parsed and validated are cached, so a re-run asks again exactly where the last
run failed. One JSON object per line, appended; a torn last line (crash mid-write) is ignored.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omrl.schema import utcnow


def prompt_hash(model: str, messages: list[dict[str, Any]], temperature: float) -> str:
    """The cache key of one judge request: model, sampling temperature and the exact messages."""
    text = json.dumps({"model": model, "temperature": temperature, "messages": messages},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class JudgeCache:
    """An append-only reply cache in a folder (None path: in-memory only)."""

    def __init__(self, folder: str | Path | None):
        self.path = Path(folder) / "replies.jsonl" if folder is not None else None
        self.entries: dict[str, dict[str, Any]] = {}
        self.bad_lines = 0
        if self.path is not None and self.path.is_file():
            for line in self.path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                    self.entries[entry["prompt_hash"]] = entry
                except (json.JSONDecodeError, KeyError, TypeError):
                    self.bad_lines += 1

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, key: str, content: str, prompt_tokens: int, completion_tokens: int, model: str) -> None:
        entry = {"prompt_hash": key, "content": content, "prompt_tokens": prompt_tokens,
                 "completion_tokens": completion_tokens, "model": model, "created_at": utcnow().isoformat()}
        self.entries[key] = entry
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # One write call per line: concurrent appenders interleave whole lines, not bytes.
            with open(self.path, "a") as f:
                f.write(json.dumps(entry, ensure_ascii=False) + "\n")
