"""Outcomes and the success rate: the one rule, spelled in Python (success_counts) and SQL (SUCCESS_SQL)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omrl.schema.tables import FAILED_STATUSES

#
# Success rate = solved / episodes with a known outcome. An episode has a known outcome when its status is
# not failed (FAILED_STATUSES) and `success` is not null. Failed episodes (`failed`) and finished episodes
# whose success is unknown (`unknown_success`) are counted beside the rate, never as failures or successes,
# so episodes = known + failed + unknown_success. No known outcome: the rate is None (SQL NULL), not 0.
# `success_counts` (Python) and `SUCCESS_SQL` (DuckDB aggregates) are the only two spellings of this rule;
# stats, report, the `groups` view and eval all use them.


def is_failed(status: str | None) -> bool:
    """Whether an episode failed (env_error, policy_error, timeout); a missing status is ok."""
    return (status or "ok") in FAILED_STATUSES


@dataclass(frozen=True)
class SuccessCounts:
    """The success rate of some episodes, with what it leaves out counted beside it."""

    episodes: int = 0
    solved: int = 0
    known: int = 0  # episodes with a known outcome: not failed, success not null
    failed: int = 0  # status in FAILED_STATUSES
    unknown_success: int = 0  # not failed, success null

    @property
    def rate(self) -> float | None:
        return self.solved / self.known if self.known else None

    def as_dict(self) -> dict[str, Any]:
        """The columns shown wherever a success rate is: the rate, then what it leaves out."""
        return {"success_rate": self.rate, "failed": self.failed, "unknown_success": self.unknown_success}


def success_counts(rows: Any) -> SuccessCounts:
    """Count rows (mappings with `status` and `success`) by outcome; see the definition above."""
    episodes = solved = known = failed = 0
    for row in rows:
        episodes += 1
        if is_failed(row.get("status")):
            failed += 1
        elif row.get("success") is not None:
            known += 1
            solved += bool(row["success"])
    return SuccessCounts(episodes, solved, known, failed, episodes - known - failed)


_FAILED_SQL = "coalesce(status, 'ok') IN (" + ", ".join(f"'{s}'" for s in FAILED_STATUSES) + ")"
_KNOWN_SQL = f"(NOT ({_FAILED_SQL}) AND success IS NOT NULL)"
# Aggregate columns over a table with `status` and `success` (trajectories): the same rule in SQL, the
# same columns as SuccessCounts.as_dict (success_rate, failed, unknown_success).
SUCCESS_RATE_SQL = f"avg(CASE WHEN {_KNOWN_SQL} THEN CASE WHEN success THEN 1.0 ELSE 0.0 END END)"
SUCCESS_SQL = (f"{SUCCESS_RATE_SQL} AS success_rate, "
               f"count(*) FILTER (WHERE {_FAILED_SQL}) AS failed, "
               f"count(*) FILTER (WHERE NOT ({_FAILED_SQL}) AND success IS NULL) AS unknown_success")


def success_sql(digits: int | None = None) -> str:
    """SUCCESS_SQL, the rate rounded to `digits` when given (for display tables)."""
    if digits is None:
        return SUCCESS_SQL
    return SUCCESS_SQL.replace(f"{SUCCESS_RATE_SQL} AS", f"round({SUCCESS_RATE_SQL}, {int(digits)}) AS", 1)
