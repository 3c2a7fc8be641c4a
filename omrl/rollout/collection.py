"""collect: play the (task, sample) jobs not yet stored, through an executor, and append their rows in
batches; what a collection run did (CollectResult) and its resumable run name.
"""
from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Container, Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.progress import QUIET, Reporter
from omrl.rollout.agent import Episode
from omrl.rollout.episodes import play_episodes
from omrl.rollout.executor import LOCAL, Executor, Placement
from omrl.rollout.pool import EnvFactory, EnvPool, env_factory, env_pool
from omrl.rollout.settings import RolloutSettings, placement
from omrl.schema import is_failed, trajectory_id
from omrl.schema.rows import TrajectoryRow
from omrl.store import Store


@dataclass
class CollectResult:
    """What a collection run did. Rates count only the episodes played in this call."""

    run_id: str
    round: int
    total: int  # tasks x samples asked for
    skipped: int  # already in the store (resume)
    retried: int = 0  # replayed because every stored attempt failed (retry_failed); counted in played, not skipped
    played: int = 0
    written: int = 0
    already_stored: int = 0  # played, but a concurrent run of the same command stored them first
    statuses: Counter = field(default_factory=Counter)
    successes: int = 0
    known: int = 0  # episodes with a known outcome: not failed, success not null (the success rate's base)
    unknown_success: int = 0  # finished, but whether the task was solved is not known
    reward_sum: float = 0.0
    scored: int = 0
    completion_tokens: int = 0
    duration_s: float = 0.0

    @property
    def errors(self) -> int:
        return sum(n for s, n in self.statuses.items() if is_failed(s))

    @property
    def success_rate(self) -> float | None:
        """Solved / episodes with a known outcome (the one definition, omrl.schema.success_counts)."""
        return self.successes / self.known if self.known else None

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.scored if self.scored else None

    @property
    def episodes_per_s(self) -> float:
        return self.played / self.duration_s if self.duration_s else 0.0

    def add(self, row: TrajectoryRow) -> None:
        self.played += 1
        self.statuses[row["status"]] += 1
        if not is_failed(row["status"]):
            if row["success"] is None:
                self.unknown_success += 1
            else:
                self.known += 1
                self.successes += bool(row["success"])
        if row["reward"] is not None:
            self.reward_sum += row["reward"]
            self.scored += 1
        self.completion_tokens += row["completion_tokens"] or 0


def default_run_name(env: str, tasks_path: str | Path | None, policy: str, prefix: str = "") -> str:
    """A readable run name that is the same for the same env, tasks file and policy (so re-runs resume).

    The round is not part of it: trajectory ids include the round already, so each round resumes on its own.
    """
    if not tasks_path:
        source = ""
    elif str(tasks_path).startswith("shipped:"):  # the same shipped set wherever the command runs
        source = str(tasks_path)
    else:
        source = str(Path(tasks_path).resolve())
    digest = hashlib.sha256(f"{env}\n{source}\n{policy}".encode()).hexdigest()[:8]
    stem = Path(tasks_path).stem if tasks_path else "tasks"
    policy_short = policy.rstrip("/").split("/")[-1]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{env}-{stem}-{policy_short}").strip("-")[:80]
    return f"{prefix}{slug}-{digest}"


class RowWriter:
    """Buffers finished rows and appends them to the store in batches (one atomic part each).

    Rows whose id the store already holds (another run of the same command got there first) are
    dropped at commit, under the store's write lock: two identical runs never double an episode.
    """

    def __init__(self, store: Store, batch_size: int, flush_seconds: float):
        self.store, self.batch_size, self.flush_seconds = store, max(1, batch_size), flush_seconds
        self.pending: list[TrajectoryRow] = []
        self.written = 0
        self.already_stored = 0
        self.last_flush = time.monotonic()
        self._lock = asyncio.Lock()
        self._count_lock = threading.Lock()

    def _append(self, rows: list[TrajectoryRow]) -> None:
        # Counted in the thread that commits: a flush whose awaiting task is cancelled still completes
        # its append, and the counts must say so.
        with self._count_lock:
            appended = self.store.append(rows, skip_existing=True)
            self.written += appended.written
            self.already_stored += appended.skipped

    async def add(self, row: TrajectoryRow) -> None:
        self.pending.append(row)
        if len(self.pending) >= self.batch_size or time.monotonic() - self.last_flush >= self.flush_seconds:
            await self.flush()

    async def flush(self) -> None:
        async with self._lock:  # one append at a time keeps parts in finishing order
            rows, self.pending = self.pending, []
            self.last_flush = time.monotonic()
            if rows:
                await asyncio.to_thread(self._append, rows)

    async def every(self, seconds: float) -> None:
        """Flush on a timer too, so a lull between finishing episodes does not leave rows unwritten."""
        while True:
            await asyncio.sleep(seconds)
            if self.pending and time.monotonic() - self.last_flush >= seconds:
                await self.flush()


class EpisodeWork:
    """Collect's work for an executor (omrl.rollout.executor): plays shards of (task, sample) jobs through
    play_episodes and emits each finished episode's row.

    `pool` (this process's engines) and `on_episode` (called with each Episode after its row is emitted)
    stay in this process; the portable copy an executor sends elsewhere has neither, and a work with an
    `on_episode` refuses to go (an Episode holds its live context, which would stay on the worker)."""

    what = "the policy or environment"

    def __init__(self, make_env: EnvFactory, policy: Any, settings: RolloutSettings, run_fields: dict[str, Any], *,
                 pool: EnvPool | None = None, on_episode: Callable[[Episode], None] | None = None):
        self.make_env, self.policy, self.settings = make_env, policy, settings
        self.run_fields = run_fields  # what every row says of its run: run_id, round, source
        self.pool, self.on_episode = pool, on_episode
        # Shards queued on one worker play at once through these shared slots, so at most `concurrency`
        # episodes are in flight and the next shard fills each slot the moment the previous shard's
        # stragglers leave it (shards one after the other idled slots at every shard's end).
        self.slots: asyncio.Semaphore | None = None

    @property
    def placement(self) -> Placement:
        return placement(self.settings)

    def group(self, job: tuple[Any, int]) -> None:
        return None  # episodes are independent: any shard

    def portable(self, in_flight: int) -> EpisodeWork:
        if self.on_episode is not None:
            raise UsageError("on_episode callbacks need the episodes in this process; with an executor that "
                             "plays them elsewhere (Ray), read the rows from the store")
        return EpisodeWork(self.make_env, self.policy, replace(self.settings, concurrency=in_flight),
                           self.run_fields)

    async def run(self, shard: list[tuple[Any, int]], emit: Callable[[TrajectoryRow], Awaitable[None]],
                  tick: Callable[[int], None]) -> None:
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.settings.concurrency)

        async def finished(episode: Episode) -> None:
            await emit(episode.row)  # before the callback: a callback that raises loses no finished row
            if self.on_episode is not None:
                self.on_episode(episode)
            tick(1)

        await play_episodes(shard, self.make_env, self.policy, self.settings, on_episode=finished, keep=False,
                            slots=self.slots, pool=self.pool, **self.run_fields)


def collect_fields(result: CollectResult, done: int, elapsed: float) -> dict[str, Any]:
    """What a collection's progress shows: success so far, episodes/s, tokens/s, errors."""
    rate = "-" if result.success_rate is None else f"{result.success_rate:.0%}"
    elapsed = max(elapsed, 1e-9)
    return {"success": rate, "ep/s": f"{done / elapsed:.1f}", "tok/s": f"{result.completion_tokens / elapsed:.0f}",
            "errors": result.errors}


async def collect(env_spec: str | EnvFactory | None, tasks: Iterable[Any], policy: Any, store: Store,
                  settings: RolloutSettings | None = None, *, samples: int = 1, round: int = 0,
                  run_id: str | None = None, batch_size: int = 64, flush_seconds: float = 10.0,
                  reporter: Reporter = QUIET, executor: Executor = LOCAL, source: str = "collected",
                  on_episode: Callable[[Episode], None] | None = None, retry_failed: bool = False,
                  on_finish: Callable[[CollectResult], None] | None = None, **knobs: Any) -> CollectResult:
    """Play every (task, sample) not yet in `store` for this run and round; rows are appended as they finish.

    The rollout knobs come from `settings` (RolloutSettings); keyword arguments named like its fields
    (max_turns=..., concurrency=...) replace single values. `env_spec` is an environment name or a
    factory; None takes `settings.env`. `executor` plays the episodes (omrl.rollout.executor: LOCAL in this
    process, or a RayExecutor on a cluster, where the env factory and policy are pickled to each worker);
    rows come back here and are appended the same way. `reporter` (omrl.progress) shows the progress.

    With `retry_failed`, a (task, sample) whose stored rows all failed (is_failed: env_error, policy_error,
    timeout) is played again as its next attempt, under a new id (omrl.schema.trajectory_id's `attempt`):
    the failed rows stay as history. `on_finish` is called with the result once the episodes' run ends,
    also when it is interrupted (Ctrl-C) or fails, after the finished rows are written.
    """
    settings = _settings(settings, env_spec, knobs)
    if samples < 1 or settings.concurrency < 1 or (settings.max_turns is not None and settings.max_turns < 1):
        raise UsageError("samples, concurrency and max_turns must be at least 1")
    if flush_seconds <= 0:  # the flush timer would spin on sleep(0)
        raise UsageError(f"flush_seconds must be positive, got {flush_seconds}")
    tasks = list(tasks)
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        dupes = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise UsageError(f"duplicate task ids: {', '.join(dupes[:5])}")
    make = env_spec if callable(env_spec) else env_factory(settings.env, settings.env_options)
    if run_id is None:
        env_name = settings.env if not callable(env_spec) else getattr(env_spec, "__name__", "env")
        run_id = default_run_name(env_name, None, getattr(policy, "name", "policy"))
    jobs, result, attempts = await pending_jobs(store, tasks, samples, run_id, round, retry_failed)
    if not jobs:
        if on_finish is not None:
            on_finish(result)
        return result

    shared = env_pool(settings.env, settings.env_options)[0] if not callable(env_spec) else None
    pool = shared if shared is not None else EnvPool(make)
    if not pool.idle:
        # A bad env spec or option should stop the run here, not become one env_error row per episode.
        probe = await asyncio.to_thread(make)
        if getattr(probe, "reusable", False) is True:
            pool.idle.append(probe)  # a slow engine already started: the first episode here plays in it
        else:
            await asyncio.to_thread(probe.close)
    run_fields = {"run_id": run_id, "round": round, "source": source, **({"attempts": attempts} if attempts else {})}
    work = EpisodeWork(make, policy, settings, run_fields, pool=pool, on_episode=on_episode)
    writer = RowWriter(store, batch_size, flush_seconds)
    started = time.monotonic()
    shown = 0

    async def commit(row: TrajectoryRow) -> None:
        result.add(row)
        await writer.add(row)

    def progress(n: int) -> None:
        nonlocal shown
        shown += n
        reporter.advance(n, **collect_fields(result, shown, time.monotonic() - started))

    reporter.start(f"collect {run_id}", total=len(jobs))
    ticker = asyncio.create_task(writer.every(flush_seconds))
    try:
        await executor.run(work, jobs, commit, progress=progress, log=reporter.log)
    finally:
        # Also on failure, cancellation or Ctrl-C: write what finished, close the pooled engines (a shared
        # pool's stay for the next call; shared_engines closes them).
        if pool is not shared:
            await asyncio.shield(pool.close())
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        await asyncio.shield(writer.flush())
        result.written = writer.written
        result.already_stored = writer.already_stored
        result.duration_s = time.monotonic() - started
        reporter.finish()
        if on_finish is not None:
            on_finish(result)
    return result


async def pending_jobs(store: Store, tasks: list[Any], samples: int, run_id: str, round: int,
                       retry_failed: bool = False) -> tuple[list[tuple[Any, int]], CollectResult,
                                                            dict[tuple[str, int], int]]:
    """The (task, sample) jobs of this run and round not yet in `store`, a CollectResult counting the rest, and
    the attempt number of each job that replays failed episodes ((task id, sample) -> n; only with
    `retry_failed`: then a job whose stored attempts all failed is pending too)."""
    statuses: dict[str, str] = {}
    if retry_failed:  # the statuses too: a second column, read only when asked
        table = await asyncio.to_thread(store.read, "trajectories", ["id", "status"])
        statuses = dict(zip(table.column("id").to_pylist(), table.column("status").to_pylist(), strict=True))
    stored: Container[str] = statuses if retry_failed else await asyncio.to_thread(store.ids)
    jobs: list[tuple[Any, int]] = []
    attempts: dict[tuple[str, int], int] = {}
    for task in tasks:
        for s in range(samples):
            ids = attempt_ids(stored, run_id, round, task.id, s)
            if not ids:
                jobs.append((task, s))
            elif retry_failed and all(is_failed(statuses[i]) for i in ids):
                jobs.append((task, s))
                attempts[(task.id, s)] = len(ids)
    total = len(tasks) * samples
    return jobs, CollectResult(run_id=run_id, round=round, total=total, skipped=total - len(jobs),
                               retried=len(attempts)), attempts


def attempt_ids(stored: Container[str], run_id: str, round: int, task_id: str, sample: int) -> list[str]:
    """The ids of one (task, sample)'s attempts that `stored` holds, in order: attempt 0, 1, ... up to the first
    missing one (the last is the episode's current row; the ones before it failed and are kept as history)."""
    ids: list[str] = []
    while (tid := trajectory_id(run_id, round, task_id, sample, len(ids))) in stored:
        ids.append(tid)
    return ids


def _settings(settings: RolloutSettings | None, env_spec: Any, knobs: dict[str, Any]) -> RolloutSettings:
    """`settings` (default RolloutSettings()) with the env of `env_spec` and the named knobs replaced."""
    unknown = sorted(set(knobs) - {f.name for f in fields(RolloutSettings)})
    if unknown:
        raise TypeError(f"unknown rollout setting(s): {', '.join(unknown)}")
    settings = settings or RolloutSettings()
    if isinstance(env_spec, str):
        knobs = {"env": env_spec, **knobs}
    if "env_options" in knobs and knobs["env_options"] is None:
        knobs["env_options"] = {}
    return replace(settings, **knobs) if knobs else settings
