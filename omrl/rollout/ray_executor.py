"""The Ray executor: an engine's Work in shards on Ray actors, each shard's items committed by the driver.

    executor = RayExecutor("auto")          # or omrl.rollout.executor.executor_for("auto"); "local" starts a cluster
    result = await collect(None, tasks, policy, store, settings, executor=executor)

- The Work (omrl.rollout.executor) travels once through Ray's object store (its portable copy: an openai policy
  opens its own HTTP clients on a worker, an hf policy loads its own model there, a judge starts from the
  driver's reply cache) and is handed to each actor with its first shard, not to its constructor (a
  restarted actor whose constructor arguments live in the object store is a restart Ray warns about).
- Placement: a worker holds the work's placement (per job in flight: an environment's ray_num_cpus and
  ray_resources; per worker: a judge's CPU). One that would not fit on the largest node runs fewer jobs at
  once; as many workers as the cluster holds, or as asked, never more than there are shards.
- Each actor gets QUEUED_PER_WORKER shards ahead: no idle round trip between shards; the work decides how
  they share the worker (episodes through one set of slots, judge shards one after the other).
- A worker killed mid-shard is restarted by Ray and the shard is run again (TASK_RETRIES): nothing of a
  shard reaches the driver before the whole shard is done, so nothing is committed twice.
- omrl.rollout.executor's types are met by shape here (no import back: executor_for imports this module).
- Progress counts the jobs of committed shards plus those the running shards have done (polled every
  TICK_S), never past the total and never back (a replayed shard does not move it).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any

from omrl.errors import OmrlError, UsageError

TASK_RETRIES = 3  # how often Ray replays a shard whose worker died
QUEUED_PER_WORKER = 2  # shards sent to a worker ahead: one running, one waiting
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


class RayExecutor:
    """Runs Work on the Ray cluster at `address`; `workers` overrides the work's own wish."""

    def __init__(self, address: str, workers: int | None = None):
        require_ray()  # at once, before tasks or models load: say how to get it
        self.address, self.workers = address, workers

    async def run(self, work: Any, jobs: Iterable[Any], commit: Callable[[Any], Any], *,
                  progress: Callable[[int], None] | None = None, log: Callable[[str], None] | None = None) -> None:
        jobs = list(jobs)
        if not jobs:
            return
        ray = connect(self.address)
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        placement = work.placement if self.workers is None else replace(work.placement, workers=self.workers)
        layout = plan(placement, ray.cluster_resources(), nodes, len(jobs))
        parts = shards(jobs, shard_size(len(jobs), layout["workers"], layout["in_flight"]), work.group)
        count = min(layout["workers"], len(parts))
        portable = work.portable(layout["in_flight"])
        try:  # once into the object store, not once per worker
            refs = [ray.put(portable)]
        except Exception as exc:  # pickling fails inside Ray with its own error types
            raise UsageError(f"{work.what} cannot be sent to Ray workers ({type(exc).__name__}: {exc})") from None
        actors = start_workers(ray, worker_class(work), count, num_cpus=layout["num_cpus"],
                               resources=layout["resources"])
        if log is not None:
            log(f"on {count} Ray worker(s), {layout['in_flight']} {placement.unit} in flight each")
        state = {"committed": 0, "shown": 0}

        def show(running: int) -> None:
            # A shard just handed over may still count as running until its worker starts the next: cap at all.
            now = min(len(jobs), state["committed"] + running)
            if now > state["shown"] and progress is not None:
                progress(now - state["shown"])
            state["shown"] = max(now, state["shown"])

        async def on_result(result: dict[str, Any]) -> None:
            for item in result["items"]:
                done = commit(item)
                if inspect.isawaitable(done):
                    await done
            state["committed"] += result["jobs"]
            show(0)

        await run_shards(ray, actors, [(refs, part) for part in parts], on_result, on_tick=show)


def plan(placement: Any, cluster: dict[str, float], nodes: list[dict[str, float]], jobs: int) -> dict[str, Any]:
    """Workers, jobs in flight per worker and the resources each reserves, from the placement and the cluster.

    `cluster` is the cluster's total resources and `nodes` each alive node's; raises UsageError when one job
    does not fit anywhere or more workers are asked for than the cluster holds."""
    unit_cpus = float(placement.unit_cpus)
    if unit_cpus < 0 or any(v < 0 for v in placement.unit_resources.values()):
        raise UsageError("--ray-num-cpus and --ray-resource amounts must not be negative")
    largest = max((n.get("CPU", 0.0) for n in nodes), default=cluster.get("CPU", 0.0))
    in_flight = min(placement.in_flight, max(jobs, 1))
    if unit_cpus > 0:
        in_flight = min(in_flight, math.floor((largest - placement.worker_cpus) / unit_cpus + 1e-9))
    for name, amount in placement.unit_resources.items():
        have = max((n.get(name, 0.0) for n in nodes), default=0.0)
        if amount > 0:
            in_flight = min(in_flight, math.floor(have / amount + 1e-9))
    if in_flight < 1:
        wanted = {"CPU": unit_cpus, **placement.unit_resources}
        raise UsageError(f"one of the {placement.unit} needs {wanted} but no node of the Ray cluster has that "
                         f"much (cluster: {cluster})")
    cpus = placement.worker_cpus + unit_cpus * in_flight
    resources = {name: amount * in_flight for name, amount in placement.unit_resources.items()}
    fit = [math.floor(cluster.get(name, 0.0) / amount + 1e-9) for name, amount in
           [("CPU", cpus), *resources.items()] if amount > 0]
    # Nothing reserved (ray_num_cpus 0): one worker process per cluster CPU, not one per job.
    most = max(1, min(fit)) if fit else max(1, int(cluster.get("CPU", 1)))
    workers = placement.workers if placement.workers is not None else most
    if workers < 1:
        raise UsageError(f"--ray-workers must be at least 1, got {workers}")
    if workers > most:
        lower = "--ray-workers or --ray-num-cpus" if unit_cpus > 0 else "--ray-workers"
        raise UsageError(f"{workers} Ray workers of {in_flight} {placement.unit} each need {workers * cpus:g} CPUs; "
                         f"the cluster has {cluster.get('CPU', 0):g} (lower {lower})")
    workers = min(workers, max(1, math.ceil(jobs / in_flight)))  # no idle workers for a small run
    return {"workers": workers, "in_flight": in_flight, "num_cpus": cpus, "resources": resources}


def shards(jobs: list[Any], size: int, group: Callable[[Any], Any]) -> list[list[Any]]:
    """`jobs` cut into shards of about `size`, never splitting jobs of one group (a group larger than `size`
    is a shard of its own); jobs whose group is None go anywhere."""
    sets: dict[Any, list[Any]] = {}
    for i, job in enumerate(jobs):
        key = group(job)
        sets.setdefault(("group", key) if key is not None else ("job", i), []).append(job)
    out: list[list[Any]] = []
    current: list[Any] = []
    for members in sets.values():
        if current and len(current) + len(members) > size:
            out.append(current)
            current = []
        current.extend(members)
    if current:
        out.append(current)
    return out


def shard_size(jobs: int, workers: int, in_flight: int) -> int:
    """Jobs per shard: several rounds per worker (so a fast worker takes more and the bar moves), each at
    least one full set of jobs in flight."""
    return max(in_flight, min(64, math.ceil(jobs / (workers * 4))))


class ShardWorker:
    """A Ray actor: runs shards of one Work (fetched with its first shard) and returns each shard's items."""

    def __init__(self) -> None:
        self.work: Any = None
        self.fetching = asyncio.Lock()  # two queued shards arrive together: one copy of the work, not two
        self.running: dict[int, int] = {}  # jobs done so far per running shard (the driver's live progress)
        self.shards = 0

    def pid(self) -> int:
        import os

        return os.getpid()

    def progress(self) -> int:
        return sum(self.running.values())

    async def play(self, job: tuple[list[Any], list[Any]]) -> dict[str, Any]:
        """`job` is ([ref of the portable work], shard); returns {"items": what the work emitted, "jobs": n}."""
        refs, shard = job
        async with self.fetching:
            if self.work is None:  # a ref nested in the argument is not resolved by Ray: fetch it once
                self.work = await refs[0]
        self.shards += 1
        key = self.shards
        self.running[key] = 0
        items: list[Any] = []

        async def emit(item: Any) -> None:
            items.append(item)

        def tick(n: int) -> None:
            self.running[key] += n

        try:
            await self.work.run(shard, emit, tick)
        finally:
            del self.running[key]
        return {"items": items, "jobs": len(shard)}


def worker_class(work: Any) -> type:
    """ShardWorker named after the work (EpisodeWork -> EpisodeWorker), so `ps` and Ray's listings tell them apart."""
    name = type(work).__name__.removesuffix("Work") + "Worker"
    return type(name, (ShardWorker,), {})


def start_workers(ray: Any, cls: type, count: int, *, num_cpus: float, resources: dict[str, float] | None) -> list[Any]:
    """`count` actors of `cls()`, restarted by Ray when they die."""
    actor_class = ray.remote(cls).options(num_cpus=num_cpus, resources=resources or None,
                                          max_restarts=TASK_RETRIES, max_task_retries=TASK_RETRIES)
    return [actor_class.remote() for _ in range(count)]


async def run_shards(ray: Any, actors: list[Any], shards: Iterable[Any],
                     on_result: Callable[[Any], Awaitable[None]], *,
                     on_tick: Callable[[int], None] | None = None) -> None:
    """Run every shard on the actors and await `on_result(result)` for each as it finishes.

    `on_tick(jobs)` is called every TICK_S with the jobs the actors' running shards have done (not yet
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
