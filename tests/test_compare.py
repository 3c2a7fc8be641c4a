"""omrl.study.compare.Comparison shared by several processes (a study resumed beside a running one): a run
claimed by a live process is waited for, not run twice; a dead process's claim is taken over; every process's
records are kept in the one state file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from omrl.study.compare import Comparison

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "textworld_coin.yaml"


def _bench(out: Path) -> Comparison:
    return Comparison(out, RECIPE, [], [0], [])


def _state(out: Path) -> dict:
    return {s["stage"]: s for s in json.loads((out / "benchmark_state.json").read_text())["stages"]}


def test_two_comparisons_on_one_folder_keep_each_others_records(tmp_path):
    first, second = _bench(tmp_path), _bench(tmp_path)  # as two processes: each read the state when it started
    first.record("seed0/train/a", lambda: {"value": 1})
    second.record("seed0/train/b", lambda: {"value": 2})
    assert {k: v["value"] for k, v in _state(tmp_path).items()} == {"seed0/train/a": 1, "seed0/train/b": 2}
    # a record another process made is found, not made again
    assert first.record("seed0/train/b", lambda: {"value": 3})["value"] == 2


def test_a_run_claimed_by_a_live_process_is_awaited_and_a_dead_ones_claim_taken_over(tmp_path):
    bench = _bench(tmp_path)
    holder = textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from omrl.train.iterate.state import IterateState
        claim = Path({str(tmp_path)!r}) / "claims" / "seed0__train__x.pid"
        claim.parent.mkdir(parents=True, exist_ok=True)
        claim.write_text(str(os.getpid()))
        print("claimed", flush=True)
        time.sleep(3)
        IterateState(Path({str(tmp_path)!r}) / "benchmark_state.json").finish("seed0/train/x", value="theirs")
        claim.unlink()
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        assert proc.stdout.readline().strip() == "claimed"

        def ours():
            raise AssertionError("the run was claimed by another process: it must not run here too")

        assert bench.record("seed0/train/x", ours)["value"] == "theirs"
    finally:
        proc.wait(timeout=60)
    # a claim whose process is gone: this process runs it
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "claims" / "seed0__train__y.pid").write_text(dead.stdout.strip())
    assert bench.record("seed0/train/y", lambda: {"value": "ours"})["value"] == "ours"
    assert not (tmp_path / "claims" / "seed0__train__y.pid").exists()


def test_a_folder_recorded_with_another_recipe_is_refused_naming_the_change(tmp_path):
    import pytest

    from omrl.errors import UsageError

    _bench(tmp_path).record("seed0/train/a", lambda: {"value": 1})
    # the same recipe, or one that differs only in how fast or loud a run is, resumes
    Comparison(tmp_path, RECIPE, ["rollout.concurrency=4", "grpo.quiet=false", "threads=2"], [0], [])
    with pytest.raises(UsageError, match=r"grpo\.learning_rate: 0\.0005 -> 0\.001.*new output folder"):
        Comparison(tmp_path, RECIPE, ["grpo.learning_rate=0.001"], [0], [])
    with pytest.raises(UsageError, match=r"rollout\.env_options\.show_tried: \(not set\) -> True"):
        Comparison(tmp_path, RECIPE, ["rollout.env_options.show_tried=true"], [0], [])
    # a seed added later is recorded, not refused; the records are kept
    Comparison(tmp_path, RECIPE, [], [0, 1], [])
    state = json.loads((tmp_path / "benchmark_state.json").read_text())
    assert {"recipe-seed0", "recipe-seed1"} <= set(state) and state["recipe-seed1"]["seed"] == 1
    assert [s["stage"] for s in state["stages"]] == ["seed0/train/a"]
