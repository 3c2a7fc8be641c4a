"""Kill loops: run an omrl command, SIGKILL it at a random moment, look at the store, repeat, then let it finish.

Each scenario prepares its inputs, runs once uninterrupted in a scratch folder (the expected result and
the duration that the kill moments are drawn from), then in a fresh folder is killed `kills` times and
finally run to completion. Counted:

- `lost`: expected keys (trajectory ids, or (trajectory, annotator) pairs) missing at the end;
- `duplicated`: rows beyond the first for any key, the most seen after any kill or at the end;
- `partial`: observations of a derived store (filter output) present but incomplete, or of a dataset
  card listing other rows than the store's readers see;
- `kills_in_write_phase`: kills that landed after the command had written its first byte of part data
  (a part, a part's temporary or side file, anywhere under the work folder), seen by comparing those
  files before the start and after the kill. Kills are drawn from that phase: the command is watched until
  its first write, then killed a random share of the calibrated write phase later.

Used by tests/test_chaos.py (small) and benchmarks/chaos.py (large). Commands run as `python -m omrl`.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from omrl.store import Store, StoreError
from omrl.testing.synthetic import synthetic_trajectories

COMMAND_TIMEOUT_S = 300


@dataclass
class Observation:
    keys: list[Any]  # one entry per stored row: duplicates show as repeats
    partial: str | None = None  # why the output is visibly incomplete or inconsistent, if it is


@dataclass
class Scenario:
    """One command under test: inputs, the command line, what the output holds now."""

    name: str
    prepare: Callable[[Path], None]
    argv: Callable[[Path], list[str]]
    observe: Callable[..., Observation]  # (workdir, final=False): what the output holds now
    finished: Callable[[Path], bool] = lambda work: False  # True: a rerun would refuse (output complete)
    progress_hidden: bool = False  # the output shows no progress until the command is done (compact)
    output: tuple[str, str] = ("store", "trajectories")  # where progress shows: folder in the workdir, table


@dataclass
class ChaosResult:
    scenario: str
    kills: int = 0
    finished_before_kill: int = 0
    lost: int = 0
    duplicated: int = 0
    partial: int = 0
    expected: int = 0
    kills_in_write_phase: int = 0
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "kills": self.kills, "finished_before_kill": self.finished_before_kill,
                "lost": self.lost, "duplicated": self.duplicated, "partial": self.partial,
                "expected": self.expected, "kills_in_write_phase": self.kills_in_write_phase,
                "errors": self.errors}


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omrl", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, env=_env())


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "COLUMNS": "200"})
    return env


def _extra_rows(keys: list[Any]) -> int:
    return sum(n - 1 for n in Counter(keys).values() if n > 1)


def run_scenario(scenario: Scenario, workdir: Path, kills: int, seed: int = 0, max_rounds: int | None = None) -> ChaosResult:
    """Calibrate, then kill the command `kills` times, each at a random moment of the work it has left.

    A kill lands in the command's write phase: after its first byte of part data, before the time the
    calibration run took to write. When the work is done before all kills are spent (a resumed run
    finishes quickly), a new round starts from fresh inputs; every round ends with an uninterrupted
    run, after which nothing may be lost, doubled or half-made.
    """
    rng = random.Random(seed)
    result = ChaosResult(scenario.name)
    calibration = workdir / f"{scenario.name}-calibration"
    calibration.mkdir(parents=True)
    scenario.prepare(calibration)
    write_start, duration, done = _timed_run(scenario.argv(calibration), calibration)
    if done.returncode != 0:
        raise RuntimeError(f"{scenario.name}: the uninterrupted run failed:\n{done.stdout}\n{done.stderr}")
    expected = set(scenario.observe(calibration).keys)
    result.expected = len(expected)
    write_s = max(duration - (duration if write_start is None else write_start), 0.05)

    for round_index in range(max_rounds or 3 * max(kills, 1)):
        if result.kills >= kills:
            break
        work = workdir / f"{scenario.name}-killed-{round_index}"
        work.mkdir(parents=True)
        scenario.prepare(work)
        _kill_round(scenario, work, expected, kills - result.kills, rng, write_s, result)
        if not scenario.finished(work):
            final = _run(scenario.argv(work), work)
            if final.returncode != 0:
                result.errors.append(f"final run failed: {final.stdout[-300:]} {final.stderr[-500:]}")
        seen = scenario.observe(work, final=True)
        result.duplicated = max(result.duplicated, _extra_rows(seen.keys))
        result.lost += len(expected - set(seen.keys))
        if seen.partial:
            result.partial += 1
            result.errors.append(f"at the end of round {round_index}: {seen.partial}")
    return result


def _part_files(work: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under `work` whose path names a part (parts, their temporaries, side
    files and search indexes, in stores and staging folders alike): what a command's write phase changes."""
    out = {}
    for folder, _, names in os.walk(work):
        for name in names:
            path = os.path.join(folder, name)
            if "part-" not in path[len(str(work)):]:
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue  # removed since the listing
            out[path] = (st.st_size, st.st_mtime_ns)
    return out


def _timed_run(argv: list[str], cwd: Path) -> tuple[float | None, float, subprocess.CompletedProcess]:
    """Run a command to its end, watching its part files: (seconds to its first write, or None when it
    wrote none; seconds in all; the finished process)."""
    before = _part_files(cwd)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:  # files: a full pipe would block it
        started = time.monotonic()
        process = subprocess.Popen([sys.executable, "-m", "omrl", *argv], cwd=cwd, stdout=out, stderr=err, env=_env())
        first_write = None
        while process.poll() is None:
            if first_write is None and _part_files(cwd) != before:
                first_write = time.monotonic() - started
            if time.monotonic() - started > COMMAND_TIMEOUT_S:
                process.kill()
            time.sleep(0.005)
        duration = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        return first_write, duration, subprocess.CompletedProcess(
            argv, process.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def _kill_round(scenario: Scenario, work: Path, expected: set[Any], kills: int, rng: random.Random,
                write_s: float, result: ChaosResult) -> None:
    """Start and kill the command in `work` until `kills` are spent or its work is done."""
    for _ in range(kills):
        if scenario.finished(work) or (not scenario.progress_hidden and _share(scenario, work, expected) == 1.0):
            return  # the work is done: a later kill would only hit start-up
        before = _part_files(work)
        process = subprocess.Popen([sys.executable, "-m", "omrl", *scenario.argv(work)], cwd=work,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(),
                                   start_new_session=True)
        killed = _wait_for_kill_moment(process, scenario, work, expected, rng, write_s, before)
        if killed:
            os.killpg(process.pid, signal.SIGKILL)
            result.kills += 1
        else:
            result.finished_before_kill += 1
        _, stderr = process.communicate()
        if killed and _part_files(work) != before:
            result.kills_in_write_phase += 1
        if process.returncode not in (0, -signal.SIGKILL):
            result.errors.append(f"exit {process.returncode}: {stderr.decode(errors='replace')[-500:]}")
        seen = scenario.observe(work)
        result.duplicated = max(result.duplicated, _extra_rows(seen.keys))
        if seen.partial:
            result.partial += 1
            result.errors.append(f"after a kill: {seen.partial}")
        if not killed:
            return  # finished by itself: this round's work is done


def _share(scenario: Scenario, work: Path, expected: set[Any]) -> float:
    """The share of the expected keys stored so far."""
    return len(expected & set(scenario.observe(work).keys)) / max(1, len(expected))


class _RowCounter:
    """Rows in the scenario's output table, from part footers read once each (cheap enough to poll)."""

    def __init__(self, path: Path, table: str):
        self.path, self.table, self.store = path, table, None

    def __call__(self) -> int:
        if self.store is None:
            try:
                self.store = Store(self.path)
            except StoreError:
                return 0
        try:
            return self.store.count(self.table)
        except OSError:  # a part vanished between listing and reading twice over: try again next poll
            return 0


def _wait_for_kill_moment(process: subprocess.Popen, scenario: Scenario, work: Path, expected: set[Any],
                          rng: random.Random, write_s: float, before: dict[str, tuple[int, int]]) -> bool:
    """Wait for a random moment of the run's write phase; False when the command finished first.

    Where the output shows progress, the moment is a random share of the work left (so kills also land
    in later stages of a resumed run however fast or slow the machine is today); elsewhere it is a random
    time within the calibrated write phase, counted from the command's first write of part data (its
    start-up and reading of inputs are no place to test a commit).
    """
    if scenario.progress_hidden:
        while process.poll() is None and _part_files(work) == before:
            time.sleep(0.005)
        deadline = time.monotonic() + rng.uniform(0.0, 0.95) * write_s
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
    else:
        subpath, table = scenario.output
        rows = _RowCounter(work / subpath, table)
        total = len(expected)
        done = rows()
        target = done + rng.uniform(0.02, 0.9) * max(0, total - done)
        while process.poll() is None and rows() < target:
            time.sleep(rng.uniform(0.0, 0.03))
    return process.poll() is None


# ---------------------------------------------------------------- observations


def _card_ids(store: Store) -> tuple[list[str], list[str]]:
    """(ids, missing part names): the trajectory ids a `datasets.load_dataset(store)` would return, read
    from the parts the card lists (globs expanded as `datasets` does), and listed parts that do not exist."""
    card = (store.path / "README.md").read_text(encoding="utf-8")
    block = card.split("config_name: annotations")[0]
    folder = store.path / "data" / "trajectories"
    ids: list[str] = []
    missing: list[str] = []
    for name in re.findall(r"data/trajectories/(part-[^\s]+\.parquet)", block):
        for path in sorted(folder.glob(name)) if "*" in name else [folder / name]:
            if not path.is_file():
                missing.append(path.name)
                continue
            ids += pq.read_table(path, columns=["id"]).column("id").to_pylist()
    return ids, missing


def observe_trajectories(path: Path, *, card: bool = True, exclude_source: str | None = None,
                         final: bool = False) -> Observation:
    """Every trajectory id of the store at `path` (none when it does not exist yet).

    The dataset card must never list more rows than the store's readers see, nor any twice. Right
    after a kill it may lack the newest part (the append was renamed in, the card not yet rewritten:
    the next writer or `omrl store check --repair` rewrites it); at the end it must list exactly them.
    """
    try:
        store = Store(path)
    except StoreError:
        return Observation([])
    table = store.read(columns=["id", "source"])
    ids = [i for i, s in zip(table.column("id").to_pylist(), table.column("source").to_pylist(), strict=True)
           if exclude_source is None or s != exclude_source]
    partial = None
    if card:
        card_ids, missing = _card_ids(store)
        listed, everything = Counter(card_ids), Counter(table.column("id").to_pylist())
        if missing:
            partial = f"the dataset card lists {len(missing)} part(s) that do not exist (load_dataset fails)"
        elif listed - everything or any(n > 1 for n in listed.values()):
            partial = f"the dataset card lists rows the store does not hold, or twice ({sum(listed.values())} rows)"
        elif everything - listed and final:
            partial = f"the dataset card lists {sum(listed.values())} rows, the store holds {sum(everything.values())}"
    return Observation(ids, partial)


def observe_annotations(path: Path) -> Observation:
    """(trajectory_id, annotator) of every ok annotation."""
    try:
        store = Store(path)
    except StoreError:
        return Observation([])
    data = store.read("annotations", columns=["trajectory_id", "annotator", "status"]).to_pylist()
    return Observation([(r["trajectory_id"], r["annotator"]) for r in data if r["status"] == "ok"])


def _write_source_store(path: Path, n: int, parts: int = 1) -> None:
    store = Store.create(path)
    rows = [dict(r, success=(i % 3 != 0)) for i, r in enumerate(synthetic_trajectories(n, seed=1))]
    step = max(1, -(-len(rows) // parts))
    for start in range(0, len(rows), step):
        store.append(rows[start:start + step])
    store.append([{"trajectory_id": r["id"], "annotator": "len", "score": float(len(r["messages"]))}
                  for r in rows], table="annotations")


# ---------------------------------------------------------------- scenarios


def collect_scenario(tasks: int = 1000, samples: int = 4) -> Scenario:
    def prepare(work: Path) -> None:
        from omrl.tasks import shipped_datasets_dir

        lines = (shipped_datasets_dir() / "tasks" / "grid_train.jsonl").read_text().splitlines()[:tasks]
        (work / "tasks.jsonl").write_text("\n".join(lines) + "\n")

    return Scenario("collect", prepare, lambda w: [
        "collect", "--env", "grid", "--tasks", str(w / "tasks.jsonl"), "--policy", "scripted", "--store",
        str(w / "store"), "-n", str(samples), "--batch-size", "16", "--run", "chaos", "--concurrency", "8"],
        lambda w, final=False: observe_trajectories(w / "store", final=final))


def append_scenario(rows: int = 5000) -> Scenario:
    def prepare(work: Path) -> None:
        with open(work / "rows.jsonl", "w") as f:
            for row in synthetic_trajectories(rows, seed=2):
                f.write(json.dumps(row, default=str) + "\n")

    return Scenario("append", prepare, lambda w: ["store", "append", str(w / "store"), str(w / "rows.jsonl"),
                                                  "--skip-existing"],
                    lambda w, final=False: observe_trajectories(w / "store", final=final),
                    progress_hidden=True)  # one part: nothing shows until the commit


def import_scenario(records: int = 3000) -> Scenario:
    def prepare(work: Path) -> None:
        with open(work / "chats.jsonl", "w") as f:
            for i in range(records):
                f.write(json.dumps({"id": f"chat-{i}", "conversations": [
                    {"from": "human", "value": f"What is {i} + 1? " + "context " * 40},
                    {"from": "gpt", "value": f"It is {i + 1}."}]}) + "\n")

    return Scenario("import", prepare, lambda w: ["import", str(w / "chats.jsonl"), "--store", str(w / "store"),
                                                  "--format", "sharegpt"],
                    lambda w, final=False: observe_trajectories(w / "store", final=final),
                    progress_hidden=True)  # one part per file


def filter_scenario(rows: int = 6000) -> Scenario:
    def observe(work: Path, final: bool = False) -> Observation:
        out = work / "out"
        seen = observe_trajectories(out, final=final)
        if not out.exists():
            return seen
        annotations = Store(out).count("annotations")
        if annotations != len(seen.keys):  # every kept row has exactly one annotation in the source
            return Observation(seen.keys, f"filter output holds {len(seen.keys)} rows but {annotations} annotations")
        return seen

    return Scenario("filter", lambda w: _write_source_store(w / "source", rows),
                    lambda w: ["filter", str(w / "source"), "--out", str(w / "out"), "--success"],
                    observe, finished=lambda w: (w / "out" / "omrl.json").is_file(), progress_hidden=True)


def compact_scenario(rows: int = 6000, parts: int = 60) -> Scenario:
    return Scenario("compact", lambda w: _write_source_store(w / "store", rows, parts),
                    lambda w: ["store", "compact", str(w / "store")],
                    lambda w, final=False: observe_trajectories(w / "store", final=final),
                    progress_hidden=True)


def annotate_scenario(rows: int = 4000) -> Scenario:
    return Scenario("annotate", lambda w: _write_source_store(w / "store", rows),
                    lambda w: ["annotate", str(w / "store"), "--metric", "num_turns", "--metric", "tool_error_rate"],
                    lambda w, final=False: observe_annotations(w / "store"), output=("store", "annotations"))


def iterate_scenario() -> Scenario:
    """Two tiny GRPO rounds; GRPO's own rollouts are left out of `lost` (a resumed step stores a new attempt)."""
    def prepare(work: Path) -> None:
        from omrl.models.tiny import cached_tiny_model
        from omrl.tasks import shipped_datasets_dir

        tasks = shipped_datasets_dir() / "tasks"
        recipe = {
            "output_dir": str(work / "run"), "model": str(cached_tiny_model(hidden=32)),
            "train_tasks": str(tasks / "grid_train.jsonl"), "eval_tasks": str(tasks / "grid_eval.jsonl"),
            "rounds": 2, "rollout": {"env": "grid", "max_turns": 4, "max_new_tokens": 4},
            "demos": {"tasks": 16, "only_success": False},
            "sft": {"max_steps": 2, "batch_size": 4, "quiet": True},
            "collect": {"tasks": 16, "samples": 2},
            "grpo": {"max_steps": 2, "tasks_per_step": 2, "samples_per_task": 2, "warmup_steps": 0,
                     "quiet": True, "logging_steps": 1},
            "eval": {"tasks": 16, "samples": 1, "greedy": False},
        }
        (work / "recipe.yaml").write_text(json.dumps(recipe))  # JSON is YAML

    return Scenario("iterate", prepare, lambda w: ["train", "iterate", "--recipe", str(w / "recipe.yaml")],
                    lambda w, final=False: observe_trajectories(w / "run" / "store", exclude_source="collected:grpo",
                                                          final=final),
                    output=("run/store", "trajectories"))  # a finished run re-run is a no-op: no `finished`


SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "collect": collect_scenario, "append": append_scenario, "import": import_scenario, "filter": filter_scenario,
    "compact": compact_scenario, "annotate": annotate_scenario, "iterate": iterate_scenario,
}
