"""The test ledger: every scoring of a study's test set, one JSON line each in STUDY_FOLDER/test_ledger.jsonl.

A line holds the study's settings hash (omrl.study.spec.settings_hash), the time and what was scored (a
method, a seed, a condition). A study scores its test set under one settings hash; scoring it again under
another one (settings changed after the test set was seen) is refused unless `rescore=True`, and
`test_scorings` counts the settings hashes the test set was scored under: 1 for a clean study. Scoring the same
thing again under the same settings (a run redone after a kill) is recorded and is not a new scoring.

Appends survive a crash: the check and the append hold an flock on the ledger, each line goes out in one
write() on a file opened O_APPEND and is fsynced (the folder too when the file is new, omrl.store.durable). A
line cut short by a crash mid-write is skipped when read and counted in `torn_lines`; the next append starts
on a fresh line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.schema.ids import utcnow
from omrl.store.durable import fsync_path

LEDGER_FILE = "test_ledger.jsonl"


class RescoreRefused(UsageError):
    """A second scoring of the test set under changed settings, without rescore."""


class TestLedger:
    """The test ledger of the study in `folder` (created on the first record)."""

    __test__ = False  # a product class, not a pytest test class

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LEDGER_FILE

    def _read(self) -> tuple[list[dict[str, Any]], int]:
        """(the whole entries in file order, the number of torn lines skipped)."""
        if not self.path.is_file():
            return [], 0
        entries, torn = [], 0
        for line in self.path.read_bytes().split(b"\n"):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except (UnicodeDecodeError, ValueError):
                torn += 1
                continue
            if isinstance(entry, dict) and isinstance(entry.get("settings_hash"), str):
                entries.append(entry)
            else:
                torn += 1
        return entries, torn

    def entries(self) -> list[dict[str, Any]]:
        """Every recorded scoring, in the order recorded."""
        return self._read()[0]

    @property
    def torn_lines(self) -> int:
        """Lines that are not a whole entry (a write cut short by a crash)."""
        return self._read()[1]

    @property
    def test_scorings(self) -> int:
        """How many settings the test set was scored under (1 for a clean study, 0 before any scoring)."""
        return len(_hashes(self.entries()))

    def record(self, settings_hash: str, what: dict[str, Any], *, rescore: bool = False) -> dict[str, Any]:
        """Record a scoring of the test set under `settings_hash` (`what`: what was scored), durably, and return
        the entry; RescoreRefused when the test set was scored under other settings and not `rescore`. The same
        scoring under the same settings (a resumed study asking again) returns its first entry, recorded once."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._locked():
            entries, _ = self._read()
            for entry in entries:
                if entry["settings_hash"] == settings_hash and entry["what"] == json.loads(json.dumps(what,
                                                                                                      default=str)):
                    return entry
            earlier = [h for h in _hashes(entries) if h != settings_hash]
            changed = bool(earlier) and settings_hash not in _hashes(entries)  # a new scoring, not a redo
            if changed and not rescore:
                first = next(e for e in entries if e["settings_hash"] == earlier[0])
                raise RescoreRefused(
                    f"{self.path}: the test set was scored under settings {earlier[0]} ({first.get('time')}); "
                    f"these settings are {settings_hash}: pass --rescore (rescore=True) to score it again (test_scorings becomes "
                    f"{len(earlier) + 1})")
            entry = {"settings_hash": settings_hash, "time": utcnow().isoformat(),
                     "what": what, "rescore": changed}
            self._append(json.dumps(entry, sort_keys=True, ensure_ascii=False, default=str))
        return entry

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """An exclusive flock beside the ledger: two scorings never both pass the check."""
        with open(self.folder / f".{LEDGER_FILE}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _append(self, line: str) -> None:
        new = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            torn_tail = size > 0 and _last_byte(self.path) != b"\n"
            data = (("\n" if torn_tail else "") + line + "\n").encode("utf-8")
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(f"{self.path}: short write ({written} of {len(data)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            fsync_path(self.folder)  # the new name itself survives a crash


def _hashes(entries: list[dict[str, Any]]) -> list[str]:
    """The settings hashes in the order first recorded."""
    return list(dict.fromkeys(e["settings_hash"] for e in entries))


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)
