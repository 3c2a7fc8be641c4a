"""The sandbox's total memory cap, measured: forked children and memfds under memory_mb, with the host's cap
(a cgroup where omrl can make one) and with the polling fallback (OMRL_SANDBOX_CGROUP=off).

Each case is a test file the agent writes, run through the code env's run_tests (tests/cases/escapes.py's
bodies): 4 forked children x 800 MB, 30 memfds x 49 MB, each under memory_mb=1024 and 256. Per case: the
most memory the attempt itself reported holding at one moment (held_mb: children alive with their memory
filled, memfds written), the peak the cap saw (peak_mb: the cgroup's high-water mark, or the poller's
largest sum), whether the run was stopped for memory, and seconds. Target: held_mb <= memory_mb everywhere
(memory_escapes = 0); for polling, overshoot_mb = the largest peak_mb - memory_mb. Prints one JSON line.

    python benchmarks/sandbox_memory.py                  # both modes, about a minute
    python benchmarks/sandbox_memory.py --modes host
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from omrl import sandbox
from omrl.sandbox import limits as sandbox_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the case lists live under tests/cases
from tests.cases.escapes import forks_body, held_at_once_mb, memfd_body, run_agent_test  # noqa: E402

CASES = {
    "forks_4x800": lambda: forks_body(children=4, mb=800),
    "memfd_30x49": lambda: memfd_body(count=30, mb=49),
}


def run_case(body: str, memory_mb: int) -> dict:
    start = time.monotonic()
    seen, info, env = run_agent_test(body, memory_mb=memory_mb, test_timeout_s=60)
    env.close()
    held = held_at_once_mb(seen)
    return {"held_mb": held, "peak_mb": info.get("memory_peak_mb"), "out_of_memory": info.get("out_of_memory"),
            "escaped": held is not None and held > memory_mb, "seconds": round(time.monotonic() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["host", "polling"], choices=["host", "polling"])
    parser.add_argument("--memory-mb", nargs="+", type=int, default=[1024, 256])
    args = parser.parse_args()
    sandbox.require_sandbox()
    saved = os.environ.get(sandbox_limits.CGROUP_ENV)
    out: dict = {"cases": {}}
    try:
        for mode in args.modes:
            if mode == "polling":
                os.environ[sandbox_limits.CGROUP_ENV] = "off"
            cap = sandbox_limits.memory_cap(refresh=True)
            out[f"{mode}_cap"] = cap.kind
            for name, body in CASES.items():
                for memory_mb in args.memory_mb:
                    out["cases"][f"{mode}/{name}/{memory_mb}"] = run_case(body(), memory_mb)
    finally:
        if saved is None:
            os.environ.pop(sandbox_limits.CGROUP_ENV, None)
        else:
            os.environ[sandbox_limits.CGROUP_ENV] = saved
        sandbox_limits.memory_cap(refresh=True)
    results = out["cases"].items()
    out["memory_escapes"] = sum(r["escaped"] for _, r in results)
    polled = [r["peak_mb"] - int(key.rsplit("/", 1)[1]) for key, r in results
              if key.startswith("polling/") and r["peak_mb"] is not None]
    out["polling_overshoot_mb"] = round(max(polled), 1) if polled else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
