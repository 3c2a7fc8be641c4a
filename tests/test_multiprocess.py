"""SFT and PPO with two CPU processes (gloo) through torchrun: the multi-GPU/multi-node path, proved on a CPU."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("trl")

from tests.train_helpers import demo_store  # noqa: E402

pytestmark = pytest.mark.slow  # each test trains in two processes


def test_two_process_sft_runs(tmp_path):
    from omrl.models.tiny import cached_tiny_model

    tiny = cached_tiny_model(hidden=32)
    store = demo_store(tmp_path / "s", n=16)
    omrl = shutil.which("omrl") or str(Path(sys.executable).parent / "omrl")
    out = tmp_path / "out"
    # torchrun is what `accelerate launch --multi_gpu` runs under the hood; on CPU the trainer picks gloo.
    # --standalone: torchrun picks a free port itself (a fixed port collided with other jobs on the machine).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           omrl, "train", "sft",
           f"model={tiny}", f"store={store.path}", f"output_dir={out}", "batch_size=2", "max_steps=2",
           "logging_steps=1", "quiet=true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((out / "omrl_sft.json").read_text())
    assert len(record["losses"]) == 2 and all(loss == loss and loss > 0 for loss in record["losses"])
    assert (out / "config.json").exists()
    assert record["world_size"] == 2  # both processes took part (gloo), rank 0 saved


def _grid_tasks(path):
    from omrl.envs.base import Task
    from omrl.tasks import write_tasks

    # goals one step away: a random mover succeeds often enough for nonzero returns in a 2-move budget
    tasks = [Task(id=f"g{x}", instruction="Reach the goal.", env="grid",
                  payload={"size": 7, "start": [x, 3], "goal": [x - 1, 3]}) for x in range(2, 7)]
    return write_tasks(tasks, path)


def test_two_process_ppo_matches_one_process(tmp_path):
    """`omrl train ppo` under torchrun (2 CPU processes, gloo): the step's batch is played once, split between
    the processes (each stores its own rows), both end with identical parameters, and the logged metrics and
    the gradient norm are those of the same recipe on one process (whole-batch means, averaged gradients)."""
    import torch
    from safetensors.torch import load_file

    from omrl.schema import trajectory_id
    from omrl.store import Store
    from omrl.train.algorithms.ppo import LOGGED, train_ppo
    from tests.train_helpers import random_mover_model

    model = random_mover_model(tmp_path / "mover")
    tasks = _grid_tasks(tmp_path / "tasks.jsonl")
    settings = {"model": str(model), "tasks": str(tasks), "max_steps": 1, "tasks_per_step": 4,
                "samples_per_task": 4, "ppo_epochs": 1, "minibatches": 1, "learning_rate": 1e-3,
                "entropy_coef": 0.01, "level": "token", "quiet": True,
                "rollout": {"env": "grid", "max_turns": 2, "max_new_tokens": 3, "seed": 0}}
    omrl = shutil.which("omrl") or str(Path(sys.executable).parent / "omrl")
    out, store = tmp_path / "two", tmp_path / "two-store"
    args = [f"{k}={v}" for k, v in settings.items() if k != "rollout"]
    args += [f"rollout.{k}={v}" for k, v in settings["rollout"].items()]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           omrl, "train", "ppo", *args, f"output_dir={out}", f"store={store}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((out / "omrl_ppo.json").read_text())
    digests = record["processes"]["parameter_sha256"]
    assert record["processes"]["count"] == 2 and len(digests) == 2 and digests[0] == digests[1]
    before, after = load_file(model / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the step moved the policy

    rows = Store(store).read().to_pylist()
    run_id = record["rollouts"]["run_prefix"] + "/step-00000"
    assert len(rows) == 16 == record["rollouts"]["stored"] and len({r["id"] for r in rows}) == 16
    by_task: dict[str, set[int]] = {}
    for r in rows:
        assert r["id"] == trajectory_id(run_id, 1, r["task_id"], r["sample"])
        by_task.setdefault(r["task_id"], set()).add(r["sample"])
    assert len(by_task) == 4 and all(samples == {0, 1, 2, 3} for samples in by_task.values())
    played_by = [json.loads(r["metadata"])["ppo_process"] for r in rows]
    assert played_by.count(0) == 8 and played_by.count(1) == 8  # each stored only its own share
    for r in rows:  # a task's samples were played by one process
        assert {json.loads(x["metadata"])["ppo_process"] for x in rows if x["task_id"] == r["task_id"]} == \
            {json.loads(r["metadata"])["ppo_process"]}

    one = train_ppo({**settings, "output_dir": str(tmp_path / "one"), "store": str(tmp_path / "one-store")})
    single = {r["id"]: r["reward"] for r in Store(tmp_path / "one-store").read().to_pylist()}
    assert single == {r["id"]: r["reward"] for r in rows}  # the same 16 episodes
    two, ref = record["log"][0], one.history[0]
    assert ref["reward"] > 0  # some episodes were rewarded: returns and value loss are not all zero
    for key in ("reward", "success", "trainable_tokens", "episodes", "failed", "updates"):
        assert two[key] == ref[key], key
    for key in (*[k for k in LOGGED if k != "kl_ref"], "grad_norm", "mean_return", "mean_value"):
        assert math.isfinite(two[key]) and two[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key


def test_two_process_ppo_goes_on_when_one_process_s_episodes_all_fail(tmp_path):
    """One of two tasks is broken (the environment refuses it), so one process's whole share fails: that
    process still joins every gradient all-reduce (with no weight), both end identical, failures are counted."""
    from omrl.envs.base import Task
    from omrl.store import Store
    from omrl.tasks import write_tasks
    from tests.train_helpers import random_mover_model

    model = random_mover_model(tmp_path / "mover")
    tasks = write_tasks([Task(id="ok", instruction="Reach the goal.", env="grid",
                              payload={"size": 7, "start": [3, 3], "goal": [2, 3]}),
                         Task(id="broken", instruction="Reach the goal.", env="grid", payload={"size": 7})],
                        tmp_path / "tasks.jsonl")
    omrl = shutil.which("omrl") or str(Path(sys.executable).parent / "omrl")
    out = tmp_path / "out"
    # tasks_per_step=2 draws both tasks; each process plays one task's 3 samples
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           omrl, "train", "ppo", f"model={model}", f"tasks={tasks}", f"output_dir={out}",
           f"store={tmp_path / 'store'}", "max_steps=2", "tasks_per_step=2", "samples_per_task=3",
           "minibatches=2", "ppo_epochs=1", "entropy_coef=0.01", "quiet=true", "rollout.env=grid",
           "rollout.max_turns=2", "rollout.max_new_tokens=3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((out / "omrl_ppo.json").read_text())
    digests = record["processes"]["parameter_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert [(e["episodes"], e["failed"]) for e in record["log"]] == [(6, 3), (6, 3)]
    assert all(e["updates"] == 2 and math.isfinite(e["policy_loss"]) for e in record["log"])
    rows = Store(tmp_path / "store").read().to_pylist()
    assert len(rows) == 12 == record["rollouts"]["stored"]
    assert sorted(r["status"] for r in rows if r["task_id"] == "broken") == ["env_error"] * 6
    assert record["rollouts"]["statuses"]["env_error"] == 6
