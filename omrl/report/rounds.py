"""Per-round statistics of a store's collected and GRPO data (eval runs excluded)."""

from __future__ import annotations

from typing import Any

from omrl.schema import SUCCESS_SQL

# Success rate: solved / episodes with a known outcome (omrl.schema); failed and unknown counted beside it.
ROUND_SQL = f"""
SELECT round, count(*) AS trajectories, {SUCCESS_SQL},
       avg(reward) AS mean_reward, avg(num_turns) AS mean_turns,
       avg(coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0))
           FILTER (WHERE prompt_tokens IS NOT NULL OR completion_tokens IS NOT NULL) AS mean_tokens
FROM trajectories WHERE coalesce(source, '') <> 'eval'
GROUP BY round ORDER BY round
"""


def round_stats(store) -> list[dict[str, Any]]:
    """Per-round counts, success rate (with failed and unknown-success counts), mean reward, turns, tokens.

    Eval runs are excluded."""
    return store.sql(ROUND_SQL).to_pylist()
