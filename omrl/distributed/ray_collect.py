"""Collection on a Ray cluster: shards of (task, sample) jobs played by Ray actors, rows committed by the driver.

    result = await collect(None, tasks, policy, store, settings, samples=4, ray="auto")   # omrl.rollout.collect

- Each worker is a Ray actor holding its own environments (from the pickled env factory) and its own
  copy of the policy (pickled: an openai policy opens its own HTTP clients there, an hf policy loads its
  own model), and plays every shard it is given through the one episode runner, omrl.rollout.play_episodes.
- Resources per environment come from RolloutSettings: a worker playing `concurrency` episodes at once
  reserves ray_num_cpus and ray_resources times that; one that would not fit on the largest node plays
  fewer at once. ray_workers sets how many workers (default: as many as the cluster's CPUs hold).
- Rows go back to the driver, which appends them through the store's normal path (RowWriter: batches,
  skip_existing under the store's lock). A worker killed mid-shard is restarted by Ray and the shard is
  played again (max_task_retries); nothing of it had been committed, and ids are deterministic in
  (run, round, task, sample), so nothing is lost or doubled.
- The progress bar counts finished episodes over the whole cluster: committed rows plus the episodes
  each worker has finished in its running shard (polled twice a second).
- The dispatch (shards queued per worker, retries, live progress, stopping the workers) is pool.py's,
  shared with Ray judging (ray_annotate.py).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from omrl.distributed.pool import (  # noqa: F401 - RAY_HINT, require_ray, connect: this module's API too
    RAY_HINT,
    connect,
    require_ray,
    run_shards,
    shard_size,
    start_workers,
)
from omrl.errors import UsageError


def plan(settings: Any, cluster: dict[str, float], nodes: list[dict[str, float]], jobs: int) -> dict[str, Any]:
    """Workers, episodes in flight per worker and the resources each reserves, from the settings and the cluster.

    `cluster` is the cluster's total resources and `nodes` each alive node's; raises UsageError when one
    environment does not fit anywhere or more workers are asked for than the cluster holds."""
    per_env_cpus = float(settings.ray_num_cpus)
    if per_env_cpus < 0 or any(v < 0 for v in settings.ray_resources.values()):
        raise UsageError("--ray-num-cpus and --ray-resource amounts must not be negative")
    largest = max((n.get("CPU", 0.0) for n in nodes), default=cluster.get("CPU", 0.0))
    in_flight = min(settings.concurrency, max(jobs, 1))
    if per_env_cpus > 0:
        in_flight = min(in_flight, math.floor(largest / per_env_cpus + 1e-9))
    for name, amount in settings.ray_resources.items():
        have = max((n.get(name, 0.0) for n in nodes), default=0.0)
        if amount > 0:
            in_flight = min(in_flight, math.floor(have / amount + 1e-9))
    if in_flight < 1:
        wanted = {"CPU": per_env_cpus, **settings.ray_resources}
        raise UsageError(f"one environment needs {wanted} but no node of the Ray cluster has that much "
                         f"(cluster: {cluster})")
    cpus = per_env_cpus * in_flight
    resources = {name: amount * in_flight for name, amount in settings.ray_resources.items()}
    fit = [math.floor(cluster.get(name, 0.0) / amount + 1e-9) for name, amount in
           [("CPU", cpus), *resources.items()] if amount > 0]
    # Nothing reserved (ray_num_cpus 0): one worker process per cluster CPU, not one per job.
    most = max(1, min(fit)) if fit else max(1, int(cluster.get("CPU", 1)))
    workers = settings.ray_workers if settings.ray_workers is not None else most
    if workers < 1:
        raise UsageError(f"--ray-workers must be at least 1, got {workers}")
    if workers > most:
        raise UsageError(f"{workers} Ray workers of {in_flight} episodes each need {workers * cpus:g} CPUs; "
                         f"the cluster has {cluster.get('CPU', 0):g} (lower --ray-workers or --ray-num-cpus)")
    workers = min(workers, max(1, math.ceil(jobs / in_flight)))  # no idle workers for a small run
    return {"workers": workers, "in_flight": in_flight, "num_cpus": cpus, "resources": resources}


class EpisodeWorker:
    """A Ray actor: plays shards of (task, sample) jobs with its own environments and policy copy."""

    def __init__(self, make_env: Callable[[], Any], policy: Any, settings: Any, run: dict[str, Any],
                 play_episodes: Callable[..., Any]):
        self.make_env, self.policy, self.settings, self.run = make_env, policy, settings, run
        self.play_episodes = play_episodes  # omrl.rollout's episode runner, handed in (no import cycle)
        self.finished: dict[int, int] = {}  # episodes finished so far per running shard (the driver's live progress)
        # The driver keeps two shards queued per worker. Both play at once through these shared slots, so
        # at most `concurrency` episodes are in flight and the next shard fills each slot the moment the
        # previous shard's stragglers leave it (shards one after the other idled slots at every shard's end).
        self.slots = asyncio.Semaphore(settings.concurrency) if settings is not None else None
        self.shards = 0

    def pid(self) -> int:
        return os.getpid()

    def progress(self) -> int:
        return sum(self.finished.values())

    async def play(self, shard: list[tuple[Any, int]]) -> list[dict[str, Any]]:
        """The rows of the shard's episodes, in shard order."""
        self.shards += 1
        key = self.shards
        self.finished[key] = 0

        def count(_episode: Any) -> None:
            self.finished[key] += 1

        try:
            episodes = await self.play_episodes(shard, self.make_env, self.policy, self.settings, on_episode=count,
                                                slots=self.slots, **self.run)
        finally:
            del self.finished[key]
        return [episode.row for episode in episodes]


async def play_on_ray(jobs: list[tuple[Any, int]], result: Any, make_env: Callable[[], Any], policy: Any,
                      settings: Any, *, address: str, play_episodes: Callable[..., Any], writer: Any,
                      progress_bar: Callable[[str], Any], source: str,
                      on_episode: Callable[[Any], None] | None) -> Any:
    """Play `jobs` on the cluster at `address`, each shard through `play_episodes` on a worker, and hand
    the rows to `writer` (omrl.rollout.RowWriter); fills and returns `result`. `progress_bar(label)` makes
    the bar (omrl.rollout.CollectProgress).

    omrl.rollout.collect calls this after its checks (pending jobs, env probe) and hands in its own
    runner, writer and bar; use collect(..., ray=...)."""
    import time

    if on_episode is not None:  # an Episode holds its live context, which stays on the worker
        raise UsageError("on_episode callbacks are not available with ray; read the rows from the store")

    ray = connect(address)
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    layout = plan(settings, ray.cluster_resources(), nodes, len(jobs))
    size = shard_size(len(jobs), layout["workers"], layout["in_flight"])
    worker_settings = replace(settings, concurrency=layout["in_flight"])
    run = {"run_id": result.run_id, "round": result.round, "source": source}
    actors = start_workers(ray, EpisodeWorker, layout["workers"],
                           (make_env, policy, worker_settings, run, play_episodes),
                           num_cpus=layout["num_cpus"], resources=layout["resources"],
                           what="the policy or environment")
    started = time.monotonic()
    label = f"collect {result.run_id} on {layout['workers']} Ray worker(s)"

    with progress_bar(label) as bar:
        async def commit(rows: list[dict[str, Any]]) -> None:
            for row in rows:
                result.add(row)
                await writer.add(row)
            bar.update(result)

        try:
            await run_shards(ray, actors, (jobs[i:i + size] for i in range(0, len(jobs), size)), commit,
                             on_tick=(lambda pending: bar.update(result, pending=pending)) if bar.enabled else None)
        finally:
            # Also on failure or Ctrl-C: write what finished.
            await asyncio.shield(writer.flush())
            result.written, result.already_stored = writer.written, writer.already_stored
            result.duration_s = time.monotonic() - started
    return result
