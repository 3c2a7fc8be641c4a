"""play_episodes, the one episode lifecycle of collect, eval, GRPO, RFT and iterate; each episode's seed."""
from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from omrl.errors import UsageError
from omrl.rollout.agent import Episode, run_episode
from omrl.rollout.pool import EnvFactory, EnvPool, env_factory, env_pool
from omrl.rollout.settings import RolloutSettings, turn_budget


def episode_seed(seed: int | None, task_id: str, sample: int) -> int | None:
    """A per-episode seed that depends only on (seed, task, sample): resumed runs draw the same."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}\n{task_id}\n{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


async def play_episodes(jobs: Iterable[tuple[Any, int]], make_env: EnvFactory | None, policy: Any,
                        settings: RolloutSettings, *, run_id: str, round: int = 0, source: str = "collected",
                        metadata: dict[str, Any] | None = None,
                        on_episode: Callable[[Episode], Awaitable[None] | None] | None = None,
                        keep: bool = True, slots: asyncio.Semaphore | None = None,
                        pool: EnvPool | None = None,
                        attempts: dict[tuple[str, int], int] | None = None) -> list[Episode]:
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
    - `attempts`: (task id, sample) -> attempt number, for jobs that replay failed episodes (a new id each).
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
                metadata=metadata, attempt=(attempts or {}).get((task.id, sample), 0))
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
