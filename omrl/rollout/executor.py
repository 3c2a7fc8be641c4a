"""Where an engine's work runs: shards of jobs -> items -> commit, in this process or on a Ray cluster.

    executor = executor_for(None)                  # LOCAL; executor_for("auto") -> a RayExecutor
    await executor.run(work, jobs, commit, progress=lambda n: reporter.advance(n), log=reporter.log)

- A Work (omrl.rollout.EpisodeWork, omrl.annotate.runner.JudgeWork) turns a shard of jobs into items (a
  trajectory row, a shard's annotations): `await work.run(shard, emit, tick)` awaits `emit(item)` for each
  item as it is done and calls `tick(n)` as jobs are done.
- The executor hands every item to the driver's `commit(item)`: LOCAL at once, in this process; a
  RayExecutor a shard's items together when the whole shard is done, so a shard replayed after its worker
  died is never half committed. `progress(n)` counts the jobs done, never past the total, never back.
- The engines never ask where they run: the CLI (--ray) or the recipe (`ray:`) picks the executor and
  passes it in.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

Commit = Callable[[Any], Awaitable[None] | None]


@dataclass(frozen=True)
class Placement:
    """What one worker of a Work holds on a cluster: per job in flight and per worker, and how many workers."""

    in_flight: int  # jobs one worker runs at once
    unit: str = "jobs"  # what a job is, for messages ("episodes")
    unit_cpus: float = 0.0  # CPUs each job in flight holds (an environment)
    unit_resources: dict[str, float] = field(default_factory=dict)  # custom resources each job in flight holds
    worker_cpus: float = 0.0  # CPUs the worker holds besides (a judge's event loop)
    workers: int | None = None  # workers wanted (None: as many as the cluster holds)


class Work(Protocol):
    """A piece of an engine an executor runs: what `run` does with a shard, and what it needs elsewhere."""

    what: str  # what travels to other processes, for the error when it cannot ("the policy or environment")

    @property
    def placement(self) -> Placement: ...

    def group(self, job: Any) -> Hashable | None:
        """Jobs with the same key are run in one shard (None: any shard)."""

    def portable(self, in_flight: int) -> Work:
        """A copy to run in another process with `in_flight` jobs at once (UsageError when it cannot go)."""

    async def run(self, shard: list[Any], emit: Callable[[Any], Awaitable[None]], tick: Callable[[int], None]) -> None:
        """Run the shard's jobs: await `emit(item)` for each item as it is done, `tick(n)` as jobs are done."""


class Executor(Protocol):
    """Runs a Work over jobs and commits its items on the driver."""

    async def run(self, work: Work, jobs: Iterable[Any], commit: Commit, *,
                  progress: Callable[[int], None] | None = None, log: Callable[[str], None] | None = None) -> None:
        """Every job run once through `work`, every item handed to `commit` (see the module docstring)."""


class LocalExecutor:
    """In this process: the jobs as one shard, each item committed the moment it is emitted."""

    async def run(self, work: Work, jobs: Iterable[Any], commit: Commit, *,
                  progress: Callable[[int], None] | None = None, log: Callable[[str], None] | None = None) -> None:
        jobs = list(jobs)
        if not jobs:
            return

        async def emit(item: Any) -> None:
            done = commit(item)
            if inspect.isawaitable(done):
                await done

        await work.run(jobs, emit, progress or (lambda n: None))


LOCAL = LocalExecutor()


def executor_for(ray: str | None, workers: int | None = None) -> Executor:
    """LOCAL, or with `ray` ("auto", HOST:PORT, ray://..., or "local" to start one on this machine) a
    RayExecutor with `workers` workers (default: what the work asks, else as many as the cluster holds).
    A UsageError saying how to install Ray when it is missing, before any work starts."""
    if ray is None:
        if workers is not None:
            from omrl.errors import UsageError

            raise UsageError("--ray-workers needs --ray")
        return LOCAL
    from omrl.rollout.ray_executor import RayExecutor

    return RayExecutor(ray, workers=workers)
