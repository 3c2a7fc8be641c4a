"""Shards of work on Ray actors, each result handed to the driver as its shard ends: the one dispatch loop
behind Ray collection (ray_collect.py) and Ray judging (ray_annotate.py).

    ray = connect("auto")
    actors = start_workers(ray, EpisodeWorker, 2, (make_env, policy, ...), num_cpus=1.0, resources={},
                           what="the policy or environment")
    await run_shards(ray, actors, shards, on_result, on_tick=bar_update)

- An actor class has `play(shard)` (its result goes to `on_result`, awaited in finishing order) and
  `progress()` (units of its running shard done so far; the driver polls it twice a second for the bar).
- A worker killed mid-shard is restarted by Ray and the shard is played again (TASK_RETRIES): nothing of
  a shard reaches the driver before the whole shard is done, so nothing is committed twice.
- Each actor gets QUEUED_PER_WORKER shards ahead: no idle round trip between shards. The actor decides how
  they share it: EpisodeWorker plays both through one set of episode slots (the next fills in as one
  drains), JudgeWorker judges them one after the other.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from omrl.errors import OmrlError, UsageError

TASK_RETRIES = 3  # how often Ray replays a shard whose worker died
QUEUED_PER_WORKER = 2  # shards sent to a worker ahead: one playing, one waiting
RAY_HINT = "--ray needs Ray: pip install omrl[ray]"
TICK_S = 0.5  # how often the driver asks the workers how far their running shards are


def require_ray() -> Any:
    """The ray module, or a UsageError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(RAY_HINT) from None
    return ray


def connect(address: str) -> Any:
    """Join the cluster at `address` ("auto", HOST:PORT, ray://...), or start one on this machine ("local").

    A Ray session this process already holds is used as it is (tests and notebooks start their own)."""
    ray = require_ray()
    if not ray.is_initialized():
        options: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
        try:
            if address == "local":
                ray.init(include_dashboard=False, **options)
            else:
                ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UsageError(f"cannot reach the Ray cluster at {address!r}: {exc}") from None
    return ray


def shard_size(jobs: int, workers: int, in_flight: int) -> int:
    """Units per shard: several rounds per worker (so a fast worker takes more and the bar moves), each at
    least one full set of units in flight."""
    return max(in_flight, min(64, math.ceil(jobs / (workers * 4))))


def start_workers(ray: Any, cls: type, count: int, args: tuple, *, num_cpus: float,
                  resources: dict[str, float] | None, what: str) -> list[Any]:
    """`count` actors of `cls(*args)`, restarted by Ray when they die; a UsageError naming `what` when the
    arguments cannot be pickled to them."""
    actor_class = ray.remote(cls).options(num_cpus=num_cpus, resources=resources or None,
                                          max_restarts=TASK_RETRIES, max_task_retries=TASK_RETRIES)
    try:  # Ray moves a large argument (an hf model) through its object store by itself
        return [actor_class.remote(*args) for _ in range(count)]
    except Exception as exc:  # pickling fails inside Ray with its own error types
        raise UsageError(f"{what} cannot be sent to Ray workers ({type(exc).__name__}: {exc})") from None


async def run_shards(ray: Any, actors: list[Any], shards: Iterable[Any],
                     on_result: Callable[[Any], Awaitable[None]], *,
                     on_tick: Callable[[int], None] | None = None) -> None:
    """Play every shard on the actors and await `on_result(result)` for each as it finishes.

    `on_tick(units)` is called every TICK_S with the units the actors' running shards have done (not yet
    handed over). Raises OmrlError when a shard fails for good. The actors are killed at the end, also on
    failure or cancellation; a shard still running then is dropped, never half-handed over."""
    queue = deque(shards)
    running: dict[asyncio.Future, Any] = {}

    def submit(actor: Any) -> None:
        if queue:
            running[asyncio.wrap_future(actor.play.remote(queue.popleft()).future())] = actor

    async def live() -> None:
        while True:
            await asyncio.sleep(TICK_S)
            busy = list({id(a): a for a in running.values()}.values())  # two shards queued per worker: ask once
            counts = await asyncio.gather(*[asyncio.wrap_future(a.progress.remote().future()) for a in busy],
                                          return_exceptions=True)
            # A worker that just died reports an error here; its shard is replayed and counted later.
            on_tick(sum(c for c in counts if isinstance(c, int)))

    ticker = asyncio.create_task(live()) if on_tick is not None else None
    try:
        for _ in range(QUEUED_PER_WORKER):
            for actor in actors:
                submit(actor)
        while running:
            done, _ = await asyncio.wait(list(running), return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                actor = running.pop(future)
                try:
                    result = future.result()
                except ray.exceptions.RayError as exc:
                    raise OmrlError(f"a Ray shard failed (a dead worker's shard is replayed up to "
                                    f"{TASK_RETRIES} times): {type(exc).__name__}: {str(exc)[:500]}") from None
                await on_result(result)
                submit(actor)
    finally:
        if ticker is not None:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
        for future in running:
            future.cancel()
        for actor in actors:
            ray.kill(actor, no_restart=True)
