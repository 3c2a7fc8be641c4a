"""The episode runner and the rollout engine: one lifecycle for collect, eval, GRPO, RFT and iterate.

    settings = RolloutSettings(env="math", max_turns=8, concurrency=32)
    episodes = await play_episodes([(task, 0), (task, 1)], None, policy, settings, run_id="r")
    result = await collect(None, tasks, policy, store, settings, samples=4)

- `play_episodes` owns an episode's lifecycle: a fresh environment per episode, made in a worker
  thread and always closed (or, for `reusable` environments such as JVM or browser engines, taken
  from an EnvPool, reset by the next episode, and closed and replaced after a failure); a per-episode
  seed; a broken environment becomes an env_error row; at most `concurrency` episodes in flight, so a
  slow episode never holds up the others. It writes nothing: storing rows is the caller's step.
- `collect` plays the (task, sample) jobs not yet stored and appends finished rows in batches (every
  `batch_size` episodes or `flush_seconds`, and at the end); each append is one atomic part, so a
  killed run loses at most the episodes in flight and the unflushed batch. Where the episodes play is
  the `executor` it is given (omrl.rollout.executor: this process, or Ray through EpisodeWork), how progress is
  shown the `reporter` (omrl.progress); it asks neither.
- Resume: ids are deterministic in (run, round, task, sample) and those already in the store are
  skipped, so re-running the same command continues where it stopped and never duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import inspect
import json
import math
import re
import threading
import time
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from omrl.errors import UsageError
from omrl.progress import QUIET, Reporter
from omrl.rollout.agent import Episode, run_episode
from omrl.rollout.executor import LOCAL, Executor, Placement
from omrl.schema import is_failed, trajectory_id
from omrl.store import Store

EnvFactory = Callable[[], Any]
DEFAULT_MAX_TURNS = 16  # for environments that declare no `default_max_turns` of their own



@dataclass
class RolloutSettings:
    """How episodes are played: the one set of rollout knobs behind collect, eval, GRPO, RFT and iterate.

    The CLI flags of `omrl collect` / `omrl eval` and the `rollout` section of every training recipe
    are these fields; `flag` in the metadata names the CLI flag.
    """

    env: str = field(default="grid", metadata={
        "help": "environment name (see `omrl envs`) or package.module:ClassName", "flag": "--env"})
    env_options: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "keyword arguments of the environment's constructor", "flag": "--env-option"})
    max_turns: int | None = field(default=None, metadata={
        "help": "assistant turns before the episode is truncated (unset: the environment's own "
                f"`default_max_turns`, else {DEFAULT_MAX_TURNS})", "flag": "--max-turns"})
    max_new_tokens: int | None = field(default=None, metadata={
        "help": "completion token limit per turn (unset: the policy's own)", "flag": "--max-tokens",
        "aliases": ("--max-new-tokens",)})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature", "flag": "--temperature"})
    seed: int | None = field(default=0, metadata={
        "help": "base seed; each episode derives its own from (seed, task, sample)", "flag": "--seed"})
    model_call_timeout: float | None = field(default=None, metadata={
        "help": "seconds per model request, each retry has its own (unset: the policy's own)",
        "flag": "--model-call-timeout", "cli_default": 120.0})
    turn_timeout: float | None = field(default=None, metadata={
        "help": "seconds per turn (model + environment steps)", "flag": "--turn-timeout"})
    episode_timeout: float | None = field(default=None, metadata={
        "help": "seconds per episode", "flag": "--episode-timeout"})
    concurrency: int = field(default=8, metadata={
        "help": "episodes in flight at once (batched generation needs many); with --ray: per Ray worker",
        "flag": "--concurrency"})
    # Where a cluster plays the episodes (omrl collect/eval --ray): what each environment holds there.
    ray_num_cpus: float = field(default=1.0, metadata={
        "help": "with --ray: CPUs one environment in flight holds on the cluster (a worker reserves this times "
                "its episodes in flight; a worker that would not fit on a node plays fewer at once)",
        "flag": "--ray-num-cpus"})
    ray_resources: dict[str, float] = field(default_factory=dict, metadata={
        "help": "with --ray: custom Ray resources one environment in flight holds (NAME=AMOUNT)",
        "flag": "--ray-resource"})
    ray_workers: int | None = field(default=None, metadata={
        "help": "with --ray: Ray workers (actors) playing episodes, each with its own environments and policy "
                "(unset: as many as the cluster's CPUs hold)", "flag": "--ray-workers"})


@dataclass
class CollectResult:
    """What a collection run did. Rates count only the episodes played in this call."""

    run_id: str
    round: int
    total: int  # tasks x samples asked for
    skipped: int  # already in the store (resume)
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

    def add(self, row: dict[str, Any]) -> None:
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


def env_factory(env_spec: str | EnvFactory, env_options: dict[str, Any] | None = None) -> EnvFactory:
    """A callable making a fresh environment: `env_spec` itself when callable, else `make_env(spec, **options)`."""
    if callable(env_spec):
        return env_spec
    from omrl.envs import make_env

    options = dict(env_options or {})
    return lambda: make_env(env_spec, **options)


def episode_seed(seed: int | None, task_id: str, sample: int) -> int | None:
    """A per-episode seed that depends only on (seed, task, sample): resumed runs draw the same."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}\n{task_id}\n{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class RowWriter:
    """Buffers finished rows and appends them to the store in batches (one atomic part each).

    Rows whose id the store already holds (another run of the same command got there first) are
    dropped at commit, under the store's write lock: two identical runs never double an episode.
    """

    def __init__(self, store: Store, batch_size: int, flush_seconds: float):
        self.store, self.batch_size, self.flush_seconds = store, max(1, batch_size), flush_seconds
        self.pending: list[dict[str, Any]] = []
        self.written = 0
        self.already_stored = 0
        self.last_flush = time.monotonic()
        self._lock = asyncio.Lock()
        self._count_lock = threading.Lock()

    def _append(self, rows: list[dict[str, Any]]) -> None:
        # Counted in the thread that commits: a flush whose awaiting task is cancelled still completes
        # its append, and the counts must say so.
        with self._count_lock:
            appended = self.store.append(rows, skip_existing=True)
            self.written += appended.written
            self.already_stored += appended.skipped

    async def add(self, row: dict[str, Any]) -> None:
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


async def play_episodes(jobs: Iterable[tuple[Any, int]], make_env: EnvFactory | None, policy: Any,
                        settings: RolloutSettings, *, run_id: str, round: int = 0, source: str = "collected",
                        metadata: dict[str, Any] | None = None,
                        on_episode: Callable[[Episode], Awaitable[None] | None] | None = None,
                        keep: bool = True, slots: asyncio.Semaphore | None = None,
                        pool: EnvPool | None = None) -> list[Episode]:
    """Play each (task, sample) job: the one episode lifecycle of collect, eval, GRPO, RFT and iterate.

    - Each episode gets a fresh environment from `make_env` (default: `settings.env` with
      `settings.env_options`), made in a worker thread and always closed, also when the episode, the
      callback or the whole call fails or is cancelled.
    - An environment whose constructor raises becomes an `env_error` row; the other episodes go on.
    - Each episode is seeded with `episode_seed(settings.seed, task.id, sample)`.
    - At most `settings.concurrency` episodes are in flight; `on_episode` (sync or async) is called as
      each finishes. Writing rows anywhere is the caller's step (collect writes them through it).
    - `slots`, shared by concurrent calls, caps their episodes in flight together: each episode holds one
      while it plays (a Ray worker's queued shards, so the next fills in as one drains).
    - Environments whose class sets `reusable = True` are kept in an EnvPool between episodes: `pool`
      when given (the caller closes it; a trainer keeps one across its steps), else one for this call,
      closed when it ends. An instance whose episode failed (env_error, timeout) is closed, not reused.
    Returns the episodes in job order (an empty list with keep=False, for long runs that stream).
    """
    if (settings.max_turns is not None and settings.max_turns < 1) or settings.concurrency < 1:
        raise UsageError("max_turns and concurrency must be at least 1")
    make = make_env if make_env is not None else env_factory(settings.env, settings.env_options)
    if pool is None and make_env is None:
        pool, _ = env_pool(settings.env, settings.env_options)  # the shared one inside shared_engines()
    own_pool = pool is None
    envs = EnvPool(make) if own_pool else pool
    jobs = list(jobs)
    episodes: list[Episode | None] = [None] * len(jobs) if keep else []
    queue: Iterator[tuple[int, tuple[Any, int]]] = iter(enumerate(jobs))

    async def play(task: Any, sample: int) -> Episode:
        env = await envs.acquire()
        episode = None
        try:
            episode = await run_episode(
                env, task, policy, run_id=run_id, round=round, sample=sample, max_turns=turn_budget(settings, env),
                temperature=settings.temperature, seed=episode_seed(settings.seed, task.id, sample),
                max_tokens=settings.max_new_tokens, model_call_timeout=settings.model_call_timeout,
                turn_timeout=settings.turn_timeout, episode_timeout=settings.episode_timeout, source=source,
                metadata=metadata)
            return episode
        finally:
            reuse = episode is not None and episode.status not in ("env_error", "timeout")
            await envs.release(env, task, reuse=reuse)

    async def worker() -> None:
        for index, (task, sample) in queue:  # a shared iterator: each job is taken by exactly one worker
            if slots is None:
                episode = await play(task, sample)
            else:
                async with slots:
                    episode = await play(task, sample)
            if keep:
                episodes[index] = episode
            if on_episode is not None:
                done = on_episode(episode)
                if inspect.isawaitable(done):
                    await done

    workers = [asyncio.create_task(worker()) for _ in range(min(settings.concurrency, len(jobs)))]
    try:
        await asyncio.gather(*workers)
    finally:
        # Also on failure, cancellation or Ctrl-C: stop the other workers; each closes its environment.
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if own_pool:
            await asyncio.shield(envs.close())
    return episodes  # type: ignore[return-value]


def turn_budget(settings: RolloutSettings, env: Any) -> int:
    """`settings.max_turns`, or when unset the environment's `default_max_turns` (a game that needs 60
    moves says so), else DEFAULT_MAX_TURNS."""
    if settings.max_turns is not None:
        return settings.max_turns
    declared = getattr(env, "default_max_turns", None)
    return declared if isinstance(declared, int) and declared >= 1 else DEFAULT_MAX_TURNS


class EnvPool:
    """Idle environments kept between episodes, for classes that set `reusable = True` (slow engines).

    `acquire` hands out an idle instance or makes one (in a worker thread; a failing constructor gives
    an instance that fails the episode as env_error); `release(env, reuse=...)` keeps a reusable,
    healthy instance for the next episode and closes every other. `close` closes the idle ones: call
    it when the pool's owner is done (play_episodes does for the pool it made itself).
    """

    def __init__(self, make: EnvFactory) -> None:
        self.make = make
        self.idle: list[Any] = []
        self.made = 0  # instances created: a measure of reuse
        self.closed = False

    async def acquire(self) -> Any:
        if self.closed:
            raise UsageError("this environment pool is closed")
        if self.idle:
            return self.idle.pop()
        self.made += 1
        return await _open(self.make)

    async def release(self, env: Any, task: Any, *, reuse: bool) -> None:
        if reuse and not self.closed and getattr(env, "reusable", False) is True:
            self.idle.append(env)
        else:
            await _close(env, task)

    async def close(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, []
        for env in idle:
            await _close(env, None)

    def __len__(self) -> int:
        return len(self.idle)


_SHARED_POOLS: contextvars.ContextVar[dict[str, EnvPool] | None] = contextvars.ContextVar("omrl_shared_pools",
                                                                                        default=None)


@contextlib.contextmanager
def shared_engines() -> Iterator[dict[str, EnvPool]]:
    """Inside this block every collect, eval and trainer of this process that plays environment NAME with the
    same options draws from one EnvPool: reusable engines (JVMs, game interpreters) start once for the block,
    not once per call. The pools are closed when the block ends (calls must not overlap in time).

        with shared_engines():
            run_iterate(recipe); train_grpo(...); evaluate_checkpoint(...)
    """
    if _SHARED_POOLS.get() is not None:  # nested: the outer block owns the pools
        yield _SHARED_POOLS.get()
        return
    pools: dict[str, EnvPool] = {}
    token = _SHARED_POOLS.set(pools)
    try:
        yield pools
    finally:
        _SHARED_POOLS.reset(token)
        for pool in pools.values():
            asyncio.run(pool.close())


def env_pool(env: str, env_options: dict[str, Any] | None = None) -> tuple[EnvPool | None, bool]:
    """(pool, owned) for environment `env` with `env_options`: inside shared_engines() the block's pool for
    them (owned False: the block closes it), else (None, True): the caller makes and closes its own."""
    pools = _SHARED_POOLS.get()
    if pools is None or not isinstance(env, str):
        return None, True
    key = json.dumps([env, env_options or {}], sort_keys=True, default=str)
    if key not in pools:
        pools[key] = EnvPool(env_factory(env, env_options))
    return pools[key], False


async def _open(make: EnvFactory) -> Any:
    """A new environment, made in a worker thread; a failing constructor gives a _BrokenEnv.

    Cancelled while the constructor runs, the environment it still returns is closed, never leaked.
    """
    lock = threading.Lock()
    state: dict[str, Any] = {"cancelled": False, "env": None}

    def made() -> Any:
        env = make()
        with lock:
            if state["cancelled"]:
                _close_quietly(env)
                return None
            state["env"] = env
        return env

    try:
        return await asyncio.to_thread(made)
    except asyncio.CancelledError:
        with lock:
            state["cancelled"] = True
            env = state["env"]
        if env is not None:  # made, but the result did not reach us
            _close_quietly(env)
        raise
    except Exception as exc:
        return _BrokenEnv(f"creating the environment failed: {type(exc).__name__}: {exc}")


async def _close(env: Any, task: Any) -> None:
    try:
        await asyncio.shield(asyncio.to_thread(env.close))
    except asyncio.CancelledError:
        raise  # the close thread still runs to its end
    except Exception as exc:  # the row is already complete; a failing close is only reported
        where = f" for task {task.id!r}" if task is not None else ""
        warnings.warn(f"env.close failed{where}: {exc}", stacklevel=1)


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception as exc:
        warnings.warn(f"env.close failed: {exc}", stacklevel=1)


class EpisodeWork:
    """Collect's work for an executor (omrl.rollout.executor): plays shards of (task, sample) jobs through
    play_episodes and emits each finished episode's row.

    `pool` (this process's engines) and `on_episode` (called with each Episode after its row is emitted)
    stay in this process; the portable copy an executor sends elsewhere has neither, and a work with an
    `on_episode` refuses to go (an Episode holds its live context, which would stay on the worker)."""

    what = "the policy or environment"

    def __init__(self, make_env: EnvFactory, policy: Any, settings: RolloutSettings, rows: dict[str, Any], *,
                 pool: EnvPool | None = None, on_episode: Callable[[Episode], None] | None = None):
        self.make_env, self.policy, self.settings = make_env, policy, settings
        self.rows = rows  # what every row says of its run: run_id, round, source
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
        return EpisodeWork(self.make_env, self.policy, replace(self.settings, concurrency=in_flight), self.rows)

    async def run(self, shard: list[tuple[Any, int]], emit: Callable[[dict[str, Any]], Awaitable[None]],
                  tick: Callable[[int], None]) -> None:
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.settings.concurrency)

        async def finished(episode: Episode) -> None:
            await emit(episode.row)  # before the callback: a callback that raises loses no finished row
            if self.on_episode is not None:
                self.on_episode(episode)
            tick(1)

        await play_episodes(shard, self.make_env, self.policy, self.settings, on_episode=finished, keep=False,
                            slots=self.slots, pool=self.pool, **self.rows)


def placement(settings: RolloutSettings) -> Placement:
    """Where a cluster plays episodes: each environment in flight holds ray_num_cpus and ray_resources."""
    return Placement(in_flight=settings.concurrency, unit="episodes", unit_cpus=settings.ray_num_cpus,
                     unit_resources=dict(settings.ray_resources), workers=settings.ray_workers)


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
                  on_episode: Callable[[Episode], None] | None = None, **knobs: Any) -> CollectResult:
    """Play every (task, sample) not yet in `store` for this run and round; rows are appended as they finish.

    The rollout knobs come from `settings` (RolloutSettings); keyword arguments named like its fields
    (max_turns=..., concurrency=...) replace single values. `env_spec` is an environment name or a
    factory; None takes `settings.env`. `executor` plays the episodes (omrl.rollout.executor: LOCAL in this
    process, or a RayExecutor on a cluster, where the env factory and policy are pickled to each worker);
    rows come back here and are appended the same way. `reporter` (omrl.progress) shows the progress.
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
    jobs, result = await pending_jobs(store, tasks, samples, run_id, round)
    if not jobs:
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
    work = EpisodeWork(make, policy, settings, {"run_id": run_id, "round": round, "source": source}, pool=pool,
                       on_episode=on_episode)
    writer = RowWriter(store, batch_size, flush_seconds)
    started = time.monotonic()
    shown = 0

    async def commit(row: dict[str, Any]) -> None:
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
    return result


async def pending_jobs(store: Store, tasks: list[Any], samples: int, run_id: str,
                       round: int) -> tuple[list[tuple[Any, int]], CollectResult]:
    """The (task, sample) jobs of this run and round not yet in `store`, and a CollectResult counting the rest."""
    done_ids = await asyncio.to_thread(store.ids)
    jobs = [(task, s) for task in tasks for s in range(samples)
            if trajectory_id(run_id, round, task.id, s) not in done_ids]
    return jobs, CollectResult(run_id=run_id, round=round, total=len(tasks) * samples,
                               skipped=len(tasks) * samples - len(jobs))


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


class _BrokenEnv:
    """Stands in for an environment that could not be created, so the episode is stored as env_error."""

    name = "unavailable"

    def __init__(self, error: str):
        self.error = error

    def reset(self, task: Any):
        raise RuntimeError(self.error)

    def step(self, action: Any):  # pragma: no cover - reset always fails first
        raise RuntimeError(self.error)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- evaluation


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with n samples of which c succeeded (Chen et al., 2021)."""
    if k > n:
        raise UsageError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_metrics(rows: list[dict[str, Any]], ks: Iterable[int] = (1,)) -> dict[str, dict[str, Any]]:
    """Per env: episodes, tasks, success rate, failed, unknown_success, mean reward (scored rows), pass@k, errors.

    The success rate is omrl.schema's one definition: solved / episodes with a known outcome; failed
    episodes and unknown success are counted beside it (None when no episode has a known outcome).
    pass@k is over each task's known outcomes.
    """
    from omrl.schema import is_failed, success_counts

    by_env: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_env.setdefault(row["env"], []).append(row)
    out = {}
    for env, env_rows in sorted(by_env.items()):
        per_task: dict[str, list[bool]] = {}
        for row in env_rows:
            outcomes = per_task.setdefault(row["task_id"], [])
            if not is_failed(row.get("status")) and row.get("success") is not None:
                outcomes.append(bool(row["success"]))
        rewards = [r["reward"] for r in env_rows if r["reward"] is not None]
        metrics: dict[str, Any] = {
            "episodes": len(env_rows), "tasks": len(per_task),
            **success_counts(env_rows).as_dict(),
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "errors": sum(is_failed(r.get("status")) for r in env_rows),
            "truncated": sum(r["status"] == "truncated" for r in env_rows),
        }
        known = [v for v in per_task.values() if v]
        n_min = min((len(v) for v in known), default=0)
        for k in ks:
            if 0 < k <= n_min:
                metrics[f"pass@{k}"] = sum(pass_at_k(len(v), sum(v), k) for v in known) / len(known)
        out[env] = metrics
    return out


@dataclass
class EvalResult:
    collect: CollectResult
    metrics: dict[str, dict[str, Any]]


async def evaluate(env_spec: str | EnvFactory | None, tasks: Iterable[Any], policy: Any, store: Store, *,
                   samples: int = 1, run_id: str | None = None, round: int = 0, **options: Any) -> EvalResult:
    """Collect with source "eval", then success rate, mean reward and pass@k over this run's rows."""
    tasks = list(tasks)
    if run_id is None:
        env_name = (env_spec if isinstance(env_spec, str) else getattr(env_spec, "__name__", None)
                    or (options["settings"].env if options.get("settings") else "env"))
        run_id = default_run_name(env_name, None, getattr(policy, "name", "policy"), prefix="eval-")
    result = await collect(env_spec, tasks, policy, store, samples=samples, run_id=run_id, round=round,
                           source="eval", **options)
    wanted = {trajectory_id(run_id, round, t.id, s) for t in tasks for s in range(samples)}
    table = await asyncio.to_thread(store.read, "trajectories",
                                    ["id", "env", "task_id", "status", "reward", "success"])
    # Filtered in Arrow: the store may hold many other runs, which need not become Python dicts.
    rows = table.filter(pc.is_in(table["id"], value_set=pa.array(sorted(wanted), pa.string()))).to_pylist()
    ks = sorted({1, samples} | {k for k in (2, 4, 8, 16) if k < samples})
    return EvalResult(collect=result, metrics=eval_metrics(rows, ks))
