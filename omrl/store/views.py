"""The store's views on a DuckDB connection: trajectories, messages (one row per message), turns, tool_calls
(read from each part's flat side file where it has one: omrl.store.layout), annotations, latest_annotations
(newest per trajectory and annotator), scores (latest ok scores pivoted, one column per annotator), groups
(per group_id: n, mean and std of reward, success rate).

DuckDB itself opens no file: the parts are handed to it as pyarrow datasets, opened through the store's
storage (omrl.store.query.connect then switches DuckDB's own file access off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from omrl.schema import SCHEMAS, SUCCESS_SQL
from omrl.store.layout import TOOL_CALLS_SCHEMA

if TYPE_CHECKING:  # a type only: any store; the views need only the reading half of Store
    from omrl.store.parts import StoreReader as Store

VIEWS = ("trajectories", "messages", "turns", "tool_calls", "annotations", "latest_annotations", "scores",
         "groups")


def quote_literal(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def quote_ident(name: str) -> str:
    """A SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


class _OwnThreadScans(ds.FileSystemDataset):
    """A dataset whose scans decode Parquet in the thread that reads them, not in pyarrow's process-wide
    thread pool (DuckDB asks a dataset for its scanner through its class, so this reaches every scan)."""

    def scanner(self, *args, **kwargs):
        return super().scanner(*args, **{**kwargs, "use_threads": False})


def _parts_dataset(store: Store, files: list, schema: pa.Schema, isolated: bool = False) -> ds.Dataset:
    """Parquet files of the store as one pyarrow dataset, opened through the store's storage (local disk or
    S3: omrl.store.s3), so that DuckDB scans Arrow and never opens a path itself. `isolated`: its scans
    decode in the query's own threads (_OwnThreadScans)."""
    dataset = ds.dataset([store.storage.arrow_path(p) for p in files], schema=schema, format=_PARQUET,
                         filesystem=store.storage.filesystem)
    if not isolated:
        return dataset
    return _OwnThreadScans(list(dataset.get_fragments()), schema=dataset.schema, format=dataset.format,
                           filesystem=dataset.filesystem)


# Page checksums verified (omrl writes them: layout.write_parquet), so a flipped bit in a page fails
# the query (naming the file: _user_error) instead of changing an answer.
_PARQUET = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True))


def _register_table(con: duckdb.DuckDBPyConnection, store: Store, table: str, isolated: bool = False) -> str:
    """Hand a table's live parts to DuckDB as a pyarrow dataset (so DuckDB opens no file itself) and
    return a SELECT of every current column; older parts get missing columns as typed NULL, columns
    from newer writers stay visible after them."""
    schema = SCHEMAS[table]
    parts = store.parts(table)
    name = f"_omrl_{table}"
    if not parts:
        con.register(name, schema.empty_table())
    else:
        extra: dict[str, pa.Field] = {}
        for part in parts:  # FileNotFoundError when a compaction removed it: the caller builds anew
            for f in pq.read_schema(store.storage.arrow_path(part), filesystem=store.storage.filesystem):
                if f.name not in schema.names:
                    extra.setdefault(f.name, f)
        full = pa.schema(list(schema) + [extra[n] for n in sorted(extra)])
        con.register(name, _parts_dataset(store, parts, full, isolated))
    return f"SELECT * FROM {name}"


def _register_tool_calls(con: duckdb.DuckDBPyConnection, store: Store, isolated: bool = False) -> str:
    """The `tool_calls` rows: read flat from the parts' side files; parts without one (v1 parts, a side
    file lost) are unnested as before, with the same columns and values."""
    sides, lacking = store.side_files("tool_calls")
    con.register("_omrl_tool_calls_side", _parts_dataset(store, sides, TOOL_CALLS_SCHEMA, isolated)
                 if sides else TOOL_CALLS_SCHEMA.empty_table())
    schema = SCHEMAS["trajectories"]
    con.register("_omrl_trajectories_unflattened", _parts_dataset(store, lacking, schema, isolated)
                 if lacking else schema.empty_table())
    columns = ", ".join(quote_ident(f.name) for f in TOOL_CALLS_SCHEMA)
    return f"""
        SELECT {columns} FROM _omrl_tool_calls_side
        UNION ALL
        SELECT trajectory_id, run_id, round, task_id, env, position AS message_position,
               generate_subscripts(tool_calls, 1) - 1 AS call_index,
               unnest(tool_calls, recursive := true)
        FROM (SELECT id AS trajectory_id, run_id, round, task_id, env,
                     generate_subscripts(messages, 1) - 1 AS position,
                     unnest(messages, recursive := true)
              FROM _omrl_trajectories_unflattened)
        WHERE len(tool_calls) > 0
    """


def define_views(con: duckdb.DuckDBPyConnection, store: Store, isolated: bool = False) -> None:
    con.execute(f"CREATE VIEW trajectories AS {_register_table(con, store, 'trajectories', isolated)}")
    con.execute(f"CREATE VIEW annotations AS {_register_table(con, store, 'annotations', isolated)}")
    con.execute(
        """
        CREATE VIEW messages AS
        SELECT id AS trajectory_id, run_id, round, task_id, env,
               generate_subscripts(messages, 1) - 1 AS position,
               unnest(messages, recursive := true)
        FROM trajectories
        """
    )
    con.execute(
        """
        CREATE VIEW turns AS
        SELECT id AS trajectory_id, run_id, round, task_id, env,
               unnest(turns, recursive := true)
        FROM trajectories
        """
    )
    con.execute(f"CREATE VIEW tool_calls AS {_register_tool_calls(con, store, isolated)}")
    con.execute(
        """
        CREATE VIEW latest_annotations AS
        SELECT * EXCLUDE (_rank) FROM (
            SELECT *, row_number() OVER (
                PARTITION BY trajectory_id, annotator ORDER BY created_at DESC, id DESC) AS _rank
            FROM annotations)
        WHERE _rank = 1
        """
    )
    annotators = [r[0] for r in con.execute(
        "SELECT DISTINCT annotator FROM latest_annotations WHERE status = 'ok' ORDER BY 1").fetchall()]
    pivot = "".join(
        f", max(score) FILTER (WHERE annotator = {quote_literal(a)}) AS {quote_ident(a)}" for a in annotators
    )
    con.execute(
        f"""
        CREATE VIEW scores AS
        SELECT trajectory_id, count(*) AS n_annotations{pivot}
        FROM latest_annotations WHERE status = 'ok'
        GROUP BY trajectory_id
        """
    )
    # The one success rate (omrl.schema): solved / known outcomes; failed and unknown success beside it.
    con.execute(
        f"""
        CREATE VIEW groups AS
        SELECT group_id, any_value(task_id) AS task_id, any_value(run_id) AS run_id,
               any_value(round) AS round, count(*) AS n,
               avg(reward) AS mean_reward, coalesce(stddev_pop(reward), 0) AS std_reward,
               min(reward) AS min_reward, max(reward) AS max_reward,
               {SUCCESS_SQL}
        FROM trajectories
        GROUP BY group_id
        """
    )
