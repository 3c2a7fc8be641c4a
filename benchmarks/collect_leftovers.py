"""What `omrl collect` leaves running: engine processes after it ends, and after it is killed with SIGKILL.

    python benchmarks/collect_leftovers.py --env miniwob --option tasks=scripted --n 64 --concurrency 8
    python benchmarks/collect_leftovers.py --env twx --n 32 --concurrency 8 --engine-word java

Generates `--n` test tasks, runs `omrl collect --policy scripted` over them at `--concurrency` in a
subprocess, then counts the processes it left running (`left_after_collect`); then runs the same command
again and kills it with SIGKILL as soon as an engine process (one whose command line holds
`--engine-word`) runs, and counts what is still running 10 s later (`left_after_kill9`). Processes are
found by a marker in their environment, so other programs' browsers or JVMs do not count. Prints one JSON
line with the collect's own summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from omrl.cli.collect import env_options  # noqa: E402
from omrl.envs import generate_tasks  # noqa: E402
from tests.engine_helpers import kill_collect_mid_run, marked_processes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--n", type=int, default=64, help="episodes (one per task)")
    parser.add_argument("--concurrency", type=int, default=8, help="episodes in flight")
    parser.add_argument("--max-turns", type=int, default=16)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the environment's task generator (repeatable)")
    parser.add_argument("--engine-word", default="chromium", help="what an engine process's command line holds")
    args = parser.parse_args()
    out: dict = {"env": args.env, "episodes": args.n, "concurrency": args.concurrency,
                 "load_before": round(os.getloadavg()[0], 1)}
    work = Path(tempfile.mkdtemp(prefix="collect-leftovers-"))
    tasks_file = work / "tasks.jsonl"
    tasks = generate_tasks(args.env, n=args.n, split=args.split, **env_options(tuple(args.option), "--option"))
    tasks_file.write_text("".join(json.dumps(t.to_row()) + "\n" for t in tasks))

    def argv(store: str) -> list[str]:
        return ["collect", "--env", args.env, "--tasks", str(tasks_file), "--policy", "scripted", "--store",
                str(work / store), "--concurrency", str(args.concurrency), "--max-turns", str(args.max_turns),
                "--no-progress"]

    marker = uuid.uuid4().hex
    env = {**os.environ, "OMRL_TEST_MARKER": marker, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "omrl", *argv("store")], cwd=work, env=env, capture_output=True,
                          text=True, timeout=3600)
    out["collect_s"] = round(time.monotonic() - started, 1)
    if done.returncode != 0:
        raise SystemExit(f"collect failed: {done.stderr[-2000:]}")
    out["left_after_collect"] = len(marked_processes(marker))
    out["collect_summary"] = " ".join(line.strip() for line in done.stdout.splitlines() if "written" in line)
    engines, left = kill_collect_mid_run(argv("killed"), work, args.engine_word)
    out["engine_processes_when_killed"] = len(engines)
    out["left_after_kill9"] = len(left)
    out["load_after"] = round(os.getloadavg()[0], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
