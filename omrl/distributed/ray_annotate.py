"""Judging on a Ray cluster: shards of trajectory rows judged by Ray actors, annotations committed by the driver.

    stats = await judge_on_ray(config, rows, run_id, cache, commit, address="auto")  # omrl.annotate.runner

- Each worker is a Ray actor running annotate's own judge code on its shards: omrl.annotate.judge.run_judge
  (the modes, prompts, re-asks of invalid replies, the one LLM client with its transport retries), with
  `config.concurrency` requests in flight per worker (so the endpoint sees up to workers x concurrency).
- A pairwise judge compares the trajectories of one task and a group judge those of one group_id, so such
  a set always lands whole in one shard (judge.judged_together); pointwise rows are split freely.
- The reply cache: each worker starts from the driver's cache (shipped once through Ray's object store) and
  sends the replies it got back with the shard's annotations; the driver adds those to its cache, then
  commits the annotations in one part per shard (a group's relative scores together or not at all).
- A worker killed mid-shard is restarted by Ray and the shard judged again (pool.py): nothing of it had
  been committed, so each (trajectory, judge) is annotated once; its replies died with it and are asked
  again (their calls are not in the returned statistics).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from omrl.annotate.judge import judged_together
from omrl.distributed.pool import connect, run_shards, shard_size, start_workers
from omrl.errors import UsageError

WORKER_CPUS = 1.0  # a judge worker is one process with an event loop: rendering, JSON, HTTP


def judge_shards(rows: list[dict[str, Any]], mode: str, size: int) -> list[list[dict[str, Any]]]:
    """`rows` cut into shards of about `size`, never splitting what the mode judges together (a task or a
    group larger than `size` is one shard of its own)."""
    key = judged_together(mode)
    sets: dict[Any, list[dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        sets.setdefault(row[key] if key else i, []).append(row)
    shards: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for members in sets.values():
        if current and len(current) + len(members) > size:
            shards.append(current)
            current = []
        current.extend(members)
    if current:
        shards.append(current)
    return shards


class JudgeWorker:
    """A Ray actor: judges shards of trajectory rows with run_judge, from a copy of the driver's reply cache."""

    def __init__(self, config: Any, run_id: str):
        import asyncio

        self.config, self.run_id = config, run_id
        self.cached: dict[str, dict[str, Any]] | None = None  # the driver's cache, fetched with the first shard
        self.finished = 0  # rows of the current shard judged so far (the driver's live progress)
        self.turn = asyncio.Semaphore(1)  # shards one after the other, `concurrency` requests each

    def pid(self) -> int:
        import os

        return os.getpid()

    def progress(self) -> int:
        return self.finished

    async def play(self, job: tuple[list[Any], list[dict[str, Any]]]) -> dict[str, Any]:
        """`job` is ([ref of the driver's cache entries], shard rows); returns {"rows": the shard's annotations,
        "stats": its JudgeStats as a dict, "replies": new cache entries, "judged": rows of the shard}."""
        from omrl.annotate.cache import JudgeCache
        from omrl.annotate.judge import run_judge

        def count(n: int) -> None:
            self.finished += n

        refs, shard = job
        async with self.turn:
            self.finished = 0
            if self.cached is None:  # a ref nested in the argument is not resolved by Ray: fetch it once
                self.cached = await refs[0]
            cache = JudgeCache(None)  # in memory: the driver owns the cache file
            cache.entries.update(self.cached)
            rows, stats = await run_judge(self.config, shard, self.run_id, cache, count)
        replies = [e for key, e in cache.entries.items() if self.cached.get(key) is not e]
        return {"rows": rows, "stats": vars(stats), "replies": replies, "judged": len(shard)}


def workers_for(cluster: dict[str, float], shards: int, wanted: int | None) -> int:
    """How many judge workers: `wanted`, else one per cluster CPU; never more than there are shards."""
    fit = max(1, math.floor(cluster.get("CPU", 0.0) / WORKER_CPUS + 1e-9))
    if wanted is not None:
        if wanted < 1:
            raise UsageError(f"--ray-workers must be at least 1, got {wanted}")
        if wanted > fit:
            raise UsageError(f"{wanted} Ray judge workers need {wanted * WORKER_CPUS:g} CPUs; the cluster has "
                             f"{cluster.get('CPU', 0):g} (lower --ray-workers)")
        fit = wanted
    return max(1, min(fit, shards))


async def judge_on_ray(config: Any, rows: list[dict[str, Any]], run_id: str, cache: Any,
                       commit: Callable[[list[dict[str, Any]]], None], *, address: str,
                       workers: int | None = None, progress: Callable[[int], None] = lambda n: None) -> Any:
    """Judge `rows` on the cluster at `address`; `commit(annotations)` is called once per finished shard
    (after its replies are in `cache`), `progress(n)` as rows are judged cluster-wide. Returns the summed
    JudgeStats of the shards. omrl.annotate.runner.annotate calls this for `ray=`."""
    from omrl.annotate.judge import JudgeStats

    ray = connect(address)
    # Size shards as if every CPU held a worker, then start no more workers than there are shards.
    guess = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    shards = judge_shards(rows, config.mode, shard_size(len(rows), guess, config.concurrency))
    count = workers_for(ray.cluster_resources(), len(shards), workers)
    # Once into the object store, not once per worker; handed over with each shard, not to the constructor
    # (a restarted actor whose constructor arguments live in the object store is a restart Ray warns about).
    cached = [ray.put(dict(cache.entries))]
    actors = start_workers(ray, JudgeWorker, count, (config, run_id), num_cpus=WORKER_CPUS,
                           resources=None, what="the judge configuration")
    total = JudgeStats()
    state = {"committed": 0, "shown": 0}

    def show(pending: int) -> None:
        # A shard just handed over may still count as running until its worker starts the next: cap at all.
        now = min(len(rows), state["committed"] + pending)
        if now > state["shown"]:  # progress(n) takes increments; a replayed shard never moves it back
            progress(now - state["shown"])
            state["shown"] = now

    async def on_result(result: dict[str, Any]) -> None:
        for entry in result["replies"]:
            cache.put(entry["prompt_hash"], entry["content"], entry.get("prompt_tokens", 0),
                      entry.get("completion_tokens", 0), entry.get("model", config.model))
        commit(result["rows"])
        for name, value in result["stats"].items():
            setattr(total, name, getattr(total, name) + value)
        state["committed"] += result["judged"]
        show(0)

    await run_shards(ray, actors, [(cached, shard) for shard in shards], on_result, on_tick=show)
    return total
