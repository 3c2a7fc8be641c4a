"""SWE tasks from real package sdists, measured: generation (kept/tried per modifier, seconds per kept task),
then on a sample of the kept tasks the fix applied through the env's tools, an empty submission and the scripted
expert through `omrl collect`; test-run seconds per episode and episodes/s at 8 in flight. Prints one JSON line.

Targets (issue 23): >= 100 validated tasks from >= 5 packages; on 50 of them the fix through the tools resolves
100%, an empty submission 0%, the scripted expert through collect >= 98%; every test run in the sandbox
(`sandboxed_only`: a watcher saw the sandbox's test processes and none outside it running pytest or the
packages' files).

Generation resumes from its records (~/.cache/omrl/swe/runs): `seconds_per_validated_task` is the test-run
seconds those records hold (baseline and every candidate tried, kept or not) per kept task, so a resumed run
reports what generating cost; `generation_wall_s` is this run's own time. Progress goes to stderr, one line per
episode, and the results so far to --partial after each; a run stopped by SIGTERM or SIGINT (`timeout`) still
prints its JSON line, with "complete": false.

    nice -n 10 timeout 3h python benchmarks/swe_bench_env.py --n 100 --sample 50
    python benchmarks/swe_bench_env.py --package toolz==0.12.1 --n 10 --sample 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

DEFAULT_PACKAGES = ["toolz==0.12.1", "parse==1.20.2", "cachetools==5.3.3", "inflection==0.5.1",
                    "more-itertools==10.2.0", "six==1.16.0"]


class Stopped(BaseException):
    """SIGTERM or SIGINT: stop where we are and print what was measured (not an Exception: nothing swallows it)."""


class Watcher(threading.Thread):
    """Every 0.2 s, this process's descendants that run pytest or name a package's files: those in this
    process's mount namespace ran package code outside the sandbox (bwrap's own launchers, which only start
    the sandbox, aside); those in another one are the sandbox's test runs, counted to show the watch works."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__(daemon=True)
        self.paths, self.stop = [p.encode() for p in paths], threading.Event()
        self.outside: list[str] = []
        self.inside: set[int] = set()
        self.scans = 0
        self.own_mounts = os.readlink("/proc/self/ns/mnt")

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in self._descendants(os.getpid()):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    mounts = os.readlink(f"/proc/{pid}/ns/mnt")
                except OSError:  # ended meanwhile
                    continue
                text = b" ".join(cmdline)
                if b"pytest" not in text and not any(p in text for p in self.paths):
                    continue
                if mounts != self.own_mounts:
                    self.inside.add(pid)
                elif os.path.basename(cmdline[0]) != b"bwrap":
                    self.outside.append(text.decode(errors="replace")[:200])
            self.scans += 1
            self.stop.wait(0.2)

    @staticmethod
    def _descendants(root: int) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    stat = Path(f"/proc/{entry.name}/stat").read_text()
                except OSError:
                    continue
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
        found, todo = [], [root]
        while todo:
            kids = children.get(todo.pop(), [])
            found += kids
            todo += kids
        return found

    def finish(self) -> dict:
        self.stop.set()
        self.join(timeout=30)
        return {"sandboxed_only": not self.outside and bool(self.inside) and not self.is_alive(),
                "watcher_completed": not self.is_alive(), "watcher_scans": self.scans,
                "sandboxed_test_processes_seen": len(self.inside), "outside_processes": self.outside[:3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", action="append", default=None, help="NAME==VERSION (repeatable)")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--sample", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8, help="episodes in flight in the collect phase")
    parser.add_argument("--partial", default="swe_bench_env.partial.json", help="the results so far, rewritten "
                                                                                 "after each episode")
    parser.add_argument("--out", default=None, help="also write the generated tasks here (Parquet)")
    args = parser.parse_args()

    def stop(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    out: dict = {"complete": False}
    watcher = None
    started = time.monotonic()
    try:
        watcher = run(args, out, started)
        out["complete"] = True
    except Stopped as why:
        out["stopped_by"] = str(why)
    finally:
        if watcher is not None:
            out.update(watcher.finish())
        out["seconds"] = round(time.monotonic() - started, 1)
        save(args.partial, out)
        out.pop("test_run_seconds", None)  # each episode's, in --partial only
        print(json.dumps(out), flush=True)


def save(path: str, out: dict) -> None:
    Path(path).write_text(json.dumps(out, indent=1) + "\n")


def run(args, out: dict, started: float) -> Watcher:
    """The three phases, each adding its figures to `out` as it goes; returns the (running) watcher."""
    from omrl.envs import generate_tasks, make_env
    from omrl.envs.base import Action
    from omrl.envs.swe import packages
    from omrl.envs.toolenv import play_episode

    specs = args.package or DEFAULT_PACKAGES
    fetched = [packages.fetch(spec, progress=lambda line: print(line, file=sys.stderr)) for spec in specs]
    watcher = Watcher([str(p.source) for p in fetched] + [str(p.env) for p in fetched])
    watcher.start()
    report: dict = {}
    tasks = generate_tasks("swe", n=args.n, packages=specs, workers=args.workers, report=report)
    modifiers: dict[str, dict[str, int]] = {}
    for package in report.values():
        for name, counts in package.get("modifiers", {}).items():
            total = modifiers.setdefault(name, {"kept": 0, "tried": 0})
            total["kept"] += counts["kept"]
            total["tried"] += counts["tried"]
    test_seconds = sum(v.get("test_seconds", 0.0) for v in report.values())
    out.update({
        "tasks": len(tasks),
        "packages": {k: {f: v.get(f) for f in ("kept", "tried", "resumed", "baseline_passed", "test_seconds",
                                               "candidates", "candidates_seconds")} for k, v in report.items()},
        "packages_with_tasks": sum(1 for v in report.values() if v.get("kept")),
        "kept_tried_per_modifier": modifiers,
        "seconds_per_validated_task": round(test_seconds / max(1, sum(v.get("kept", 0) for v in report.values())),
                                            1),
        "generation_workers": args.workers,
        "generation_wall_s": round(time.monotonic() - started, 1)})
    save(args.partial, out)
    print(json.dumps({"generation": out}), file=sys.stderr, flush=True)

    step = max(1, len(tasks) // max(1, args.sample))
    sample = tasks[::step][: args.sample]  # spread over the packages
    out.update({"sample": len(sample), "fix_through_tools": {"resolved": 0, "played": 0},
                "empty_submission": {"resolved": 0, "played": 0}, "test_run_seconds": []})
    env = make_env("swe")
    try:
        for task in sample:
            total, last, _ = play_episode(env, task)
            fixed = out["fix_through_tools"]
            fixed["played"] += 1
            fixed["resolved"] += total == 1.0
            out["test_run_seconds"].append(last.info.get("test_seconds"))
            env.reset(task)
            empty = env.step(Action(tool="submit"))
            out["empty_submission"]["played"] += 1
            out["empty_submission"]["resolved"] += empty.reward == 1.0
            summarise(out)
            save(args.partial, out)
            print(json.dumps({"task": task.id, "fix": last.info.get("fail_to_pass"), "fixed": total == 1.0,
                              "empty_resolved": empty.reward == 1.0, "test_seconds": last.info.get("test_seconds"),
                              "at_s": round(time.monotonic() - started)}), file=sys.stderr, flush=True)
    finally:
        env.close()
    collect(args, sample, out)
    return watcher


def summarise(out: dict) -> None:
    """The rates and the mean test-run time from the counts so far."""
    for name in ("fix_through_tools", "empty_submission", "collect_expert"):
        counts = out.get(name)
        if counts:
            out[f"{name}_resolved"] = round(counts["resolved"] / max(1, counts["played"]), 3)
    runs = [s for s in out.get("test_run_seconds", []) if s is not None]
    out["test_run_seconds_per_episode"] = round(sum(runs) / max(1, len(runs)), 2)


def collect(args, sample: list, out: dict) -> None:
    """The scripted expert through `omrl collect`, `--concurrency` episodes in flight; rates over the sample."""
    from click.testing import CliRunner

    from omrl.cli.main import cli
    from omrl.store import Store
    from omrl.tasks import write_tasks

    with tempfile.TemporaryDirectory(prefix="swe-bench-") as tmp:
        tasks_file = Path(tmp) / "swe.parquet"
        write_tasks(sample, tasks_file)
        if args.out:
            write_tasks(sample, args.out)
        start = time.monotonic()
        result = None
        try:
            result = CliRunner().invoke(cli, ["collect", "--env", "swe", "--tasks", str(tasks_file), "--policy",
                                              "scripted", "--store", f"{tmp}/store", "--concurrency",
                                              str(args.concurrency), "--no-progress", "--max-turns", "10"])
        finally:
            collect_s = time.monotonic() - start
            rows = Store(f"{tmp}/store").read().to_pylist() if (Path(tmp) / "store").exists() else []
            out["collect_expert"] = {"resolved": sum(bool(r["success"]) for r in rows), "played": len(sample),
                                     "stored": len(rows),
                                     "statuses": {s: sum(r["status"] == s for r in rows)
                                                  for s in sorted({r["status"] for r in rows})}}
            out["collect_exit_code"] = None if result is None else result.exit_code
            if result is not None and result.exit_code != 0:
                out["collect_output"] = result.output[-500:]
            out["episodes_per_s_at_8"] = round(len(rows) / collect_s, 3) if rows else None
            out["collect_s"], out["collect_concurrency"] = round(collect_s, 1), args.concurrency
            summarise(out)
            save(args.partial, out)


if __name__ == "__main__":
    main()
