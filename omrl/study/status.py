"""Where a study folder stands while `omrl study run` works on it (or after it stopped): `omrl study status OUT`.

    status = study_status("runs/my-study")   # {conditions: {NAME: {...}}, test_scorings, pending_conditions}

Read only, from what the runner leaves: each condition's benchmark_state.json (omrl.study.compare.Comparison:
a record per finished training or evaluation, with its seconds), its claims/ folder (a run being worked on: the
claiming process' pid, claimed at the file's time; a claim whose process is gone is stale, and the next
`omrl study run` takes the run over), the test ledger, and study.json once a condition is done.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.store.durable import pid_alive
from omrl.store.study_folder import CLAIMS, STATE_FILE, STUDY_FILE, claim_holder, claim_key, condition_folders
from omrl.study.ledger import TestLedger
from omrl.train.iterate.state import IterateState


def study_status(out: str | Path) -> dict[str, Any]:
    """Per condition folder (NAME-DIGEST): finished trainings and evaluations (dev, test) with their seconds, the
    last one finished, the runs in progress (live claims: key, pid, minutes since claimed) and stale claims;
    the ledger's test scorings; study.json's pending conditions (None before it is written). UsageError when
    `out` holds no study run."""
    out = Path(out)
    folders = [p for p in condition_folders(out) if (p / STATE_FILE).is_file() or (p / CLAIMS).is_dir()]
    if not folders:
        raise UsageError(f"{out}: no study run here (no conditions/*/{STATE_FILE}); start one with omrl study run")
    conditions = {folder.name: condition_status(folder) for folder in folders}
    study_file = out / STUDY_FILE
    pending = json.loads(study_file.read_text(encoding="utf-8")).get("pending_conditions") \
        if study_file.is_file() else None
    return {"out": str(out), "conditions": conditions, "test_scorings": TestLedger(out).test_scorings,
            "pending_conditions": pending}


def condition_status(folder: Path) -> dict[str, Any]:
    """One condition folder's finished stages, counted by kind, and its claims (see study_status)."""
    stages = IterateState(folder / STATE_FILE).data["stages"]
    counts = {"train": 0, "dev": 0, "test": 0}
    for stage in stages:
        kind = stage["stage"].split("/")[1] if stage["stage"].count("/") >= 2 else None
        if kind in counts:
            counts[kind] += 1
    running, stale = [], []
    now = time.time()
    for claim in sorted((folder / CLAIMS).glob("*.pid")):
        pid = claim_holder(claim)
        try:
            claimed = claim.stat().st_mtime
        except OSError:
            continue  # released while it was read: the run just finished or was taken over
        if not pid:
            continue  # its pid not written yet (a run starting this instant), or not a pid
        entry = {"key": claim_key(claim), "pid": pid, "minutes": round((now - claimed) / 60, 1)}
        (running if pid_alive(pid) else stale).append(entry)
    return {"trained": counts["train"], "dev_evaluations": counts["dev"], "test_evaluations": counts["test"],
            "hours": round(sum(float(s.get("seconds") or 0.0) for s in stages) / 3600, 2),
            "last_finished": stages[-1]["stage"] if stages else None, "running": running, "stale_claims": stale}
