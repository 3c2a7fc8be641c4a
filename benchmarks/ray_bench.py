"""Ray collection benchmark: omrl.rollout.collect on a local Ray cluster against in-process collection.

    python benchmarks/ray_bench.py            # a few minutes on 2 cores
    python benchmarks/ray_bench.py --quick    # fewer episodes

- CPU-bound: the code environment played by its scripted expert (each episode runs the project's tests
  twice in the bubblewrap sandbox, or unsandboxed with --unsafe-no-sandbox where bubblewrap cannot run).
  Episodes/s in-process (one episode at a time) and on Ray with 1 and 2 workers (1 CPU and one episode
  each). ray_speedup_2 = Ray 2 workers / Ray 1 worker (target >= 1.7 on 2 free cores).
- I/O-bound: the math environment answered by the real `openai:` policy from a local fake server (its own
  process) with a fixed latency (0.5 s, the low end of a hosted model's reply). io_ceiling_episodes_per_s
  is concurrency / latency: the run is I/O-bound while in-process is near it (at 0.1 s in-process reached
  about a third of its ceiling on 2 cores, a CPU race between processes rather than I/O).
  ray_overhead_io = 1 - (Ray, 1 worker, episodes/s) / (in-process asyncio, episodes/s)
  at the same concurrency (target <= 0.10). Ray's time includes starting its workers; ray_worker_start_s
  is that start alone (one actor: process, imports, first answer), measured after the runs.

Wall time of each whole collect() call, on one ray.init(num_cpus=2) cluster started before timing.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omrl.rollout import RolloutSettings, collect  # noqa: E402
from omrl.rollout.executor import executor_for  # noqa: E402
from omrl.store import Store  # noqa: E402
from omrl.tasks import load_tasks  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
IO_CONCURRENCY = 32  # episodes in flight in the I/O-bound runs, in-process and on the Ray worker


def timed(tasks, policy, settings, samples, ray, root: str, name: str) -> float:
    """Episodes/s of one whole collect() call into a fresh store."""
    store = Store.create(Path(root) / name)
    started = time.perf_counter()
    result = asyncio.run(collect(None, tasks, policy, store, settings, samples=samples, run_id=name,
                                 executor=executor_for(ray)))
    elapsed = time.perf_counter() - started
    if result.played != len(tasks) * samples or result.errors:
        raise SystemExit(f"{name}: {result.played} played, {result.errors} errors ({dict(result.statuses)})")
    return result.played / elapsed


def cpu_bound(root: str, samples: int, unsafe: bool) -> dict[str, float]:
    from omrl.policies.scripted import ScriptedPolicy

    tasks = load_tasks(str(REPO / "datasets" / "tasks" / "code.jsonl"))
    options = {"unsafe_no_sandbox": True} if unsafe else {}
    base = RolloutSettings(env="code", env_options=options, max_turns=16, concurrency=1, ray_num_cpus=1.0)
    policy = ScriptedPolicy()
    return {
        "inproc": timed(tasks, policy, base, samples, None, root, "cpu-inproc"),
        "ray1": timed(tasks, policy, replace(base, ray_workers=1), samples, "auto", root,
                      "cpu-ray1"),
        "ray2": timed(tasks, policy, replace(base, ray_workers=2), samples, "auto", root,
                      "cpu-ray2"),
    }


SERVER = """
import json, sys, time
from omrl.testing.openai_server import FakeOpenAIServer
server = FakeOpenAIServer(default={"content": "The answer is 4.", "delay": float(sys.argv[1])}).start()
print(server.base_url, flush=True)
time.sleep(3600)
"""


def io_bound(root: str, samples: int, latency: float, concurrency: int) -> dict[str, float]:
    import subprocess

    from omrl.policies.openai_policy import OpenAIPolicy

    tasks = load_tasks(str(REPO / "datasets" / "tasks" / "math_arith.jsonl"))
    settings = RolloutSettings(env="math", max_turns=1, concurrency=concurrency, ray_num_cpus=0.01, ray_workers=1)
    # The server in a process of its own: in this one its threads would share the GIL with in-process
    # collection but not with a Ray worker, which would flatter Ray.
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(latency)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        base_url = server.stdout.readline().strip()

        def policy():  # a fresh policy per run: no client of an earlier loop travels to the workers
            return OpenAIPolicy("fake", base_url=base_url, max_connections=concurrency, tokens="off")

        return {"inproc": timed(tasks, policy(), settings, samples, None, root, "io-inproc"),
                "ray1": timed(tasks, policy(), settings, samples, "auto", root, "io-ray1")}
    finally:
        server.kill()
        server.wait()


def worker_start_s() -> float:
    """Seconds from asking for one Ray shard worker actor to its first answer (process start and imports)."""
    import ray

    from omrl.rollout.ray_executor import ShardWorker

    started = time.perf_counter()
    actor = ray.remote(ShardWorker).options(num_cpus=1).remote()
    ray.get(actor.pid.remote())
    elapsed = time.perf_counter() - started
    ray.kill(actor)
    return elapsed


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer episodes (a rough figure)")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="run the code env's tests without bubblewrap (only where it cannot run)")
    parser.add_argument("--latency", type=float, default=0.5, help="fake server seconds per reply (I/O part)")
    args = parser.parse_args(argv)
    import ray

    cpu_samples, io_samples = (1, 4) if args.quick else (3, 40)
    ray_dir = tempfile.mkdtemp(prefix="omrlrb", dir="/tmp")  # short: Ray's socket paths have a length limit
    with tempfile.TemporaryDirectory(prefix="omrl-ray-bench-") as root:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_dir,
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
        try:
            cpu = cpu_bound(root, cpu_samples, args.unsafe_no_sandbox)
            io = io_bound(root, io_samples, args.latency, concurrency=IO_CONCURRENCY)
            start_s = worker_start_s()
            io_episodes = io_samples * len(load_tasks(str(REPO / "datasets" / "tasks" / "math_arith.jsonl")))
        finally:
            ray.shutdown()
            shutil.rmtree(ray_dir, ignore_errors=True)
    out = {
        "cpu_episodes_per_s": {k: round(v, 3) for k, v in cpu.items()},
        "ray_speedup_2": round(cpu["ray2"] / cpu["ray1"], 3),
        "ray2_vs_inproc": round(cpu["ray2"] / cpu["inproc"], 3),
        "io_episodes_per_s": {k: round(v, 2) for k, v in io.items()},
        "io_ceiling_episodes_per_s": round(IO_CONCURRENCY / args.latency, 2), "io_latency_s": args.latency,
        "ray_overhead_io": round(1 - io["ray1"] / io["inproc"], 3),
        "ray_worker_start_s": round(start_s, 2),
        # the same, with one worker start taken off Ray's wall time: what a long run tends to
        "ray_overhead_io_after_start": round(1 - io_episodes / (io_episodes / io["ray1"] - start_s) / io["inproc"], 3),
        "cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
