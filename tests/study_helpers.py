"""A tiny study on 12 shipped grid tasks, for the study tests (check, run, report)."""

from __future__ import annotations

import json
from pathlib import Path

from omrl.shipped import resolve_tasks


def tiny_study(folder: Path, copied: bool, extra: str = "") -> Path:
    """study.yaml in `folder` over its tasks.jsonl (train 8, dev 2, test 2; with `copied`, train's first task
    again in test under a new id), sft / more_sft / grpo at 2 optimizer steps, 2 seeds; `extra` YAML appended."""
    rows = [json.loads(line) for line in Path(resolve_tasks("shipped:grid_train")).read_text().splitlines()][:12]
    if copied:  # train's first task in test under a new id
        rows.append({**rows[0], "id": "test-copy", "split": "eval"})
    (folder / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    study = folder / "study.yaml"
    study.write_text("name: tiny\nenv: grid\n"
                     "tasks: {train: 'tasks.jsonl[:8]', dev: 'tasks.jsonl[8:10]', test: 'tasks.jsonl[10:]'}\n"
                     "methods: {sft: sft, more_sft: more_sft, grpo: {kind: grpo, grid: {learning_rate: [1e-4]}}}\n"
                     "budget: {unit: optimizer_steps, value: 2}\nseeds: 2\n"
                     "primary: {a: best_rl_on_dev, b: more_sft, metric: greedy}\n" + extra)
    return study
