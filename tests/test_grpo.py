"""GRPO through TRL's rollout_func with omrl's agent loop: one real step on the tiny model."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from omrl.envs.base import Reset, StepResult, Task  # noqa: E402
from omrl.models.tiny import build_tiny_model  # noqa: E402
from omrl.rollout import RolloutSettings  # noqa: E402
from omrl.store import Store  # noqa: E402
from omrl.tasks import write_tasks  # noqa: E402
from omrl.train.algorithms.grpo import train_grpo  # noqa: E402
from omrl.train.config.grpo import GRPORecipe  # noqa: E402


class LetterEnv:
    """One-turn text env whose reward varies across samples of an untrained model (so advantages are not 0)."""

    name = "letter"

    def reset(self, task):
        return Reset(observation="say something", system_prompt="Reply.")

    def step(self, action):
        reward = float(sum(map(ord, action.text)) % 2)  # random replies of one group get different rewards
        return StepResult("ok", reward, True, {"success": reward >= 1})

    def close(self):
        pass


@pytest.mark.slow
def test_one_grpo_step_changes_parameters_and_stores_rollout_groups(tmp_path):
    from safetensors.torch import load_file

    model = build_tiny_model(tmp_path / "tiny", hidden=64, layers=2)
    tasks = write_tasks([Task(id=f"t{i}", instruction="say", env="letter") for i in range(4)],
                        tmp_path / "tasks.jsonl")
    recipe = GRPORecipe(model=str(model), tasks=str(tasks), output_dir=str(tmp_path / "out"),
                        rollout=RolloutSettings(env="test_grpo:LetterEnv", max_turns=1, max_new_tokens=12),
                        store=str(tmp_path / "store"), run_name="t", round=3, max_steps=1, tasks_per_step=2,
                        samples_per_task=4, warmup_steps=0, learning_rate=1e-2, logging_steps=1, quiet=True)
    result = train_grpo(recipe)
    out = result.checkpoint

    before, after = load_file(model / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert result.history == json.loads((out / "omrl_grpo.json").read_text())["log"]  # the record, returned
    assert result.losses and all(torch.isfinite(torch.tensor(loss)) for loss in result.losses)
    assert result.steps == 1 and result.rollouts["stored"] == 8

    store = Store(tmp_path / "store")
    groups = store.sql("SELECT run_id, round, task_id, n FROM groups").to_pylist()
    assert len(groups) == 2 and all(g["n"] == 4 and g["round"] == 3 for g in groups)
    assert all(g["run_id"] == "t/round-3/step-00000" for g in groups)
    assert result.rollouts["run_prefix"] == "t/round-3"
    # A re-run (or a resumed iterate round) into the same store must not reuse these trajectory ids.
    from omrl.train.data.rollout_step import RolloutStep

    assert RolloutStep(recipe, "grpo").run_id(0) == "t/round-3/attempt-2/step-00000"
    fresh = dataclasses.replace(recipe, store=str(tmp_path / "other-store"))
    assert RolloutStep(fresh, "grpo").run_id(7) == "t/round-3/step-00007"
    rows = store.read().to_pylist()
    assert all(json.loads(r["metadata"])["grpo_step"] == 0 for r in rows)
    assert all(r["turns"][0]["completion_ids"] and len(r["turns"][0]["logprobs"]) ==
               len(r["turns"][0]["completion_ids"]) for r in rows)


class BrokenEnv(LetterEnv):
    """An environment whose every step fails: a broken setup GRPO must not silently train on."""

    def step(self, action):
        raise ConnectionError("env server went away")


@pytest.mark.slow
def test_a_step_whose_rollouts_all_fail_stops_with_the_error(tmp_path):
    model = build_tiny_model(tmp_path / "tiny", hidden=32, layers=2)
    tasks = write_tasks([Task(id=f"t{i}", instruction="say", env="broken") for i in range(2)],
                        tmp_path / "tasks.jsonl")
    recipe = GRPORecipe(model=str(model), tasks=str(tasks), output_dir=str(tmp_path / "out"),
                        rollout=RolloutSettings(env="test_grpo:BrokenEnv", max_turns=1, max_new_tokens=4),
                        store=str(tmp_path / "store"), max_steps=1, tasks_per_step=2,
                        samples_per_task=2, warmup_steps=0, quiet=True)
    with pytest.raises(RuntimeError, match="all 4 rollouts failed.*env server went away"):
        train_grpo(recipe)
    statuses = Store(tmp_path / "store").sql("SELECT DISTINCT status FROM trajectories").to_pylist()
    assert statuses == [{"status": "env_error"}]  # the failed rollouts are stored, as errors


def test_a_partial_rollout_section_keeps_grpo_defaults_and_flat_keys_are_refused():
    from omrl.config import RecipeError, from_dict

    loaded = from_dict(GRPORecipe, {"model": "m", "tasks": "t", "output_dir": "o",
                                    "rollout": {"env": "math", "max_turns": 3, "temperature": 0.5}})
    assert (loaded.rollout.env, loaded.rollout.max_turns, loaded.rollout.temperature) == ("math", 3, 0.5)
    assert loaded.rollout.max_new_tokens == 16 and loaded.rollout.concurrency == 64  # GRPO's, not RolloutSettings'
    with pytest.raises(RecipeError, match="unknown key max_turns"):  # the rollout knobs live in `rollout` only
        from_dict(GRPORecipe, {"model": "m", "tasks": "t", "output_dir": "o", "max_turns": 3})
    with pytest.raises(TypeError):
        GRPORecipe(model="m", tasks="t", output_dir="o", max_turns=3)


def test_use_vllm_is_refused_on_a_cpu_and_passed_to_trl_on_a_gpu():
    from trl import GRPOConfig

    from omrl.train.config import grpo

    recipe = GRPORecipe(model="m", tasks="t.jsonl", output_dir="o", use_vllm=True, use_cpu=True)
    with pytest.raises(ValueError, match="CUDA GPU"):
        grpo.trl_config(recipe)
    # Off the CPU (use_cpu: false, as on a GPU machine) the vLLM settings reach TRL's own GRPOConfig, built
    # here for real (TRL starts vLLM only when the trainer does); with them the recipe's other settings.
    config = grpo.trl_config(dataclasses.replace(recipe, use_cpu=False, vllm_mode="server",
                                                  vllm_server_base_url="http://127.0.0.1:8000",
                                                  vllm_gpu_memory_utilization=0.5))
    assert isinstance(config, GRPOConfig) and not config.use_cpu
    assert (config.use_vllm, config.vllm_mode, config.vllm_server_base_url, config.vllm_gpu_memory_utilization) \
        == (True, "server", "http://127.0.0.1:8000", 0.5)
    assert (config.num_generations, config.per_device_train_batch_size) == (8, 64)  # samples_per_task, x tasks
    colocated = grpo.trl_config(dataclasses.replace(recipe, use_cpu=False))
    assert (colocated.use_vllm, colocated.vllm_mode, colocated.vllm_gpu_memory_utilization) == (True, "colocate", 0.3)
    plain = grpo.trl_config(dataclasses.replace(recipe, use_vllm=False))
    assert not plain.use_vllm and plain.use_cpu
    from omrl.config import RecipeError, load_recipe

    with pytest.raises(RecipeError, match="vllm_mode must be one of colocate, server, not 'remote'"):
        load_recipe({"model": "m", "tasks": "t.jsonl", "output_dir": "o", "use_vllm": True}, GRPORecipe,
                    ["vllm_mode=remote"])


def test_rollout_policy_is_vllm_when_the_trainer_generates_with_vllm(tmp_path):
    from types import SimpleNamespace

    from omrl.policies.hf import HFPolicy
    from omrl.policies.vllm import VLLMPolicy
    from omrl.train.data.rollout_func import AgentRollout

    model = build_tiny_model(tmp_path / "tiny", hidden=32, layers=1)
    tasks = [Task(id="a", instruction="go")]
    recipe = GRPORecipe(model=str(model), tasks="t.jsonl", output_dir=str(tmp_path / "o"))
    hf = HFPolicy(str(model))
    rollout = AgentRollout(recipe, tasks, hf.tokenizer)
    settings = rollout.rollouts.settings(0, 2)

    class Generator:  # VLLMGeneration's interface; not called here
        temperature, max_completion_length = 1.0, 16

        def generate(self, prompts, images, num_generations, profiler=None):
            raise AssertionError("not called")

    trainer = SimpleNamespace(args=SimpleNamespace(use_vllm=True, max_completion_length=16),
                              vllm_generation=Generator(), processing_class=hf.tokenizer, model=hf.model)
    assert isinstance(rollout.policy(trainer, settings), VLLMPolicy)
    trainer.args.use_vllm = False
    trainer.accelerator = SimpleNamespace(unwrap_model=lambda m: m)
    policy = rollout.policy(trainer, settings)
    assert type(policy) is HFPolicy and policy.model is hf.model


@pytest.mark.slow
def test_step_credit_recipe_trains_through_train_grpo_and_stores_the_credit(tmp_path):
    from omrl.envs.grid import grid_tasks
    from omrl.train.rl.step_credit import StepCreditSettings

    model = build_tiny_model(tmp_path / "tiny", hidden=32, layers=1)
    tasks = write_tasks(grid_tasks(2, seed=3), tmp_path / "tasks.jsonl")
    recipe = GRPORecipe(model=str(model), tasks=str(tasks), output_dir=str(tmp_path / "out"),
                        rollout=RolloutSettings(env="grid", max_turns=3, max_new_tokens=4),
                        store=str(tmp_path / "store"), run_name="credit", max_steps=1, tasks_per_step=2,
                        samples_per_task=4, warmup_steps=0, logging_steps=1, quiet=True,
                        step_credit=StepCreditSettings(weight=0.5))
    log = train_grpo(recipe).history
    assert any("step_credit/step_abs_mean" in entry for entry in log)  # the step-credit trainer ran
    # Every stored turn carries its step group and advantages, visible in SQL.
    credit = Store(tmp_path / "store").sql(
        "SELECT json_extract_string(t.info, '$.state') AS state, json_extract(t.info, '$.credit') AS credit "
        "FROM trajectories, unnest(turns) AS u(t)").to_pylist()
    assert credit and all(c["state"] and c["credit"] is not None for c in credit)
