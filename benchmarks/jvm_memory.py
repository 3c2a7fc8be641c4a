"""JVM engines' memory, measured: `omrl collect --env scienceworld -c 4` with its caps (the JVM's -Xmx and the
engine process's memory cap) and without them (`--env-option jvm_heap_mb=0 --env-option memory_mb=0`), in one run.

    python benchmarks/jvm_memory.py                      # about 5 minutes: 2 x 2 minutes of collect
    python benchmarks/jvm_memory.py --seconds 60 --policy scripted --in-flight 2

Each run plays random (or scripted) episodes of ScienceWorld test tasks for `--seconds`, then is killed; every
0.5 s the resident memory (VmRSS) of the collect process tree is summed: the collect process itself, and the
engines below it (guards, engine processes, JVMs). Per run: peak_rss_mb (the whole tree), engines_peak_mb (the
tree less the collect process), final_rss_mb, and the episodes stored, env_errors among them (an engine
killed for its cap is one) and their turns (the work done, to compare the runs' speed). The caps bound the engines: engines_peak_mb <= in_flight x worker_cap_mb
(`within_bound`). Prints one JSON line, with uncapped_over_capped = the ratio of the two runs' peak_rss_mb.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from omrl.envs import generate_tasks, make_env  # noqa: E402
from omrl.envs.engine_memory import jvm_caps  # noqa: E402
from omrl.envs.scienceworld.engine import JVM_HEAP_MB  # noqa: E402
from omrl.sandbox.limits import process_tree  # noqa: E402
from omrl.store import Store  # noqa: E402
from omrl.store.manifest import MANIFEST  # noqa: E402
from omrl.tasks import write_tasks  # noqa: E402

SAMPLE_S = 0.5
UNCAPPED = ["--env-option", "jvm_heap_mb=0", "--env-option", "memory_mb=0"]


def rss_mb(pid: int) -> float:
    """VmRSS of one process in MB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return 0.0
    return 0.0


def stored(store: Path) -> dict[str, int]:
    """Episodes stored, env_errors among them, and their turns (all 0 when nothing was written yet)."""
    rows = Store(store).read(columns=["status", "num_turns"]).to_pylist() if (store / MANIFEST).is_file() else []
    return {"episodes": len(rows), "env_errors": sum(1 for row in rows if row["status"] == "env_error"),
            "turns": sum(row["num_turns"] or 0 for row in rows)}


def run(tasks: Path, workdir: Path, args: argparse.Namespace, capped: bool) -> dict:
    """One collect for args.seconds, sampled every SAMPLE_S; its peaks and what it stored."""
    store = workdir / ("capped" if capped else "uncapped")
    argv = [sys.executable, "-m", "omrl", "collect", "--env", "scienceworld", "--tasks", str(tasks), "--policy",
            args.policy, "-c", str(args.in_flight), "--store", str(store), "--batch-size", "4", "--no-progress",
            *([] if capped else UNCAPPED)]
    log = (workdir / f"{store.name}.log").open("w")
    collect = subprocess.Popen(argv, cwd=workdir, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    peak = engines_peak = total = 0.0
    samples = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.seconds and collect.poll() is None:
            tree = process_tree(collect.pid)
            own = rss_mb(collect.pid)
            total = own + sum(rss_mb(pid) for pid in tree[1:])
            peak, engines_peak = max(peak, total), max(engines_peak, total - own)
            samples += 1
            time.sleep(SAMPLE_S)
    finally:
        ended_early = collect.poll() is not None
        if not ended_early:  # its engines go with it (their guards see it die)
            os.killpg(collect.pid, signal.SIGKILL)
        collect.wait()
        log.close()
    return {"peak_rss_mb": round(peak), "engines_peak_mb": round(engines_peak), "final_rss_mb": round(total),
            "samples": samples, "seconds": round(time.monotonic() - started), "ended_early": ended_early,
            **stored(store)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long each collect runs")
    parser.add_argument("--in-flight", type=int, default=4, help="collect's -c")
    parser.add_argument("--policy", default="random", choices=["random", "scripted"])
    parser.add_argument("--tasks", type=int, default=600, help="test tasks to draw (more than a run gets through)")
    parser.add_argument("--only", choices=["capped", "uncapped"], help="run one of the two")
    args = parser.parse_args()
    heap_mb, worker_mb = jvm_caps("scienceworld", JVM_HEAP_MB, None)
    out: dict = {"env": "scienceworld", "policy": args.policy, "seconds": args.seconds, "in_flight": args.in_flight,
                 "jvm_heap_cap_mb": heap_mb, "worker_cap_mb": worker_mb, "bound_mb": args.in_flight * worker_mb}
    with tempfile.TemporaryDirectory(prefix="jvm-memory-") as folder:
        workdir = Path(folder)
        tasks = workdir / "tasks.jsonl"
        write_tasks(generate_tasks("scienceworld", args.tasks, seed=0, split="test"), tasks)
        make_env("scienceworld").close()  # untimed: neither run starts its JVMs from a cold disk cache
        for capped in (True, False):
            if args.only in (None, "capped" if capped else "uncapped"):
                out["capped" if capped else "uncapped"] = run(tasks, workdir, args, capped)
    if "capped" in out:
        out["within_bound"] = out["capped"]["engines_peak_mb"] <= out["bound_mb"]
    if "capped" in out and "uncapped" in out and out["capped"]["peak_rss_mb"]:
        out["uncapped_over_capped"] = round(out["uncapped"]["peak_rss_mb"] / out["capped"]["peak_rss_mb"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
