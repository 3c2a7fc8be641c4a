"""Rejection-sampling fine-tuning end to end: collect with the model on the grid env, keep the best of each
group above the threshold, SFT on them."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

from tests.train_helpers import random_mover_model  # noqa: E402

pytestmark = pytest.mark.slow  # each test collects and trains a tiny model


def _params(path):
    from transformers import AutoModelForCausalLM

    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


def test_rft_keeps_the_best_of_each_group_above_the_threshold_and_trains(tmp_path):
    from omrl.envs.grid import grid_tasks
    from omrl.store import Store
    from omrl.tasks import write_tasks
    from omrl.train.algorithms.rft import train_rft

    model = random_mover_model(tmp_path / "mover")  # answers a random move: rewards vary within a group
    tasks = [t for t in grid_tasks(100, seed=2)
             if sum(abs(a - b) for a, b in zip(t.payload["start"], t.payload["goal"], strict=True)) == 2][:8]
    tasks_file = write_tasks(tasks, tmp_path / "tasks.parquet")
    result = train_rft({"model": str(model), "tasks": str(tasks_file), "output_dir": str(tmp_path / "rft"),
                        "rollout": {"env": "grid", "max_turns": 4, "max_new_tokens": 4}, "samples": 12, "threshold": 0.5,
                        "keep_per_group": 1, "seed": 0,
                        "sft": {"epochs": 1, "batch_size": 4, "learning_rate": 1e-2, "quiet": True,
                                "logging_steps": 1}})

    attempts = Store(tmp_path / "rft" / "store")
    assert attempts.count() == result.rollouts["attempts"] == 8 * 12
    groups = attempts.sql("SELECT group_id, max_reward FROM groups WHERE run_id = 'rft'").to_pylist()
    assert len(groups) == 8
    passing = [g for g in groups if g["max_reward"] >= 0.5]
    assert passing  # the random mover solves some tasks (sampling is not seeded: a group of 12 fails ~1/3)
    # One kept per group whose best attempt reached the threshold; every other attempt dropped with a reason.
    assert result.rollouts["kept"] == len(passing)
    below = {"min_reward": 8 - len(passing)} if len(passing) < 8 else {}
    assert result.rollouts["dropped"] == {"best_of_n": 8 * 11, **below}
    kept = Store(tmp_path / "rft" / "kept")
    best = {g["group_id"]: g["max_reward"] for g in passing}
    rows = kept.sql("SELECT id, group_id, reward FROM trajectories").to_pylist()
    assert sorted(r["group_id"] for r in rows) == sorted(best)
    assert all(r["reward"] == best[r["group_id"]] for r in rows)

    before, after = _params(model), _params(result.checkpoint)
    assert any(not before[k].equal(after[k]) for k in before)  # SFT on the kept attempts moved the weights
    record = json.loads((tmp_path / "rft" / "omrl_rft.json").read_text())
    assert record["kept"] == result.rollouts["kept"] and record["attempts"] == 96
    sft = json.loads((result.checkpoint / "omrl_sft.json").read_text())
    # the kept attempts carry the ids the policy sampled: one example per turn, trained from those ids
    turns = sum(r["num_turns"] for r in kept.sql("SELECT num_turns FROM trajectories").to_pylist())
    assert sft["bridge"]["examples"] == sft["bridge"]["turns_from_stored_ids"] == turns


def test_rft_with_a_reward_recipe_annotates_the_attempts_with_its_judge_and_keeps_the_judges_best(tmp_path):
    from omrl.envs.grid import grid_tasks
    from omrl.store import Store
    from omrl.tasks import write_tasks
    from omrl.testing.judge_server import JudgeProcess
    from omrl.train.algorithms.rft import train_rft

    model = random_mover_model(tmp_path / "mover")
    tasks_file = write_tasks(grid_tasks(4, seed=3), tmp_path / "tasks.parquet")
    with JudgeProcess(rule="length") as judge:  # shorter trajectories score higher: not the env's ranking
        reward = {"components": {"env_reward": 0.0, "judge:q:group": {"weight": 1.0, "scale": [0, 1]}},
                  "judges": [{"rubric": {"name": "q", "criteria": ["short"]}, "model": "rule-judge",
                              "base_url": judge.base_url, "mode": "group"}]}
        result = train_rft({"model": str(model), "tasks": str(tasks_file), "output_dir": str(tmp_path / "rft"),
                            "rollout": {"env": "grid", "max_turns": 4, "max_new_tokens": 4}, "samples": 4,
                            "threshold": 0.0, "keep_per_group": 1, "reward_recipe": reward,
                            "sft": {"epochs": 1, "batch_size": 4, "quiet": True}})
        assert judge.stats()["requests"] == 4  # one call per task's group of 4
    attempts = Store(tmp_path / "rft" / "store")
    scores = {r["trajectory_id"]: r["score"] for r in attempts.sql(
        "SELECT trajectory_id, score FROM annotations WHERE annotator = 'judge:q:group' AND status = 'ok'").to_pylist()}
    combined = {r["trajectory_id"]: r["score"] for r in attempts.sql(
        "SELECT trajectory_id, score FROM annotations WHERE annotator = 'reward'").to_pylist()}
    assert len(scores) == len(combined) == 16 and combined == pytest.approx(scores)
    groups = {}
    for r in attempts.sql("SELECT id, group_id FROM trajectories").to_pylist():
        groups.setdefault(r["group_id"], []).append(r["id"])
    kept = Store(tmp_path / "rft" / "kept").sql("SELECT id, group_id FROM trajectories").to_pylist()
    assert result.rollouts["kept"] == len(kept) == 4
    for row in kept:  # the judge's best of its group (ties: any of the best)
        assert scores[row["id"]] == max(scores[i] for i in groups[row["group_id"]])
    record = json.loads((tmp_path / "rft" / "omrl_rft.json").read_text())
    assert record["judge"]["calls"] == 4
