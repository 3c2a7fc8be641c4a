"""A learning benchmark's result (benchmark.json): read and turned into a table row per method."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omrl.errors import UsageError

BENCHMARK_COLUMNS = ("method", "sampled", "greedy", "greedy per seed", "training rollouts", "wall s per seed",
                     "settings")


def read_benchmark(path: str | Path) -> dict[str, Any]:
    """A learning benchmark's result (benchmarks/hard_task.py's benchmark.json: `methods`, each with
    sampled and greedy success and their intervals, and optionally `curves`)."""
    path = Path(path)
    try:
        line = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a benchmark result ({exc})") from None
    if not isinstance(line, dict) or not isinstance(line.get("methods"), dict):
        raise UsageError(f"{path}: not a benchmark result (no `methods` object)")
    return line


def _percent(value: Any, ci: Any = None) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{100 * value:.1f}%" + (f" ±{100 * ci:.1f}" if isinstance(ci, (int, float)) and ci else "")


def benchmark_rows(line: dict[str, Any]) -> list[dict[str, str]]:
    """One table row per method of a benchmark result (the columns of BENCHMARK_COLUMNS)."""
    rows = []
    for method, m in line["methods"].items():
        seeds = [_percent(s.get("greedy")) for s in m.get("per_seed") or []]
        settings = m.get("hyperparameters")
        rows.append({"method": method, "sampled": _percent(m.get("sampled"), m.get("sampled_ci95")),
                     "greedy": _percent(m.get("greedy"), m.get("greedy_ci95")),
                     "greedy per seed": " / ".join(seeds) if any(s != "-" for s in seeds) else "-",
                     "training rollouts": str(m.get("training_rollouts", "-")),
                     "wall s per seed": " / ".join(f"{w:.0f}" for w in m.get("wall_s") or []) or "-",
                     "settings": json.dumps(settings, sort_keys=True) if settings else "-"})
    return rows
