"""`annotate`: run metrics, a judge and a reward recipe over a store's trajectories; append annotations.

Annotations are appended (history kept); the `scores` view shows the latest ok score per annotator.
Judge replies are cached in STORE/cache/judge/ so a re-run costs no calls. `annotate_with_recipe` runs a
reward recipe's own metrics and judges (its `metrics` / `judges` keys) and then its combined reward: the
annotate stage of RFT and iterate; GRPO scores online with the same pieces (omrl/train/data/online_reward.py).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from omrl.annotate.cache import JudgeCache
from omrl.annotate.judge import JudgeConfig, JudgeStats, judge_config, judged_together, run_judge
from omrl.annotate.metrics import NamedMetric, annotate_row, load_metric, metric_names
from omrl.annotate.preflight import check_components_supplied, check_judges_reachable
from omrl.annotate.reward import (
    ENV_REWARD,
    RewardRecipe,
    combined_reward,
    load_reward_recipe,
    reward_annotations,
)
from omrl.errors import UsageError
from omrl.progress import QUIET, Reporter
from omrl.rollout.executor import LOCAL, Executor, Placement
from omrl.schema import new_id
from omrl.schema.rows import TrajectoryRow, UncheckedRow
from omrl.store import Store

WRITE_BATCH = 2000  # annotation rows per appended part: bounded memory, few parts


def recipe_metrics(recipe: RewardRecipe) -> list[NamedMetric]:
    """The metrics the recipe computes: its `metrics` list, else its components named after named metrics
    (built-in or plugin; the env reward is the row's own column, not a metric)."""
    named = set(metric_names())
    specs = recipe.metrics or [c.name for c in recipe.components if c.name in named and c.name != ENV_REWARD]
    return [load_metric(spec) for spec in specs]


def recipe_judges(recipe: RewardRecipe) -> list[JudgeConfig]:
    """The judges of the recipe's `judges` list."""
    return [judge_config(spec, recipe.source or "<dict>", i) for i, spec in enumerate(recipe.judges)]


def check_computable(recipe: RewardRecipe, metrics: list[NamedMetric], judges: list[JudgeConfig]) -> None:
    """Refuse a recipe with a component nothing computes online (it would be missing on every rollout)."""
    made = {ENV_REWARD} | {m.name for m in metrics} | {j.annotator for j in judges}
    lacking = [c.name for c in recipe.components if c.name not in made]
    if lacking:
        raise UsageError(f"reward recipe {recipe.source or '<dict>'}: no metric or judge computes component(s) "
                         f"{', '.join(lacking)} online (computed: {', '.join(sorted(made))}); add them to "
                         "its 'metrics' or 'judges'")


@dataclass
class AnnotateSummary:
    run_id: str
    trajectories: int = 0
    written: Counter = field(default_factory=Counter)  # annotator -> rows written
    errors: Counter = field(default_factory=Counter)  # annotator -> error rows
    skipped: Counter = field(default_factory=Counter)  # annotator -> not applicable
    already_done: Counter = field(default_factory=Counter)  # annotator -> had an ok annotation (resume)
    judge: JudgeStats | None = None  # all judges' calls together
    judges: dict[str, JudgeStats] = field(default_factory=dict)  # annotator -> its judge's calls
    reward_missing: int = 0

    def table(self) -> list[dict[str, Any]]:
        """One summary row per annotator."""
        names = sorted(set(self.written) | set(self.skipped) | set(self.already_done))
        return [{"annotator": n, "written": self.written[n], "errors": self.errors[n],
                 "skipped": self.skipped[n], "already_done": self.already_done[n]} for n in names]


class JudgeWork:
    """Judging for an executor (omrl.rollout.executor): shards of trajectory rows judged by run_judge (the modes,
    prompts, re-asks, the one LLM client), emitting one item per shard: {"rows": its annotations, "stats":
    its JudgeStats as a dict, "replies": new reply-cache entries}.

    Here it judges with the driver's `cache` (replies go straight into it). Its portable copy starts from
    the cache's entries (shipped once) and sends back the replies it got; a pairwise judge compares the
    trajectories of one task and a group judge those of one group_id, so such a set is one shard's."""

    what = "the judge configuration"
    WORKER_CPUS = 1.0  # a judge worker is one process with an event loop: rendering, JSON, HTTP

    def __init__(self, config: JudgeConfig, run_id: str, cache: JudgeCache | None = None,
                 cached: dict[str, dict[str, Any]] | None = None):
        self.config, self.run_id, self.cache, self.cached = config, run_id, cache, cached
        self.turn: asyncio.Semaphore | None = None  # elsewhere: shards one after the other, `concurrency` requests each

    @property
    def placement(self) -> Placement:
        return Placement(in_flight=self.config.concurrency, unit="requests", worker_cpus=self.WORKER_CPUS)

    def group(self, row: TrajectoryRow) -> Any:
        key = judged_together(self.config.mode)
        return row[key] if key else None

    def portable(self, in_flight: int) -> JudgeWork:
        return JudgeWork(self.config, self.run_id, cached=dict(self.cache.entries) if self.cache else {})

    async def run(self, shard: list[TrajectoryRow], emit: Callable[[dict[str, Any]], Any],
                  tick: Callable[[int], None]) -> None:
        if self.cache is not None:
            rows, stats = await run_judge(self.config, shard, self.run_id, self.cache, tick)
            await emit({"rows": rows, "stats": vars(stats), "replies": []})
            return
        if self.turn is None:
            self.turn = asyncio.Semaphore(1)
        async with self.turn:
            cache = JudgeCache(None)  # in memory: the driver owns the cache file
            cache.entries.update(self.cached or {})
            rows, stats = await run_judge(self.config, shard, self.run_id, cache, tick)
        replies = [e for key, e in cache.entries.items() if (self.cached or {}).get(key) is not e]
        await emit({"rows": rows, "stats": vars(stats), "replies": replies})


def judge_all(config: JudgeConfig, rows: list[TrajectoryRow], run_id: str, cache: JudgeCache,
               commit: Callable[[list[UncheckedRow]], None], executor: Executor,
               reporter: Reporter) -> JudgeStats:
    """Judge `rows` through `executor`; `commit(annotations)` once per finished shard, after its replies are
    in `cache`. Returns the summed JudgeStats of the shards."""
    total = JudgeStats()

    def committed(item: dict[str, Any]) -> None:
        for entry in item["replies"]:
            cache.put(entry["prompt_hash"], entry["content"], entry.get("prompt_tokens", 0),
                      entry.get("completion_tokens", 0), entry.get("model", config.model))
        commit(item["rows"])
        for name, value in item["stats"].items():
            setattr(total, name, getattr(total, name) + value)

    reporter.start(f"judge {config.annotator}", total=len(rows))
    try:
        asyncio.run(executor.run(JudgeWork(config, run_id, cache), rows, committed, progress=reporter.advance,
                                 log=reporter.log))
    finally:
        reporter.finish()
    return total


def _merged(a: JudgeStats | None, b: JudgeStats) -> JudgeStats:
    if a is None:
        return JudgeStats(**vars(b))
    return JudgeStats(**{k: getattr(a, k) + getattr(b, k) for k in vars(a)})


def annotate_with_recipe(store: Store | str, recipe: str | dict[str, Any] | RewardRecipe, *, where: str | None = None,
                         run_id: str | None = None, metadata: dict[str, Any] | None = None,
                         reporter: Reporter = QUIET, executor: Executor = LOCAL) -> AnnotateSummary:
    """`annotate` with the reward recipe's own metrics and judges, then its combined reward: the annotate stage
    of RFT and iterate. Resumes like `annotate` (stored ok annotations are not redone; replies are cached);
    `executor` runs the judges as `annotate --ray` does."""
    recipe = load_reward_recipe(recipe)
    metrics, judges = recipe_metrics(recipe), recipe_judges(recipe)
    check_computable(recipe, metrics, judges)
    return annotate(store, metrics, judges, where=where, reward_recipe=recipe, run_id=run_id, reporter=reporter,
                    metadata=metadata, cache_dir=recipe.cache, executor=executor)


class _Writer:
    """Buffers annotation rows and appends them in batches, counting per annotator."""

    def __init__(self, store: Store, summary: AnnotateSummary, metadata: dict[str, Any] | None = None):
        self.store, self.summary = store, summary
        self.buffer: list[UncheckedRow] = []
        self.metadata = metadata or {}

    def add(self, rows: list[UncheckedRow], whole: bool = False) -> None:
        """Buffer annotation rows (written every WRITE_BATCH); `whole` commits them at once, in one part."""
        if self.metadata:
            rows = [{**r, "metadata": {**(r.get("metadata") if isinstance(r.get("metadata"), dict) else {}),
                                       **self.metadata}} for r in rows]
        for r in rows:
            self.summary.written[r["annotator"]] += 1
            if r.get("status") == "error":
                self.summary.errors[r["annotator"]] += 1
        self.buffer.extend(rows)
        if whole or len(self.buffer) >= WRITE_BATCH:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.store.append(self.buffer, table="annotations")
            self.buffer = []


def annotated_pairs(store: Store) -> set[tuple[str, str, str, str]]:
    """(trajectory_id, annotator, rubric, judge model) of every ok annotation in the store ("" for none)."""
    data = store.read("annotations", columns=["trajectory_id", "annotator", "rubric", "judge_model", "status"])
    return {(r["trajectory_id"], r["annotator"], r["rubric"] or "", r["judge_model"] or "")
            for r in data.to_pylist() if r["status"] == "ok"}


def _judge_todo(rows: list[TrajectoryRow], judge: JudgeConfig, done: set[tuple[str, ...]]) -> list[TrajectoryRow]:
    """The rows the judge still has to score. Pairwise and group judges compare the members of a task or
    group with each other, so such a set is judged again whole unless every member already has its score."""
    def is_done(row: TrajectoryRow) -> bool:
        return (row["id"], judge.annotator, judge.rubric.name or "", judge.model or "") in done

    key = judged_together(judge.mode)
    if key is None:
        return [r for r in rows if not is_done(r)]
    open_sets = {r[key] for r in rows if not is_done(r)}
    return [r for r in rows if r[key] in open_sets]


def annotate(store: Store | str, metrics: list[str | NamedMetric] = (),
             judge: JudgeConfig | list[JudgeConfig] | None = None, where: str | None = None,
             reward_recipe: str | RewardRecipe | None = None, run_id: str | None = None,
             reporter: Reporter = QUIET, redo: bool = False,
             metadata: dict[str, Any] | None = None, cache_dir: str | Path | None = None,
             executor: Executor = LOCAL) -> AnnotateSummary:
    """Annotate the selected trajectories: metrics, then the judge(s), then the reward recipe (in that order,
    so the recipe sees this run's scores). `reporter` (omrl.progress) shows each stage as work completes;
    `metadata` is merged into every annotation's metadata; judge replies are cached in `cache_dir`
    (default STORE/cache/judge).

    `executor` (omrl.rollout.executor) runs the judges: LOCAL in this process (one part per judge), or a
    RayExecutor whose workers (default one per cluster CPU) each run the same run_judge on shards of the
    rows, each with `concurrency` requests in flight; the annotations come back here and are committed by
    the same writer, one part per shard. Metrics and the reward recipe stay in this process.

    Resumes: a (trajectory, annotator, rubric, judge model) that already has an ok annotation is not
    annotated again
    (counted in `summary.already_done`), so re-running a killed command finishes the work without doubling
    it. `redo` annotates everything again (the history keeps both; views show the latest).
    """
    store = store if isinstance(store, Store) else Store(store)
    store.sync_card()  # a card left stale by a killed run is healed even when nothing is left to annotate
    loaded = [m if isinstance(m, NamedMetric) else load_metric(m) for m in metrics]
    recipe = load_reward_recipe(reward_recipe) if reward_recipe is not None else None
    summary = AnnotateSummary(run_id=run_id or f"annotate-{new_id()[:12]}")
    rows = store.select(where).to_pylist()
    summary.trajectories = len(rows)
    writer = _Writer(store, summary, metadata)
    done_pairs = set() if redo else annotated_pairs(store)
    judges = [] if judge is None else [judge] if isinstance(judge, JudgeConfig) else list(judge)
    if rows:
        # Up front, one line: a judge without a server, or a recipe component nothing gives, would otherwise
        # be an error annotation on every row. A reachable server's failed calls stay errors, row by row.
        if recipe is not None:
            selected = {r["id"] for r in rows}
            stored = {p[1] for p in (annotated_pairs(store) if redo else done_pairs) if p[0] in selected}
            check_components_supplied(recipe, {m.name for m in loaded} | {c.annotator for c in judges}, stored)
        if executor is LOCAL:  # Ray workers may reach a URL this machine does not
            check_judges_reachable([c for c in judges if _judge_todo(rows, c, done_pairs)], recipe)

    if loaded:
        reporter.start("metrics", total=len(rows))
        try:
            for row in rows:
                todo = [m for m in loaded if (row["id"], m.name, "", "") not in done_pairs]
                summary.already_done.update(m.name for m in loaded if m not in todo)
                out, skipped = annotate_row(row, todo, summary.run_id) if todo else ([], [])
                summary.skipped.update(skipped)
                writer.add(out)
                reporter.advance(1)
            writer.flush()
        finally:
            reporter.finish()

    cache = JudgeCache(cache_dir if cache_dir is not None else store.cache_dir("judge")) if judges else None
    for config in judges:
        judge_rows = _judge_todo(rows, config, done_pairs)
        summary.already_done[config.annotator] += len(rows) - len(judge_rows)
        if not judge_rows:
            continue
        # Committed shard by shard, each in one part (a shard holds whole tasks / groups: a group's relative
        # scores are committed together or not at all); a killed run keeps the shards committed.
        stats = judge_all(config, judge_rows, summary.run_id, cache, lambda out: writer.add(out, whole=True),
                           executor, reporter)
        summary.judges[config.annotator] = stats
        summary.judge = _merged(summary.judge, stats)
        summary.skipped[config.annotator] += stats.skipped

    if recipe is not None:
        table = combined_reward(store, recipe)
        if where:
            table = table.filter(pc.is_in(table.column("trajectory_id"),
                                                  value_set=pa.array([r["id"] for r in rows], pa.string())))
        if not redo:
            fresh = [(t, recipe.name, recipe.source or "", "") not in done_pairs
                     for t in table.column("trajectory_id").to_pylist()]
            summary.already_done[recipe.name] += fresh.count(False)
            table = table.filter(pa.array(fresh, pa.bool_()))
        out = reward_annotations(table, recipe, summary.run_id)
        summary.reward_missing = sum(1 for r in out if r["status"] == "error")
        reporter.start("reward", total=len(out))
        writer.add(out)
        writer.flush()
        reporter.advance(len(out))
        reporter.finish()
    return summary
