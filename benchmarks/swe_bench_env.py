"""SWE tasks from real package sdists, measured: generation (kept/tried per modifier, seconds per kept task),
then on a sample of the kept tasks the fix applied through the env's tools, an empty submission and the scripted
expert through `omrl collect`; test-run seconds per episode and episodes/s at 8 in flight. Prints one JSON line.

Targets (issue 23): >= 100 validated tasks from >= 5 packages; on 50 of them the fix through the tools resolves
100%, an empty submission 0%, the scripted expert through collect >= 98%; every test run in the sandbox
(`sandboxed_only`: no process outside the sandbox ran package code during the episodes).

    python benchmarks/swe_bench_env.py --n 100 --sample 50
    python benchmarks/swe_bench_env.py --package toolz==0.12.1 --n 10 --sample 5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

DEFAULT_PACKAGES = ["toolz==0.12.1", "parse==1.20.2", "cachetools==5.3.3", "inflection==0.5.1",
                    "more-itertools==10.2.0", "six==1.16.0"]


def watch_host_processes(stop: threading.Event, seen: list[str]) -> None:
    """Every 0.2 s: processes running omrl's test command (`-p pytest_timeout`) as any user but the sandbox's
    (uid 65534 outside too, as root) and not as a bwrap layer: a test run outside the sandbox."""
    import os

    own = os.getpid()
    while not stop.is_set():
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == own:
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                uid = (entry / "status").read_text().split("Uid:")[1].split()[0]
            except (OSError, IndexError):
                continue
            if uid != "65534" and "-p pytest_timeout" in cmdline and "bwrap" not in cmdline:
                seen.append(cmdline[:200])
        stop.wait(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", action="append", default=None, help="NAME==VERSION (repeatable)")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--sample", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the generated tasks here (JSONL)")
    args = parser.parse_args()

    from click.testing import CliRunner

    from omrl.cli.main import cli
    from omrl.envs import generate_tasks, make_env
    from omrl.envs.base import Action
    from omrl.envs.toolenv import play_episode
    from omrl.store import Store
    from omrl.tasks import write_tasks

    specs = args.package or DEFAULT_PACKAGES
    report: dict = {}
    stop, outside = threading.Event(), []
    watcher = threading.Thread(target=watch_host_processes, args=(stop, outside), daemon=True)
    watcher.start()
    started = time.monotonic()
    tasks = generate_tasks("swe", n=args.n, packages=specs, workers=args.workers, report=report)
    generation_s = time.monotonic() - started
    modifiers: dict[str, dict[str, int]] = {}
    for package in report.values():
        for name, counts in package.get("modifiers", {}).items():
            total = modifiers.setdefault(name, {"kept": 0, "tried": 0})
            total["kept"] += counts["kept"]
            total["tried"] += counts["tried"]
    out: dict = {"tasks": len(tasks), "packages": {k: {"kept": v.get("kept"), "tried": v.get("tried"),
                                                        "baseline_passed": v.get("baseline_passed"),
                                                        "seconds": v.get("seconds")} for k, v in report.items()},
                 "packages_with_tasks": sum(1 for v in report.values() if v.get("kept")),
                 "kept_tried_per_modifier": modifiers,
                 "seconds_per_validated_task": round(generation_s / max(1, len(tasks)), 1)}
    step = max(1, len(tasks) // max(1, args.sample))
    sample = tasks[::step][: args.sample]  # spread over the packages
    print(json.dumps({"generation": out}), file=sys.stderr, flush=True)  # before the (long) episodes
    env = make_env("swe")
    fixed = empty = 0
    test_seconds = []
    try:
        for task in sample:
            total, last, _ = play_episode(env, task)
            fixed += total == 1.0
            test_seconds.append(last.info.get("test_seconds", 0.0))
            env.reset(task)
            empty += env.step(Action(tool="submit")).reward == 1.0
    finally:
        env.close()
    with tempfile.TemporaryDirectory(prefix="swe-bench-") as tmp:
        tasks_file = Path(tmp) / "swe.jsonl"
        write_tasks(sample, tasks_file)
        start = time.monotonic()
        result = CliRunner().invoke(cli, ["collect", "--env", "swe", "--tasks", str(tasks_file), "--policy",
                                          "scripted", "--store", f"{tmp}/store", "--concurrency", "8",
                                          "--no-progress", "--max-turns", "10"])
        collect_s = time.monotonic() - start
        rows = Store(f"{tmp}/store").read().to_pylist() if result.exit_code == 0 else []
        if args.out:
            write_tasks(tasks, args.out)
    stop.set()
    watcher.join()
    out.update({
        "sample": len(sample), "fix_through_tools_resolved": round(fixed / max(1, len(sample)), 3),
        "empty_submission_resolved": round(empty / max(1, len(sample)), 3),
        "collect_expert_resolved": round(sum(bool(r["success"]) for r in rows) / max(1, len(sample)), 3),
        "collect_exit_code": result.exit_code,
        "test_run_seconds_per_episode": round(sum(test_seconds) / max(1, len(test_seconds)), 2),
        "episodes_per_s_at_8": round(len(rows) / collect_s, 3) if rows else None,
        "sandboxed_only": not outside, "outside_processes": outside[:3],
        "seconds": round(time.monotonic() - started, 1),
    })
    print(json.dumps(out))


if __name__ == "__main__":
    main()
