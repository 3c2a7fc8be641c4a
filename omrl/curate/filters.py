"""`filter_store`: select trajectories into a new, rebuildable store; every dropped row has a reason.

Steps run in this fixed order, each counting what it drops:
  where -> status -> success -> max_turns        (row filters)
  flat_group -> best_of_n                        (group steps, on the groups left by the row filters)
  min_reward -> duplicate -> near_duplicate      (value and content filters)
  split                                          (by task; no task in two splits)

"Reward" is the combined reward of `reward_recipe` when given (omrl.annotate.reward), else the env
reward. best_of_n and min_reward drop rows without a reward under reason "no_reward" (never
treated as 0). Dedupe keeps the highest-reward copy (ties: smallest id). Splits other than train go
to sibling stores DST-<name>; DST holds train. Each output's omrl.json lineage records the source,
every option (the recipe inlined), the counts and a hash of the kept ids; `rebuild` re-runs it.
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
from omrl.curate.minhash import NearDuplicateIndex
from omrl.curate.splits import assign_split, parse_split
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
            raise ValueError(f"dedupe must be exact or near, got {self.dedupe!r}")
        if self.best_of_n is not None and self.best_of_n < 1:
            raise ValueError("best_of_n must be at least 1")
        parse_split(self.split)


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


class Step:
    """One filter step: `apply(rows)` returns the kept rows and (row, reason) for each dropped one."""

    reason = "?"

    def apply(self, rows: list[Row]) -> tuple[list[Row], list[tuple[Row, str]]]:
        kept, dropped = [], []
        for row in rows:
            (kept.append(row) if self.keep(row) else dropped.append((row, self.reason)))
        return kept, dropped

    def keep(self, row: Row) -> bool:
        raise NotImplementedError


class WhereFilter(Step):
    reason = "where"

    def __init__(self, store: Store, where: str):
        from omrl.query import select_ids  # DuckDB loads only when a --where is given

        self.ids = set(select_ids(store, where))  # one checked condition, never pasted into SQL

    def keep(self, row: Row) -> bool:
        return row["id"] in self.ids


class StatusFilter(Step):
    reason = "status"

    def __init__(self, status: str):
        self.status = status

    def keep(self, row: Row) -> bool:
        return row.get("status") == self.status


class SuccessFilter(Step):
    reason = "success"

    def keep(self, row: Row) -> bool:
        return row.get("success") is True


class MaxTurnsFilter(Step):
    reason = "max_turns"

    def __init__(self, max_turns: int):
        self.max_turns = max_turns

    def keep(self, row: Row) -> bool:
        return (row.get("num_turns") or 0) <= self.max_turns


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


def build_steps(store: Store, rows: list[Row], options: FilterOptions, recipe: Any) -> list[Step]:
    needs_reward = options.drop_flat_groups or options.best_of_n or options.min_reward is not None or options.dedupe
    rewards = rewards_for(store, rows, recipe) if needs_reward else {}
    steps: list[Step] = []
    if options.where:
        steps.append(WhereFilter(store, options.where))
    if options.status:
        steps.append(StatusFilter(options.status))
    if options.success:
        steps.append(SuccessFilter())
    if options.max_turns is not None:
        steps.append(MaxTurnsFilter(options.max_turns))
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


def _write_rejects(path: Path, dropped: list[tuple[Row, str]]) -> None:
    """Dropped rows with a `reason` column, as one Parquet file."""
    schema = TRAJECTORY_SCHEMA.append(pa.field("reason", pa.string()))
    rows = [{**row, "reason": reason} for row, reason in dropped]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression="zstd")


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
        from omrl.annotate.reward import load_recipe

        recipe = load_recipe(options.reward_recipe)
    rows = store.read("trajectories").to_pylist()
    result = FilterResult(source_rows=len(rows), kept={})
    dropped_all: list[tuple[Row, str]] = []
    for step in build_steps(store, rows, options, recipe):
        rows, dropped = step.apply(rows)
        dropped_all += dropped
    result.dropped = Counter(reason for _, reason in dropped_all)

    fractions = parse_split(options.split)
    by_split: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_split[assign_split(row["task_id"], fractions, options.seed)].append(row)
    split_names = ["train", *sorted(fractions)]
    for name in split_names:
        if split_store_path(out, name).exists() and any(split_store_path(out, name).iterdir()):
            raise ValueError(f"{split_store_path(out, name)} exists and is not empty; filter writes a new store")

    recorded = asdict(options)
    if recipe is not None:
        recorded["reward_recipe"] = recipe.to_dict()  # inlined, so a rebuild does not need the file
    annotations = store.read("annotations")
    # Every split is built in a staging folder and renamed into place only once all are complete:
    # a killed filter leaves no output store that looks whole but is not.
    with contextlib.ExitStack() as staged:
        for name in split_names:
            kept = by_split.get(name, [])
            ids = sorted(r["id"] for r in kept)
            lineage = {"command": "filter", "source": str(store.path.resolve()), "options": recorded,
                       "sql": options.where, "split": name, "source_rows": result.source_rows,
                       "counts": {"kept": len(kept), "dropped": dict(result.dropped),
                                  "splits": {n: len(by_split.get(n, [])) for n in split_names}},
                       "ids_sha256": ids_digest(ids)}
            path = split_store_path(out, name)
            dst = staged.enter_context(Store.staged(
                path, description=f"Filtered from {store.path} ({name} split).", lineage=lineage))
            dst.append(pa.Table.from_pylist(kept, schema=TRAJECTORY_SCHEMA))
            keep = pa.array(ids, pa.string())
            dst.append(annotations.filter(pc.is_in(annotations.column("trajectory_id"), value_set=keep)),
                       table="annotations")
            result.kept[name] = len(kept)
            result.stores[name] = path
            result.ids[name] = ids
    if rejects is not None:
        _write_rejects(Path(rejects), dropped_all)
    return result


def filter_lineage(path: str | Path) -> dict[str, Any]:
    """The filter entry of a derived store's omrl.json."""
    for entry in Store(path).manifest.get("lineage", []):
        if entry.get("command") == "filter":
            return entry
    raise ValueError(f"{path} was not made by `omrl filter` (no filter lineage in omrl.json)")


def rebuild(path: str | Path, out: str | Path) -> FilterResult:
    """Re-run the filter that made the store at `path` into `out`, from its omrl.json alone."""
    entry = filter_lineage(path)
    result = filter_store(entry["source"], out, FilterOptions(**entry["options"]))
    got = ids_digest(result.ids[entry.get("split", "train")])
    if got != entry["ids_sha256"]:
        raise ValueError(f"rebuild of {path} kept different trajectories (the source changed since?)")
    return result


def summary_rows(result: FilterResult) -> list[dict[str, Any]]:
    """Summary table rows: kept per split, dropped per reason."""
    rows = [{"what": f"kept ({name})", "rows": n} for name, n in result.kept.items()]
    rows += [{"what": f"dropped: {reason}", "rows": n} for reason, n in sorted(result.dropped.items())]
    return rows

