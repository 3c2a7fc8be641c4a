"""Summary statistics of a store, as Arrow tables computed with SQL."""

from __future__ import annotations

import pyarrow as pa

from omrl.schema import success_sql
from omrl.store import Store

# Success rate: solved / episodes with a known outcome (omrl.schema), failed and unknown counted beside it.
OVERVIEW_SQL = f"""
SELECT count(*) AS trajectories, count(DISTINCT task_id) AS tasks, count(DISTINCT group_id) AS groups,
       count(DISTINCT run_id) AS runs, round(avg(reward), 4) AS mean_reward,
       {success_sql(4)},
       round(avg(num_turns), 2) AS mean_turns, sum(prompt_tokens + completion_tokens) AS tokens
FROM trajectories
"""

BREAKDOWN_SQL = f"""
SELECT {{key}}, count(*) AS n, round(avg(reward), 4) AS mean_reward,
       {success_sql(4)},
       round(avg(num_turns), 2) AS mean_turns
FROM trajectories GROUP BY {{key}} ORDER BY {{key}}
"""

ANNOTATION_SQL = """
SELECT annotator, count(*) AS n, count(*) FILTER (WHERE status = 'error') AS errors,
       round(avg(score) FILTER (WHERE status = 'ok'), 4) AS mean_score
FROM latest_annotations GROUP BY annotator ORDER BY annotator
"""


def store_stats(store: Store) -> dict[str, pa.Table]:
    """Named summary tables: overview, by env, by status, by round, by source, annotations."""
    with store.connect() as con:
        tables = {"overview": con.sql(OVERVIEW_SQL).to_arrow_table()}
        for key in ("env", "status", "round", "source"):
            tables[f"by {key}"] = con.sql(BREAKDOWN_SQL.format(key=key)).to_arrow_table()
        annotations = con.sql(ANNOTATION_SQL).to_arrow_table()
    if annotations.num_rows:
        tables["annotations"] = annotations
    return tables
