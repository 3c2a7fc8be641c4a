"""Judge vs environment agreement per round and per training step: Pearson and Spearman r of judge scores
against environment rewards, flagged when weak or fallen (the first sign of reward hacking).
"""

from __future__ import annotations

import math
from typing import Any

from omrl.report.steps import _TAGGED_SQL

# A round is flagged when its agreement is weak or has fallen: at least AGREEMENT_MIN_N pairs and a Pearson
# correlation below AGREEMENT_LOW, or AGREEMENT_DROP below the same annotator's previous round with a value.
# A judge whose scores stop following the environment's reward is the first sign of reward hacking.
AGREEMENT_MIN_N = 5
AGREEMENT_LOW = 0.3
AGREEMENT_DROP = 0.2
AGREEMENT_RULE = (f"flagged: n >= {AGREEMENT_MIN_N} and Pearson r < {AGREEMENT_LOW}, or r at least {AGREEMENT_DROP} "
                  "below the annotator's previous round (per step: the previous step of the same run and round): "
                  "the judge stops following the environment (a sign of reward hacking)")
SCATTER_POINTS = 400  # per annotator and round, a deterministic sample (by id hash) for the plot


# Pairs: the newest ok score of each annotator (latest_annotations) beside the trajectory's environment
# reward. Spearman is Pearson over average ranks (ties share their mean rank).
_PAIRS_SQL = """
SELECT a.annotator, t.round, a.trajectory_id, a.score, t.reward
FROM latest_annotations a JOIN trajectories t ON t.id = a.trajectory_id
WHERE a.kind = 'score' AND a.status = 'ok' AND isfinite(a.score) AND isfinite(t.reward)
"""
# The same pairs on the GRPO/PPO rollouts stored per step, keyed by their run, round, kind and step.
_STEP_PAIRS_SQL = f"""
SELECT a.annotator, t.run, t.round, t.kind, t.step, a.trajectory_id, a.score, t.reward
FROM ({_TAGGED_SQL}) t JOIN latest_annotations a ON a.trajectory_id = t.id
WHERE a.kind = 'score' AND a.status = 'ok' AND isfinite(a.score) AND isfinite(t.reward)
"""


def _agreement_sql(pairs: str, keys: list[str]) -> str:
    """Per annotator and `keys` of `pairs` (annotator, keys, trajectory_id, score, reward): n, Pearson,
    Spearman, mean score and reward, ordered by annotator then keys (the one agreement formula)."""
    group = ", ".join(["annotator", *keys])
    return f"""
WITH pairs AS ({pairs}),
ranked AS (
    SELECT *,
        rank() OVER (PARTITION BY {group} ORDER BY score)
            + (count(*) OVER (PARTITION BY {group}, score) - 1) / 2.0 AS score_rank,
        rank() OVER (PARTITION BY {group} ORDER BY reward)
            + (count(*) OVER (PARTITION BY {group}, reward) - 1) / 2.0 AS reward_rank
    FROM pairs
)
SELECT {group}, count(*) AS n, corr(score, reward) AS pearson, corr(score_rank, reward_rank) AS spearman,
       avg(score) AS mean_score, avg(reward) AS mean_reward
FROM ranked GROUP BY {group} ORDER BY {group}
"""


AGREEMENT_SQL = _agreement_sql(_PAIRS_SQL, ["round"])
# Per step within a run's round: a series per (annotator, run, round, kind), flagged against its own
# previous step as rounds are against the previous round.
STEP_SERIES = ("run", "round", "kind")
STEP_AGREEMENT_SQL = _agreement_sql(_STEP_PAIRS_SQL, [*STEP_SERIES, "step"])
SCATTER_SQL = f"""
SELECT annotator, round, score, reward FROM ({_PAIRS_SQL})
QUALIFY row_number() OVER (PARTITION BY annotator, round ORDER BY hash(trajectory_id), trajectory_id)
        <= {SCATTER_POINTS}
ORDER BY annotator, round
"""


def _number(value: Any) -> float | None:
    # corr() of a constant column is NaN (or NULL): no correlation to speak of
    return None if value is None or not math.isfinite(value) else float(value)


def judge_agreement(store) -> list[dict[str, Any]]:
    """Per score annotator and trajectory round, where both a judge score and an environment reward exist:
    n, Pearson and Spearman correlation, mean score and reward, and `flag` (the rule above; '' if none)."""
    return flag_agreement(store.sql(AGREEMENT_SQL).to_pylist())


def step_agreement(store) -> list[dict[str, Any]]:
    """judge_agreement per training step: per annotator, run, round, kind (grpo/ppo) and step of the stored
    rollouts, flagged by the same rule against the series' previous step."""
    return flag_step_agreement(store.sql(STEP_AGREEMENT_SQL).to_pylist())


def flag_step_agreement(agreements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """STEP_AGREEMENT_SQL's rows flagged (flag_agreement, each series against its previous step)."""
    return flag_agreement(agreements, series=STEP_SERIES, unit="step")


def flag_agreement(agreements: list[dict[str, Any]], series: tuple[str, ...] = (), unit: str = "round"
                   ) -> list[dict[str, Any]]:
    """Agreement rows ordered by annotator, `series` keys, then `unit` (AGREEMENT_SQL's or
    STEP_AGREEMENT_SQL's) with NaN correlations as None and `flag` set; a fall is measured against the
    previous `unit` of the same annotator and series."""
    previous: dict[tuple, float] = {}
    for row in agreements:
        row["pearson"], row["spearman"] = _number(row["pearson"]), _number(row["spearman"])
        flags = []
        key = (row["annotator"], *(row[k] for k in series))
        r, before = row["pearson"], previous.get(key)
        if row["n"] >= AGREEMENT_MIN_N and r is not None:
            if r < AGREEMENT_LOW:
                flags.append(f"low (r < {AGREEMENT_LOW})")
            if before is not None and r <= before - AGREEMENT_DROP:
                flags.append(f"fell {before - r:.2f} since the previous {unit}")
        row["flag"] = "; ".join(flags)
        if r is not None and row["n"] >= AGREEMENT_MIN_N:
            previous[key] = r
    return agreements
