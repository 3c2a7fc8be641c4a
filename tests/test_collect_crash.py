"""Crash test: `omrl collect` killed with SIGKILL mid-run, then run again, ends with every episode exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_agent import CountEnv, count_tasks

from omrl.store import Store

TESTS = Path(__file__).resolve().parent


def collect_command(tasks_file: Path, store: Path) -> list[str]:
    # The slow counting env of test_agent.py, loaded by class path like any user environment.
    return [sys.executable, "-c", "from omrl.cli.main import cli; cli()", "collect",
            "--env", "test_agent:CountEnv", "--env-option", "step_sleep=0.05", "--tasks", str(tasks_file),
            "--policy", "scripted", "--store", str(store), "--samples", "2", "--concurrency", "4",
            "--batch-size", "2", "--run", "crash", "--no-progress"]


def test_sigkill_mid_run_then_resume_gives_each_episode_once(tmp_path: Path):
    tasks = count_tasks(20, target=2)
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t.to_row()) + "\n" for t in tasks))
    store_path = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    parts = store_path / "data" / "trajectories"

    proc = subprocess.Popen(collect_command(tasks_file, store_path), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while len(list(parts.glob("part-*.parquet"))) < 2:  # some batches written: the run is under way
            assert proc.poll() is None, f"collect ended before it was killed: {proc.stdout.read().decode()}"
            assert time.monotonic() < deadline, "collect wrote nothing within 60 s"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    killed_at = Store(store_path).count()
    assert 0 < killed_at < 40  # killed mid-run: some episodes stored, not all

    done = subprocess.run(collect_command(tasks_file, store_path), env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{40 - killed_at} played, {killed_at} already stored" in " ".join(done.stdout.split())

    store = Store(store_path)
    assert store.check() == []
    rows = store.read(columns=["id", "task_id", "sample", "status"]).to_pylist()
    assert len(rows) == 40 and len({r["id"] for r in rows}) == 40
    assert {(r["task_id"], r["sample"]) for r in rows} == {(t.id, s) for t in tasks for s in (0, 1)}
    assert {r["status"] for r in rows} == {"ok"}


class MarkedCountEnv(CountEnv):
    """CountEnv that appends a line to the file `mark` as each episode ends: the test sees episodes finish."""

    def __init__(self, mark: str, **options):
        super().__init__(**options)
        self.mark = mark

    def step(self, action):
        result = super().step(action)
        if result.done:
            with open(self.mark, "a") as f:
                f.write(f"{self.task.id}\n")
        return result


def test_ctrl_c_writes_the_finished_episodes_and_says_so(tmp_path: Path):
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t.to_row()) + "\n" for t in count_tasks(20, target=2)))
    store_path, mark = tmp_path / "store", tmp_path / "finished.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    # batch 64 > the 40 episodes: before the interrupt nothing has been appended, so what is kept comes from it
    command = [sys.executable, "-c", "from omrl.cli.main import cli; cli()", "collect",
               "--env", "test_collect_crash:MarkedCountEnv", "--env-option", f"mark={mark}",
               "--env-option", "step_sleep=0.1", "--tasks", str(tasks_file), "--policy", "scripted",
               "--store", str(store_path), "--samples", "2", "--concurrency", "2", "--run", "sigint", "--no-progress"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not mark.exists() or len(mark.read_text().splitlines()) < 2:
            assert proc.poll() is None, f"collect ended before it was interrupted: {proc.stdout.read()}"
            assert time.monotonic() < deadline, "no episode finished within 60 s"
            time.sleep(0.02)
        time.sleep(0.2)  # the finished episodes' rows are handed to the writer
        assert not list((store_path / "data" / "trajectories").glob("part-*.parquet"))  # nothing appended yet
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, output
    kept = Store(store_path).count()
    assert 2 <= kept < 40, output
    summary = [line for line in output.splitlines() if line.startswith("interrupted:")]
    assert summary == [f"interrupted: run sigint round 0: {kept} played, {kept} written to {store_path}; "
                       "run the same command again to play the rest"], output
    assert Store(store_path).check() == []
