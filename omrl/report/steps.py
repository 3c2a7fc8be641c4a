"""Per training step from the stored rollouts (GRPO and PPO tag each with its step): episodes, reward,
success and mean judge score per (run, round, step).
"""

from __future__ import annotations

from typing import Any

from omrl.schema import SUCCESS_SQL

# Per step from the stored rollouts: GRPO and PPO tag each rollout's metadata with its step. A GRPO rollout
# played at TRL global step k is trained on in update k + 1, the step its log entry carries: shifted to match.
# The run is the run_id without its /step-N tail (an attempt-N of a re-run stays apart).
_TAGGED_SQL = """
SELECT id, regexp_replace(run_id, '/step-[0-9]+$', '') AS run, round, reward, success, status,
       CASE WHEN grpo_step IS NOT NULL THEN 'grpo' ELSE 'ppo' END AS kind, coalesce(grpo_step + 1, ppo_step) AS step
FROM (
    SELECT *,
           CASE WHEN json_valid(metadata) THEN TRY_CAST(json_extract_string(metadata, '$.grpo_step') AS INTEGER)
           END AS grpo_step,
           CASE WHEN json_valid(metadata) THEN TRY_CAST(json_extract_string(metadata, '$.ppo_step') AS INTEGER)
           END AS ppo_step
    FROM trajectories WHERE contains(metadata, '_step')  -- cheap pre-filter
)
WHERE grpo_step IS NOT NULL OR ppo_step IS NOT NULL
"""
STEPS_SQL = f"""
SELECT run, round, kind, step, count(*) AS episodes, avg(reward) AS mean_reward, {SUCCESS_SQL}
FROM ({_TAGGED_SQL}) GROUP BY run, round, kind, step ORDER BY run, round, step
"""
# The mean judge score per step of those rollouts (newest ok score per trajectory and annotator).
STEP_SCORES_SQL = f"""
SELECT t.run, t.round, a.annotator, t.step, count(*) AS n, avg(a.score) AS mean_score
FROM ({_TAGGED_SQL}) t JOIN latest_annotations a ON a.trajectory_id = t.id
WHERE a.kind = 'score' AND a.status = 'ok' AND isfinite(a.score)
GROUP BY t.run, t.round, a.annotator, t.step ORDER BY t.run, t.round, a.annotator, t.step
"""


def stored_step_stats(store) -> list[dict[str, Any]]:
    """Episodes, mean reward and success rate per (run, round, step) of the GRPO/PPO rollouts in the store."""
    return store.sql(STEPS_SQL).to_pylist()


def stored_step_scores(store) -> list[dict[str, Any]]:
    """Mean score per (run, round, annotator, step) of the annotations on the stored GRPO/PPO rollouts."""
    return store.sql(STEP_SCORES_SQL).to_pylist()


def _by_run(stats: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in stats:
        runs.setdefault((row["run"], row["round"]), []).append(row)
    return runs
