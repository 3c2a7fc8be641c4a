"""Figures of a comparison: success per method with 95% intervals over test games, and paired differences.

A record is an evaluation's {"results": {"success", "greedy_success"}, "per_task": {mode: {game: success}}}
(benchmarks.lib.compare.Comparison.evaluate); a list of records holds one per seed.
"""

from __future__ import annotations

from typing import Any

from omrl.train.iterate.evaluation import interval


def per_game(records: list[dict[str, Any]], mode: str) -> dict[str, float]:
    """Each test game's success averaged over seeds (games every seed has an outcome for)."""
    tables = [r["per_task"].get(mode, {}) for r in records]
    games = set.intersection(*(set(t) for t in tables)) if tables else set()
    return {g: sum(t[g] for t in tables) / len(tables) for g in sorted(games)}


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over seeds of sampled and greedy success, with 95% intervals over test games, and per seed."""
    out: dict[str, Any] = {}
    for mode, key in (("sampled", "success"), ("greedy", "greedy_success")):
        seeds = [r["results"].get(key) for r in records]
        if any(v is None for v in seeds):
            out[mode] = out[f"{mode}_ci95"] = None
            continue
        out[mode] = round(sum(seeds) / len(seeds), 4)
        out[f"{mode}_ci95"] = round(interval(list(per_game(records, mode).values())), 4)
    out["per_seed"] = [{"sampled": r["results"].get("success"), "greedy": r["results"].get("greedy_success")}
                       for r in records]
    return out


def paired_points(a: list[dict[str, Any]], b: list[dict[str, Any]], mode: str) -> dict[str, float | None]:
    """a minus b in points, paired per test game (seed-averaged), with its 95% interval."""
    pa, pb = per_game(a, mode), per_game(b, mode)
    games = sorted(set(pa) & set(pb))
    if not games:
        return {"points": None, "ci95": None}
    diffs = [pa[g] - pb[g] for g in games]
    return {"points": round(100 * sum(diffs) / len(diffs), 1), "ci95": round(100 * interval(diffs), 1)}
