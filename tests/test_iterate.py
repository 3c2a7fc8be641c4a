"""Iterative rounds on the tiny model and the grid env: every stage recorded, a killed run resumes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from omrl.config import load_recipe  # noqa: E402
from omrl.store import Store  # noqa: E402

TASKS = Path(__file__).resolve().parents[1] / "datasets" / "tasks"


class Killed(RuntimeError):
    pass


def recipe(tmp_path, tiny):
    from omrl.train.config.iterate import IterateRecipe

    return load_recipe({
        "output_dir": str(tmp_path / "run"), "model": str(tiny), "train_tasks": str(TASKS / "grid_train.jsonl"),
        "eval_tasks": str(TASKS / "grid_eval.jsonl"), "rounds": 2,
        "rollout": {"env": "grid", "max_turns": 4, "max_new_tokens": 4},
        # only_success off: in 4 turns the noisy expert often fails every demo, leaving nothing to imitate
        "demos": {"tasks": 6, "only_success": False}, "sft": {"max_steps": 2, "batch_size": 4, "quiet": True},
        "collect": {"tasks": 4, "samples": 2},
        "grpo": {"max_steps": 1, "tasks_per_step": 2, "samples_per_task": 2, "warmup_steps": 0, "quiet": True,
                 "logging_steps": 1},
        "eval": {"tasks": 3, "samples": 1, "greedy": False},
    }, IterateRecipe)


@pytest.mark.slow
def test_iterate_records_stages_and_resumes_after_a_kill(tmp_path):
    from omrl.models.tiny import cached_tiny_model
    from omrl.train.iterate.run import run_iterate

    tiny = cached_tiny_model(hidden=32)
    config = recipe(tmp_path, tiny)

    def kill_after_round_1(stage, record):
        if stage == "grpo-1":
            raise Killed(stage)

    with pytest.raises(Killed):
        run_iterate(config, on_stage=kill_after_round_1)
    run = tmp_path / "run"
    state = json.loads((run / "state.json").read_text())
    assert [s["stage"] for s in state["stages"]] == ["base", "sft", "grpo-1"]
    first_ckpt = Path(state["stages"][2]["checkpoint"])
    stamp = (first_ckpt / "config.json").stat().st_mtime_ns
    store = Store(run / "store")
    rows_before = store.count()

    seen = []
    results = run_iterate(config, on_stage=lambda stage, record: seen.append(stage))
    assert seen == ["grpo-2"]  # finished stages are not redone
    assert (first_ckpt / "config.json").stat().st_mtime_ns == stamp
    assert [r["stage"] for r in results] == ["base", "sft", "grpo-1", "grpo-2"]
    assert json.loads((run / "results.json").read_text()) == results
    for r in results:
        assert 0.0 <= r["success"] <= 1.0 and r["tasks"] == 3 and r["mean_reward"] is not None
    # every round's data is in the store with its round number: collection, GRPO groups, evals
    by_round = {row["round"]: row["n"] for row in
                store.sql("SELECT round, count(*) AS n FROM trajectories GROUP BY round").to_pylist()}
    assert set(by_round) == {0, 1, 2} and store.count() > rows_before
    runs = {row["run_id"] for row in store.sql("SELECT DISTINCT run_id FROM trajectories WHERE round = 2")
            .to_pylist()}
    assert "round-2" in runs and any(r.startswith("eval-grpo-2") for r in runs) and len(runs) >= 3
    # the filter step is omrl.curate's filter_store: its selection is recorded like any filter's
    from omrl.curate.filters import filter_lineage

    lineage = filter_lineage(run / "round-2" / "informative")
    assert lineage["options"]["drop_flat_groups"] and lineage["sql"] == "run_id = 'round-2' AND round = 2"
    flat_rows = lineage["counts"]["dropped"].get("flat_group", 0)
    assert results[-1]["flat_groups"] * 2 == flat_rows  # 2 samples per group
    assert lineage["counts"]["kept"] + flat_rows == 4 * 2  # the round's collection: 4 tasks x 2 samples
    # started again with another recipe, it stops before any stage and names the change; the state is kept
    from omrl.errors import UsageError

    saved = (run / "state.json").read_text()
    other = dataclasses.replace(config, grpo=dataclasses.replace(config.grpo, learning_rate=0.123))
    with pytest.raises(UsageError, match=r"grpo\.learning_rate: .* -> 0\.123"):
        run_iterate(other)
    assert (run / "state.json").read_text() == saved
    # more rounds, or more threads, continue the run
    assert [r["stage"] for r in run_iterate(dataclasses.replace(config, rounds=2, threads=1))][-1] == "grpo-2"


def test_bad_nested_settings_are_named(tmp_path):
    from omrl.config import RecipeError
    from omrl.train.config.iterate import IterateRecipe

    base = {"output_dir": "x", "train_tasks": "a", "eval_tasks": "b"}
    with pytest.raises(RecipeError, match="unknown key sft.learning_rte"):
        load_recipe({**base, "sft": {"learning_rte": 1}}, IterateRecipe)
    with pytest.raises(RecipeError, match="unknown key grpo.model"):  # set by the iterate run itself
        load_recipe({**base, "grpo": {"model": "m"}}, IterateRecipe)
    with pytest.raises(RecipeError, match="collect.sample"):
        load_recipe({**base, "collect": {"sample": 3}}, IterateRecipe)
    with pytest.raises(RecipeError, match="unknown key grpo.learnin_rate"):
        load_recipe({**base, "grpo": {"learnin_rate": 1e-4}}, IterateRecipe)
    with pytest.raises(RecipeError, match="grpo.max_steps must be int"):
        load_recipe({**base, "grpo": {"max_steps": "many"}}, IterateRecipe)
    with pytest.raises(RecipeError, match="sft_best.batching must be one of bridge, trl, not 'fast'"):  # at load
        load_recipe({**base, "sft_best": {"batching": "fast"}}, IterateRecipe)


def test_sections_are_typed_and_rollout_settings_are_one_section(tmp_path):
    from omrl.config import RecipeError, describe
    from omrl.train.config.iterate import IterateRecipe, grpo_recipe

    base = {"output_dir": "x", "train_tasks": "a", "eval_tasks": "b"}
    new = load_recipe({**base, "rollout": {"env": "math", "max_turns": 4, "max_new_tokens": 6}},
                      IterateRecipe, ["rollout.temperature=0.5", "grpo.learning_rate=1e-4", "sft.epochs=3"])
    assert (new.rollout.env, new.rollout.max_turns, new.rollout.temperature) == ("math", 4, 0.5)
    assert new.rollout.concurrency == 64  # a section given in part keeps the recipe's defaults for the rest
    assert new.grpo.learning_rate == 1e-4 and new.grpo.samples_per_task == 8 and new.sft.epochs == 3
    keys = {k for k, _, _ in describe(IterateRecipe)}
    assert {"grpo.max_steps", "sft.lora.r", "sft_best.epochs", "rollout.max_turns"} <= keys
    grpo = grpo_recipe(new, {"model": "m", "tasks": "t", "output_dir": "o"}, round=2)
    assert grpo.rollout == dataclasses.replace(new.rollout, seed=new.rollout.seed + 2)
    assert grpo.seed == new.seed + 2 and grpo.learning_rate == 1e-4
    # The rollout knobs live in the rollout section only (the keys of the sections before it are refused).
    with pytest.raises(RecipeError, match="unknown key collect.max_turns"):
        load_recipe({**base, "collect": {"max_turns": 4}}, IterateRecipe)
    with pytest.raises(RecipeError, match="unknown key env"):
        load_recipe({**base, "env": "math"}, IterateRecipe)


def test_grpo_settings_are_converted_to_their_types():
    from omrl.config import from_dict
    from omrl.train.config.grpo import GRPORecipe

    # YAML 1.1 reads `1e-4` (no dot) as text: the recipe must still hand TRL a float.
    grpo = from_dict(GRPORecipe, {"model": "m", "tasks": "t", "output_dir": "o", "learning_rate": "1e-4",
                                 "max_steps": "5"})
    assert grpo.learning_rate == 1e-4 and isinstance(grpo.learning_rate, float) and grpo.max_steps == 5


@pytest.mark.slow
def test_iterate_with_a_judge_resumes_after_a_kill_in_annotate_without_re_judging(tmp_path):
    """collect -> annotate (the recipe's judge) -> filter -> GRPO (judged online); the run is SIGKILLed while
    the annotate stage is asking the judge (a real server in its own process); the restarted run asks it
    nothing it had answered, and every collected trajectory ends with one ok judge score."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from omrl.models.tiny import cached_tiny_model
    from omrl.testing.judge_server import JudgeProcess
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.run import run_iterate

    tiny = cached_tiny_model(hidden=32)
    with JudgeProcess(rule="grid", latency=0.3) as judge:
        values = {
            "output_dir": str(tmp_path / "run"), "model": str(tiny), "train_tasks": str(TASKS / "grid_train.jsonl"),
            "eval_tasks": str(TASKS / "grid_eval.jsonl"), "rounds": 1, "demos": {"enabled": False},
            "rollout": {"env": "grid", "max_turns": 3, "max_new_tokens": 4},
            "collect": {"tasks": 4, "samples": 2},
            "reward": {"components": {"env_reward": 0.0, "judge:grid_goal": {"weight": 1.0, "scale": [0, 10]}},
                       "missing": "renormalize",
                       "judges": [{"rubric": "recipes/judges/grid_goal.yaml", "model": "rule-judge",
                                   "base_url": judge.base_url, "concurrency": 1}]},
            "grpo": {"max_steps": 1, "tasks_per_step": 2, "samples_per_task": 2, "warmup_steps": 0, "quiet": True,
                     "logging_steps": 1},
            "eval": {"tasks": 2, "samples": 1, "greedy": False},
        }
        code = ("import json, sys\nfrom omrl.config import load_recipe\nfrom omrl.train.config.iterate import IterateRecipe\n"
                "from omrl.train.iterate.run import run_iterate\nrun_iterate(load_recipe(json.loads(sys.argv[1]), IterateRecipe))\n")
        proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(values)], cwd=Path(__file__).parents[1],
                                env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            while judge.stats()["requests"] < 3 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGKILL)  # mid-annotate: 8 trajectories at 0.3 s each, one at a time
        finally:
            proc.wait()
        asked = judge.stats()["requests"]
        assert 3 <= asked < 8, "the kill did not land inside the annotate stage"
        store = Store(tmp_path / "run" / "store")
        assert store.sql("SELECT count(*) AS n FROM trajectories WHERE source = 'collected:grpo'"
                         ).column("n")[0].as_py() == 0

        config = load_recipe(values, IterateRecipe)
        results = run_iterate(config)
        stats = judge.stats()
    assert [r["stage"] for r in results] == ["base", "grpo-1"]
    # At most the one request in flight at the kill is asked again; every answered one came from the cache.
    assert stats["repeated_prompts"] <= 1
    assert results[-1]["annotate"]["judge_cache_hits"] >= asked - 1
    collected = {r["id"] for r in store.sql("SELECT id FROM trajectories WHERE run_id = 'round-1'").to_pylist()}
    judged = store.sql("SELECT trajectory_id, metadata FROM annotations WHERE annotator = 'judge:grid_goal' "
                       "AND status = 'ok' AND run_id = 'annotate/round-1'").to_pylist()
    assert sorted(a["trajectory_id"] for a in judged) == sorted(collected) and len(collected) == 8
    assert all(json.loads(a["metadata"])["grpo_round"] == 1 for a in judged)
    # GRPO's own rollouts were judged online too, with their step.
    online = store.sql("SELECT metadata FROM annotations WHERE annotator = 'judge:grid_goal' AND "
                       "run_id LIKE 'grpo/%'").to_pylist()
    assert online and all(json.loads(a["metadata"])["grpo_step"] == 0 for a in online)


@pytest.mark.slow
def test_ppo_rounds_are_ppo_stages_and_bad_algorithms_are_refused(tmp_path):
    """algorithm: ppo runs its rounds as ppo-N stages, PPO rollouts stored with their round; a judged
    reward with ppo, or an unknown algorithm, is refused at load time."""
    from omrl.config import RecipeError
    from omrl.models.tiny import cached_tiny_model
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.run import run_iterate

    tiny = cached_tiny_model(hidden=32)
    config = dataclasses.replace(recipe(tmp_path, tiny), rounds=1, algorithm="ppo")
    config.ppo = dataclasses.replace(config.ppo, max_steps=1, tasks_per_step=2, samples_per_task=2, quiet=True)
    results = run_iterate(config)
    assert [r["stage"] for r in results] == ["base", "sft", "ppo-1"]
    store = Store(tmp_path / "run" / "store")
    ppo_rows = store.sql("SELECT count(*) AS n FROM trajectories WHERE source = 'collected:ppo' AND round = 1")
    assert ppo_rows.to_pylist()[0]["n"] == 4  # 1 step x 2 tasks x 2 samples
    assert (tmp_path / "run" / "round-1" / "ppo" / "omrl_ppo.json").exists()
    base = {"output_dir": str(tmp_path / "x"), "train_tasks": "t.jsonl", "eval_tasks": "e.jsonl"}
    with pytest.raises(RecipeError, match="environment reward"):
        load_recipe({**base, "algorithm": "ppo", "reward": "recipes/reward.yaml"}, IterateRecipe)
    with pytest.raises(RecipeError, match="algorithm must be one of"):
        load_recipe({**base, "algorithm": "dpo"}, IterateRecipe)


def test_a_tokenizer_trained_on_the_demos_reads_their_words_as_single_tokens(tmp_path):
    from omrl.errors import UsageError
    from omrl.models.tiny import default_corpus, train_tokenizer
    from omrl.schema import Message, Trajectory
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.run import demo_success, demo_texts

    store = Store.create(tmp_path / "s")
    game = "You are in the scullery. Admissible commands: move widdershins, take doubloon"
    store.append([Trajectory(id=f"d{i}", run_id="demos", task_id=f"t{i}", success=i == 0, reward=float(i == 0),
                             messages=[Message("user", game), Message("assistant", "move widdershins")]).to_row()
                  for i in range(2)]
                 + [Trajectory(id="other", run_id="eval-x", task_id="t0", success=True,
                               messages=[Message("user", "zebracorn")]).to_row()])
    texts = demo_texts(store)
    assert sorted(texts) == sorted([game, "move widdershins"] * 2)  # only the demos' messages
    assert demo_success(store) == 0.5
    plain = train_tokenizer(default_corpus(), vocab_size=1024)
    taught = train_tokenizer(default_corpus() + texts * 20, vocab_size=1024)
    for word in (" scullery", " widdershins", " doubloon"):
        assert len(taught.encode(word, add_special_tokens=False)) == 1 < len(plain.encode(word, add_special_tokens=False))
    with pytest.raises(UsageError, match="tiny.corpus must be one of default, demos, not 'wiki'"):
        load_recipe({"output_dir": "x", "train_tasks": "a", "eval_tasks": "b", "tiny": {"corpus": "wiki"}},
                     IterateRecipe)


def test_a_checkpoint_served_on_localhost_is_refused_with_a_ray_cluster():
    """collect.engine / eval.engine vllm serve on 127.0.0.1: a cluster's other machines could not reach it."""
    from omrl.errors import UsageError
    from omrl.train.config.iterate import IterateRecipe

    base = {"output_dir": "x", "train_tasks": "a", "eval_tasks": "b"}
    for section in ("collect", "eval"):
        with pytest.raises(UsageError, match=rf"{section}\.engine vllm serves the checkpoint on 127\.0\.0\.1"):
            load_recipe({**base, section: {"engine": "vllm"}, "ray": "10.0.0.5:6379"}, IterateRecipe)
    assert load_recipe({**base, "collect": {"engine": "vllm"}}, IterateRecipe).collect.engine == "vllm"


def test_a_setting_added_since_a_run_was_recorded_does_not_block_its_resume(tmp_path):
    """check_recipe: a setting the recorded recipe lacks counts as unchanged at its default (an omrl upgrade
    mid-run), not once it differs; a recorded setting omrl no longer has is a change."""
    import json

    from omrl.errors import UsageError
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.state import IterateState

    config = load_recipe({"output_dir": "x", "train_tasks": "a", "eval_tasks": "b"}, IterateRecipe)
    path = tmp_path / "state.json"
    IterateState(path).check_recipe(config)
    data = json.loads(path.read_text())
    del data["recipe"]["eval"]["engine"]  # recorded before the setting existed
    path.write_text(json.dumps(data))
    IterateState(path).check_recipe(config)  # resumes: the new setting is at its default
    vllm = load_recipe({"output_dir": "x", "train_tasks": "a", "eval_tasks": "b", "eval": {"engine": "vllm"}},
                       IterateRecipe)
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"eval\.engine: hf -> vllm"):
        IterateState(path).check_recipe(vllm)
    data["recipe"]["eval"]["old_knob"] = 3  # a setting omrl has since dropped
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"eval\.old_knob: 3 -> \(not set\)"):
        IterateState(path).check_recipe(config)
