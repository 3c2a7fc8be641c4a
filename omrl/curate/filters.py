"""`filter_store`: select trajectories into a new, rebuildable store; every dropped row has a reason.

Steps run in this fixed order, each counting what it drops:
  where -> status -> success -> max_turns        (row filters, in DuckDB)
  flat_group -> best_of_n                        (group steps, on the groups left by the row filters)
  min_reward -> duplicate -> near_duplicate      (value and content filters)
  split                                          (by task; no task in two splits)

"Reward" is the combined reward of `reward_recipe` when given (omrl.annotate.reward), else the env
reward. best_of_n and min_reward drop rows without a reward under reason "no_reward" (never
treated as 0). Dedupe keeps the highest-reward copy (ties: smallest id). Splits other than train go
to sibling stores DST-<name>; DST holds train. Each output's omrl.json lineage records the source,
every option (the recipe inlined), the counts and a hash of the kept ids; `rebuild` re-runs it.

The row filters are SQL conditions run on one confined DuckDB connection (omrl.store.query): one aggregate
pass counts each row under the first filter it fails, a second reads only the rows that pass them all
(and, when rejects are asked for, a third the dropped ones). Only the kept rows reach Python, and only
the columns the group, value and content steps read.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from omrl.curate.dedupe import content_hash, content_text
from omrl.curate.splits import assign_split, parse_split
from omrl.errors import UsageError
from omrl.schema import TRAJECTORY_SCHEMA
from omrl.store import Store

Row = dict[str, Any]


@dataclass
class FilterOptions:
    where: str | None = None  # SQL condition over the `trajectories` view
    status: str | None = None  # keep only this status, e.g. "ok"
    success: bool = False  # keep only successful trajectories
    max_turns: int | None = None
    drop_flat_groups: bool = False  # drop groups whose rewards are all equal (no GRPO signal)
    best_of_n: int | None = None  # keep the K best per group_id
    min_reward: float | None = None
    dedupe: str | None = None  # "exact" or "near" ("near" also drops exact duplicates)
    near_threshold: float = 0.8  # word-3-shingle Jaccard at or above which two rows are near duplicates
    split: str | None = None  # e.g. "val=0.05"
    seed: int = 0  # seed of the split assignment
    reward_recipe: str | dict[str, Any] | None = None  # path or mapping; inlined into the lineage

    def __post_init__(self) -> None:
        if self.dedupe not in (None, "exact", "near"):
            raise UsageError(f"dedupe must be exact or near, got {self.dedupe!r}")
        if self.best_of_n is not None and self.best_of_n < 1:
            raise UsageError("best_of_n must be at least 1")
        parse_split(self.split)
        if self.status is not None and not isinstance(self.status, str):
            raise UsageError(f"status must be a string, got {self.status!r}")
        if self.max_turns is not None and (isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int)):
            raise UsageError(f"max_turns must be an integer, got {self.max_turns!r}")


@dataclass
class FilterResult:
    source_rows: int
    kept: dict[str, int]  # split -> rows
    dropped: Counter = field(default_factory=Counter)  # reason -> rows
    stores: dict[str, Path] = field(default_factory=dict)  # split -> store path
    ids: dict[str, list[str]] = field(default_factory=dict)  # split -> kept ids, sorted


def ids_digest(ids: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


# ---------------------------------------------------------------- steps


class RowFilter:
    """One row filter, pushed into DuckDB: a SQL condition over `trajectories` that every kept row meets.

    The condition is code's SQL over whitelisted columns with typed values (a user's --where reaches SQL
    only through omrl.store.sql_check's checker); a row that fails it is dropped for `reason`.
    """

    reason = "?"

    def condition(self, con) -> str:
        raise NotImplementedError


class WhereFilter(RowFilter):
    """The user's --where: one SQL condition, checked by omrl.store.sql_check (never pasted into SQL unchecked)."""

    reason = "where"

    def __init__(self, store: Store, where: str):
        self.store, self.where = store, where

    def condition(self, con) -> str:
        from omrl.store.sql_check import where_select

        # where_select parses `SELECT id FROM trajectories WHERE <where>` with DuckDB's own parser and
        # returns it only when it is exactly that one query (one condition, views only): safe to nest.
        return f"id IN ({where_select(con, self.where, 'SELECT id FROM trajectories')})"

    @property
    def ids(self) -> set[str]:
        """The ids the condition selects (through select_ids, the same checker)."""
        from omrl.store.query import select_ids

        return set(select_ids(self.store, self.where))


class StatusFilter(RowFilter):
    reason = "status"

    def __init__(self, status: str):
        if not isinstance(status, str):
            raise UsageError(f"status must be a string, got {status!r}")
        self.status = status

    def condition(self, con) -> str:
        from omrl.store.views import quote_literal

        return f"coalesce(status = {quote_literal(self.status)}, false)"


class SuccessFilter(RowFilter):
    reason = "success"

    def condition(self, con) -> str:
        return "coalesce(success, false)"  # unknown success is not success


class MaxTurnsFilter(RowFilter):
    reason = "max_turns"

    def __init__(self, max_turns: int):
        if isinstance(max_turns, bool) or not isinstance(max_turns, int):
            raise UsageError(f"max_turns must be an integer, got {max_turns!r}")
        self.max_turns = max_turns

    def condition(self, con) -> str:
        return f"coalesce(num_turns, 0) <= {int(self.max_turns)}"


class Step:
    """One group, value or content step, in Python on the rows the row filters kept:
    `apply(rows)` returns the kept rows and (row, reason) for each dropped one."""

    reason = "?"

    def apply(self, rows: list[Row]) -> tuple[list[Row], list[tuple[Row, str]]]:
        raise NotImplementedError


class MinRewardFilter(Step):
    reason = "min_reward"

    def __init__(self, rewards: dict[str, float | None], minimum: float):
        self.rewards, self.minimum = rewards, minimum

    def apply(self, rows):
        kept, dropped = [], []
        for row in rows:
            r = self.rewards.get(row["id"])
            if r is None:
                dropped.append((row, "no_reward"))
            elif r < self.minimum:
                dropped.append((row, self.reason))
            else:
                kept.append(row)
        return kept, dropped


def _by_group(rows: list[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        groups[row.get("group_id") or row["id"]].append(row)
    return groups


class FlatGroupFilter(Step):
    """Drops groups whose rewards are all equal (a missing reward counts as its own value)."""

    reason = "flat_group"

    def __init__(self, rewards: dict[str, float | None]):
        self.rewards = rewards

    def apply(self, rows):
        flat = {g for g, members in _by_group(rows).items()
                if len({self.rewards.get(r["id"]) for r in members}) <= 1}
        kept = [r for r in rows if (r.get("group_id") or r["id"]) not in flat]
        dropped = [(r, self.reason) for r in rows if (r.get("group_id") or r["id"]) in flat]
        return kept, dropped


def _best_first(rewards: dict[str, float | None]):
    def key(row: Row):
        r = rewards.get(row["id"])
        return (r is None, -(r or 0.0), row["id"])
    return key


class BestOfNFilter(Step):
    reason = "best_of_n"

    def __init__(self, rewards: dict[str, float | None], k: int):
        self.rewards, self.k = rewards, k

    def apply(self, rows):
        keep_ids, dropped = set(), []
        for members in _by_group(rows).values():
            scored = sorted((r for r in members if self.rewards.get(r["id"]) is not None), key=_best_first(self.rewards))
            keep_ids.update(r["id"] for r in scored[: self.k])
            dropped += [(r, self.reason) for r in scored[self.k:]]
            dropped += [(r, "no_reward") for r in members if self.rewards.get(r["id"]) is None]
        return [r for r in rows if r["id"] in keep_ids], dropped


class ExactDedupe(Step):
    reason = "duplicate"

    def __init__(self, rewards: dict[str, float | None]):
        self.rewards = rewards

    def apply(self, rows):
        seen: set[str] = set()
        keep_ids, dropped = set(), []
        for row in sorted(rows, key=_best_first(self.rewards)):
            h = content_hash(row)
            if h in seen:
                dropped.append((row, self.reason))
            else:
                seen.add(h)
                keep_ids.add(row["id"])
        return [r for r in rows if r["id"] in keep_ids], dropped


class NearDedupe(Step):
    reason = "near_duplicate"

    def __init__(self, rewards: dict[str, float | None], threshold: float):
        self.rewards, self.threshold = rewards, threshold

    def apply(self, rows):
        # datasketch (and scipy, about 1 s) load only for --dedupe near
        from omrl.curate.minhash import NearDuplicateIndex

        index = NearDuplicateIndex(self.threshold)
        keep_ids, dropped = set(), []
        for row in sorted(rows, key=_best_first(self.rewards)):
            if index.check_and_add(row["id"], content_text(row)) is None:
                keep_ids.add(row["id"])
            else:
                dropped.append((row, self.reason))
        return [r for r in rows if r["id"] in keep_ids], dropped


# ---------------------------------------------------------------- the pipeline


def rewards_for(store: Store, rows: list[Row], recipe: Any) -> dict[str, float | None]:
    """trajectory id -> the reward the filters rank by: combined (with a recipe) or env reward."""
    if recipe is None:
        return {r["id"]: r.get("reward") for r in rows}
    from omrl.annotate.reward import combined_reward

    table = combined_reward(store, recipe)
    return dict(zip(table.column("trajectory_id").to_pylist(), table.column("reward").to_pylist(), strict=True))


def row_filters(store: Store, options: FilterOptions) -> list[RowFilter]:
    """The row filters of `options`, in their fixed order (a row fails for the first one it does not meet)."""
    filters: list[RowFilter] = []
    if options.where:
        filters.append(WhereFilter(store, options.where))
    if options.status:
        filters.append(StatusFilter(options.status))
    if options.success:
        filters.append(SuccessFilter())
    if options.max_turns is not None:
        filters.append(MaxTurnsFilter(options.max_turns))
    return filters


def group_steps(store: Store, rows: list[Row], options: FilterOptions, recipe: Any) -> list[Step]:
    """The Python steps of `options` over the rows the row filters kept, in their fixed order."""
    rewards = rewards_for(store, rows, recipe)
    steps: list[Step] = []
    if options.drop_flat_groups:
        steps.append(FlatGroupFilter(rewards))
    if options.best_of_n:
        steps.append(BestOfNFilter(rewards, options.best_of_n))
    if options.min_reward is not None:
        steps.append(MinRewardFilter(rewards, options.min_reward))
    if options.dedupe:
        steps.append(ExactDedupe(rewards))
    if options.dedupe == "near":
        steps.append(NearDedupe(rewards, options.near_threshold))
    return steps


@dataclass
class Selection:
    """What the row filters left: source size, drops per reason, kept rows, dropped rows (with `reason`)."""

    source_rows: int
    dropped: Counter
    kept: pa.Table
    rejects: pa.Table | None  # only when asked for


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    return table.select(schema.names).cast(schema)


def select_rows(store: Store, filters: list[RowFilter], rejects: bool = False) -> Selection:
    """Run the row filters in DuckDB on one confined connection (one snapshot of the parts): one
    aggregate pass counts each row's first failed filter, a second reads only the kept rows; with
    `rejects`, a third reads the dropped rows with their reason."""
    from omrl.store.parts import retry_vanished
    from omrl.store.query import close, connect, run_query
    from omrl.store.query_limits import QueryError
    from omrl.store.views import quote_literal

    def vanished(exc: BaseException) -> bool:  # a compaction removed a part under the queries
        return isinstance(exc, FileNotFoundError) or (isinstance(exc, QueryError)
                                                      and "No such file or directory" in str(exc))

    def attempt() -> Selection:
        con = connect(store)
        try:
            conditions = [(f.condition(con), f.reason) for f in filters]
            reason = ("CASE " + " ".join(f"WHEN NOT ({c}) THEN {quote_literal(r)}" for c, r in conditions)
                      + " END") if conditions else "NULL::VARCHAR"
            counts = run_query(store, f"SELECT {reason} AS reason, count(*) AS n FROM trajectories GROUP BY ALL",
                               con=con).to_pylist()
            where = " WHERE " + " AND ".join(f"({c})" for c, _ in conditions) if conditions else ""
            kept = run_query(store, f"SELECT * FROM trajectories{where}", con=con)
            dropped = None
            if rejects:
                dropped = run_query(store, f"SELECT * FROM (SELECT *, {reason} AS _omrl_reason FROM trajectories) "
                                           "WHERE _omrl_reason IS NOT NULL", con=con)
                dropped = _rejects_table(dropped)
        finally:
            close(con)
        return Selection(source_rows=sum(r["n"] for r in counts),
                         dropped=Counter({r["reason"]: r["n"] for r in counts if r["reason"] is not None}),
                         kept=_conform(kept, TRAJECTORY_SCHEMA), rejects=dropped)

    return retry_vanished(attempt, vanished)


REJECTS_SCHEMA = TRAJECTORY_SCHEMA.append(pa.field("reason", pa.string()))


def _rejects_table(table: pa.Table) -> pa.Table:
    """A DuckDB result with `_omrl_reason` as a rejects table (trajectory columns + `reason`)."""
    data = _conform(table, TRAJECTORY_SCHEMA)
    return data.append_column(REJECTS_SCHEMA.field("reason"), table.column("_omrl_reason").cast(pa.string()))


def _write_rejects(path: Path, tables: list[pa.Table]) -> None:
    """Dropped rows with a `reason` column, as one Parquet file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = pa.concat_tables(tables) if tables else REJECTS_SCHEMA.empty_table()
    pq.write_table(data, path, compression="zstd")


def split_store_path(out: Path, split: str) -> Path:
    """Where a split goes: train in `out`, others in sibling stores `<out>-<split>`."""
    return out if split == "train" else out.with_name(f"{out.name}-{split}")


def filter_store(source: Store | str | Path, out: str | Path, options: FilterOptions | None = None,
                 rejects: str | Path | None = None) -> FilterResult:
    """Filter `source` into new store(s) at `out` (and `<out>-<split>`); returns counts per split and reason."""
    options = options or FilterOptions()
    store = source if isinstance(source, Store) else Store(source)
    out = Path(out)
    recipe = None
    if options.reward_recipe is not None:
        from omrl.annotate.reward import load_reward_recipe

        recipe = load_reward_recipe(options.reward_recipe)
    selection = select_rows(store, row_filters(store, options), rejects=rejects is not None)
    result = FilterResult(source_rows=selection.source_rows, kept={}, dropped=selection.dropped)
    kept_table, reject_tables = selection.kept, [selection.rejects] if selection.rejects is not None else []
    steps: list[Step] = []
    if options.drop_flat_groups or options.best_of_n or options.min_reward is not None or options.dedupe:
        # The group, value and content steps see only the columns they read, as Python rows.
        columns = ["id", "group_id", "reward"] + (["instruction", "messages"] if options.dedupe else [])
        rows = kept_table.select(columns).to_pylist()
        steps = group_steps(store, rows, options, recipe)
    dropped_all: list[tuple[Row, str]] = []
    for step in steps:
        rows, dropped = step.apply(rows)
        dropped_all += dropped
    result.dropped.update(reason for _, reason in dropped_all)
    if steps:
        ids = kept_table.column("id")
        if dropped_all and rejects is not None:
            reasons = {row["id"]: reason for row, reason in dropped_all}
            gone = kept_table.filter(pc.is_in(ids, value_set=pa.array(list(reasons), pa.string())))
            reject_tables.append(gone.append_column(
                REJECTS_SCHEMA.field("reason"), pa.array([reasons[i] for i in gone.column("id").to_pylist()],
                                                         pa.string())))
        kept_table = kept_table.filter(pc.is_in(ids, value_set=pa.array([r["id"] for r in rows], pa.string())))

    fractions = parse_split(options.split)
    names = pa.array([assign_split(t, fractions, options.seed) for t in kept_table.column("task_id").to_pylist()],
                     pa.string())
    by_split = {name: kept_table.filter(pc.equal(names, name)) for name in set(names.to_pylist())}
    split_names = ["train", *sorted(fractions)]
    for name in split_names:
        if split_store_path(out, name).exists() and any(split_store_path(out, name).iterdir()):
            raise UsageError(f"{split_store_path(out, name)} exists and is not empty; filter writes a new store")

    recorded = asdict(options)
    if recipe is not None:
        recorded["reward_recipe"] = recipe.to_dict()  # inlined, so a rebuild does not need the file
    annotations = store.read("annotations")
    # Every split is built in a staging folder and renamed into place only once all are complete:
    # a killed filter leaves no output store that looks whole but is not.
    with contextlib.ExitStack() as staged:
        for name in split_names:
            kept = by_split.get(name, TRAJECTORY_SCHEMA.empty_table())
            ids = sorted(kept.column("id").to_pylist())
            lineage = {"command": "filter", "source": str(store.path.resolve()), "options": recorded,
                       "sql": options.where, "split": name, "source_rows": result.source_rows,
                       "counts": {"kept": kept.num_rows, "dropped": dict(result.dropped),
                                  "splits": {n: by_split[n].num_rows if n in by_split else 0
                                             for n in split_names}},
                       "ids_sha256": ids_digest(ids)}
            path = split_store_path(out, name)
            dst = staged.enter_context(Store.staged(
                path, description=f"Filtered from {store.path} ({name} split).", lineage=lineage))
            dst.append(kept)
            keep = pa.array(ids, pa.string())
            dst.append(annotations.filter(pc.is_in(annotations.column("trajectory_id"), value_set=keep)),
                       table="annotations")
            result.kept[name] = kept.num_rows
            result.stores[name] = path
            result.ids[name] = ids
    if rejects is not None:
        _write_rejects(Path(rejects), reject_tables)
    return result


def filter_lineage(path: str | Path) -> dict[str, Any]:
    """The filter entry of a derived store's omrl.json."""
    for entry in Store(path).manifest.get("lineage", []):
        if entry.get("command") == "filter":
            return entry
    raise UsageError(f"{path} was not made by `omrl filter` (no filter lineage in omrl.json)")


def rebuild(path: str | Path, out: str | Path) -> FilterResult:
    """Re-run the filter that made the store at `path` into `out`, from its omrl.json alone."""
    entry = filter_lineage(path)
    result = filter_store(entry["source"], out, FilterOptions(**entry["options"]))
    got = ids_digest(result.ids[entry.get("split", "train")])
    if got != entry["ids_sha256"]:
        raise UsageError(f"rebuild of {path} kept different trajectories (the source changed since?)")
    return result


def summary_table(result: FilterResult) -> list[dict[str, Any]]:
    """The summary table's lines ({"what", "rows"}): kept per split, dropped per reason."""
    lines = [{"what": f"kept ({name})", "rows": n} for name, n in result.kept.items()]
    lines += [{"what": f"dropped: {reason}", "rows": n} for reason, n in sorted(result.dropped.items())]
    return lines

