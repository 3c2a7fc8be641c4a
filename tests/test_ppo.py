"""PPO for multi-turn agents (omrl/train/algorithms/ppo.py): real steps on tiny models and the grid environment."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omrl.envs.base import Task  # noqa: E402
from omrl.rollout import RolloutSettings  # noqa: E402
from omrl.store import Store  # noqa: E402
from omrl.tasks import write_tasks  # noqa: E402
from omrl.train.algorithms.ppo import LOGGED, train_ppo  # noqa: E402
from omrl.train.config.ppo import PPORecipe  # noqa: E402
from tests.train_helpers import random_mover_model  # noqa: E402

PROMPT = "Reach the goal. Answer one move: up, down, left or right."


def sturdy_mover(path):
    """random_mover_model with a unit-norm newline embedding: its residual stream (0.01 there) is then not
    swamped by the first update of the zeroed attention/MLP outputs (RMSNorm would blow any change up)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    random_mover_model(path)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.model.embed_tokens.weight[tokenizer.encode("\n", add_special_tokens=False)[0], 0] = 1.0
    model.save_pretrained(path)
    return path


def p_move(path, move: str, observation: str) -> float:
    """The model's probability of answering `move` as the first token of its reply to `observation`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    text = tokenizer.apply_chat_template([{"role": "system", "content": PROMPT},
                                          {"role": "user", "content": observation}],
                                         tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
    return float(probs[tokenizer.encode(move, add_special_tokens=False)[0]])


def grid_task(start, goal) -> Task:
    return Task(id=f"g{start[0]}{start[1]}-{goal[0]}{goal[1]}", instruction="Reach the goal.", env="grid",
                payload={"size": 7, "start": list(start), "goal": list(goal)})


@pytest.mark.slow
def test_ppo_raises_the_probability_of_the_rewarded_move_on_one_step_grid_tasks(tmp_path):
    # Six tasks whose goal is one step left; one turn each: "left" earns 1, anything else 0.
    model = sturdy_mover(tmp_path / "mover")
    tasks = write_tasks([grid_task((x, 3), (x - 1, 3)) for x in range(2, 8)], tmp_path / "tasks.jsonl")
    before = p_move(model, "left", "goal: 1 left")
    assert 0.2 < before < 0.3  # the fixture answers a uniformly random move
    result = train_ppo(PPORecipe(
        model=str(model), tasks=str(tasks), output_dir=str(tmp_path / "out"), store=str(tmp_path / "store"),
        rollout=RolloutSettings(env="grid", max_turns=1, max_new_tokens=4), max_steps=8, tasks_per_step=4,
        samples_per_task=8, ppo_epochs=2, minibatches=2, learning_rate=1e-3, level="token", quiet=True))
    after = p_move(result.checkpoint, "left", "goal: 1 left")
    assert after > before + 0.1, (before, after)
    log = result.history
    assert len(log) == 8 and all(math.isfinite(e[k]) for e in log for k in LOGGED if k not in ("kl_ref",))
    first, last = sum(e["reward"] for e in log[:3]) / 3, sum(e["reward"] for e in log[-3:]) / 3
    assert last >= first, [e["reward"] for e in log]  # the reward does not collapse
    assert all(e["logprob_gap"] < 1e-4 for e in log)  # the training pass reproduces the sampled logprobs
    assert result.rollouts["stored"] == 8 * 32 and len(Store(tmp_path / "store").ids()) == 8 * 32


@pytest.mark.slow
def test_multi_turn_ppo_turn_level_with_separate_critic_and_kl(tmp_path):
    from safetensors.torch import load_file

    model = sturdy_mover(tmp_path / "mover")
    # Goals two moves away: the mover (a random move at logit ~20) reaches some within 4 turns, so returns and the
    # value loss are not all zero (3-4 moves away, no episode was rewarded and the value head stayed at zero).
    tasks = write_tasks([grid_task((4, 4), (2, 4)), grid_task((3, 3), (4, 4)), grid_task((1, 1), (1, 3))],
                        tmp_path / "tasks.jsonl")
    recipe = PPORecipe(model=str(model), tasks=str(tasks), output_dir=str(tmp_path / "out"),
                       store=str(tmp_path / "store"), run_name="p", round=2,
                       rollout=RolloutSettings(env="grid", max_turns=4, max_new_tokens=3), max_steps=2,
                       tasks_per_step=2, samples_per_task=3, ppo_epochs=2, minibatches=2, learning_rate=1e-3,
                       level="turn", critic="separate", beta=0.1, quiet=True)
    result = train_ppo(recipe)
    log = result.history
    assert len(log) == 2 and all(math.isfinite(log[-1][k]) for k in LOGGED if k != "explained_variance")
    # kl_ref: sum over an episode's tokens of logp - ref_logp (a sample estimate, may dip below 0); 0 at step 0.
    assert log[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6) and math.isfinite(log[-1]["kl_ref"])
    before, after = load_file(model / "model.safetensors"), load_file(result.checkpoint / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    head = load_file(result.checkpoint / "critic" / "value_head.safetensors")
    assert any(e["reward"] > 0 for e in log)  # some returns are not 0: the value head has something to fit
    assert head["weight"].abs().sum() > 0  # the value head (zero at the start) learned something
    assert (result.checkpoint / "critic" / "config.json").exists()  # the separate critic's trunk

    rows = Store(tmp_path / "store").read().to_pylist()
    assert len(rows) == result.rollouts["stored"] == 12
    assert {r["run_id"] for r in rows} == {"p/round-2/step-00000", "p/round-2/step-00001"}
    assert all(r["round"] == 2 and r["source"] == "collected:ppo" for r in rows)
    assert all(json.loads(r["metadata"])["ppo_step"] in (0, 1) for r in rows)
    assert max(r["num_turns"] for r in rows) > 1  # multi-turn episodes were trained on
    saved = json.loads((result.checkpoint / "omrl_ppo.json").read_text())
    assert saved["recipe"]["level"] == "turn" and len(saved["log"]) == 2
    # A second run into the same store never reuses the first run's trajectory ids.
    again = train_ppo(PPORecipe(**{**recipe.__dict__, "max_steps": 1, "output_dir": str(tmp_path / "out2")}))
    assert again.rollouts["stored"] == 6 and len(Store(tmp_path / "store").ids()) == 18


def one_step_left(tmp_path, tasks: int, **settings):
    """The sturdy mover and PPORecipe settings for `tasks` one-turn grid tasks whose goal is one step left
    (2 epochs of 2 minibatches, token level): (model path, settings with `settings` over them)."""
    model = sturdy_mover(tmp_path / "mover")
    path = write_tasks([grid_task((x, 3), (x - 1, 3)) for x in range(2, 2 + tasks)], tmp_path / "tasks.jsonl")
    return model, {"model": str(model), "tasks": str(path), "quiet": True, "level": "token", "ppo_epochs": 2,
                   "minibatches": 2, "rollout": RolloutSettings(env="grid", max_turns=1, max_new_tokens=4), **settings}


@pytest.mark.slow
def test_critic_warmup_steps_train_only_the_critic(tmp_path):
    from safetensors.torch import load_file

    model, common = one_step_left(tmp_path, tasks=4, tasks_per_step=2, samples_per_task=4, learning_rate=1e-3)
    warm = train_ppo(PPORecipe(output_dir=str(tmp_path / "warm"), max_steps=2, critic_warmup_steps=2, **common))
    before, after = load_file(model / "model.safetensors"), load_file(warm.checkpoint / "model.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before)  # the policy did not move, not even its trunk
    assert load_file(warm.checkpoint / "critic" / "value_head.safetensors")["weight"].abs().sum() > 0
    assert [e["policy_trained"] for e in warm.history] == [False, False]
    assert all(e["updates"] == 4 for e in warm.history)  # the critic took every minibatch step
    # past the warm-up the policy trains
    longer = train_ppo(PPORecipe(output_dir=str(tmp_path / "longer"), max_steps=3, critic_warmup_steps=2, **common))
    moved = load_file(longer.checkpoint / "model.safetensors")
    assert any(not torch.equal(before[k], moved[k]) for k in before)
    assert [e["policy_trained"] for e in longer.history] == [False, False, True]
    with pytest.raises(ValueError, match="critic_warmup_steps"):
        PPORecipe(output_dir="x", critic_warmup_steps=-1, **common)


@pytest.mark.slow
def test_target_kl_stops_a_batch_s_updates_once_the_policy_has_moved(tmp_path):
    _, common = one_step_left(tmp_path, tasks=6, tasks_per_step=4, samples_per_task=8, learning_rate=1e-2, max_steps=1)
    free = train_ppo(PPORecipe(output_dir=str(tmp_path / "free"), **common))
    assert free.history[0]["updates"] == 4 and free.history[0]["approx_kl"] > 1e-4
    # the first minibatch is measured before any step (KL 0) and steps; the next sees the moved policy and stops
    guarded = train_ppo(PPORecipe(output_dir=str(tmp_path / "guarded"), target_kl=1e-9, **common))
    assert guarded.history[0]["updates"] == 1
    loose = train_ppo(PPORecipe(output_dir=str(tmp_path / "loose"), target_kl=1e6, **common))
    assert loose.history[0]["updates"] == 4
    with pytest.raises(ValueError, match="target_kl"):
        PPORecipe(output_dir="x", model="m", tasks="t", target_kl=0.0)


def test_episode_batch_places_turn_rewards_on_each_turn_s_last_model_token():
    from types import SimpleNamespace

    from omrl.policies.hf import SCRATCH_KEY
    from omrl.train.rl.ppo_update import episodes_to_batch

    trace = {"prompt_ids": [5, 6], "completion_ids": [1, 2, 9, 9, 3, 4], "env_mask": [1, 1, 0, 0, 1, 1],
             "logprobs": [-1.0, -0.5, 0.0, 0.0, -0.2, -0.1]}
    row = {"status": "ok", "reward": 1.5, "success": True, "turns": [{"reward": 0.25}, {"reward": 1.0}]}
    failed = {"status": "env_error", "reward": None, "success": None, "turns": []}
    episodes = [SimpleNamespace(row=row, context=SimpleNamespace(scratch={SCRATCH_KEY: trace})),
                SimpleNamespace(row=failed, context=SimpleNamespace(scratch={}))]
    batch, left_out = episodes_to_batch(episodes, pad_id=0)
    assert left_out == 1  # the failed episode gets no loss
    # 0.25 on turn 1's last token; turn 2's 1.0 plus the 0.25 the turns do not carry on the last token.
    assert batch.rewards.tolist() == [[0.0, 0.25, 0.0, 0.0, 0.0, 1.25]]
    assert batch.input_ids.tolist() == [[5, 6, 1, 2, 9, 9, 3, 4]] and batch.prompt_width == 2


def test_environment_tokens_get_no_policy_loss_and_no_value_loss():
    from omrl.train.rl.gae import turn_starts
    from omrl.train.rl.ppo_update import ppo_losses

    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0, 1], [0, 1, 1, 0, 0]], dtype=torch.float32)
    value_mask = turn_starts(mask)  # turn level: one value per turn
    logp = torch.randn(2, 5, generator=gen).requires_grad_()
    values = torch.randn(2, 5, generator=gen).requires_grad_()
    advantages, returns = torch.randn(2, 5, generator=gen), torch.randn(2, 5, generator=gen)
    policy_loss, value_loss, stats = ppo_losses(logp, logp.detach(), advantages, mask, values, values.detach(),
                                                returns, value_mask)
    # At the old policy the ratio is 1: the surrogate is minus the mean advantage over the model's tokens.
    assert float(policy_loss.detach()) == pytest.approx(float(-(advantages * mask).sum() / mask.sum()))
    assert float(value_loss.detach()) == pytest.approx(float(0.5 * (((values.detach() - returns) ** 2) * value_mask).sum() / 3))
    assert stats["clip_fraction"] == 0.0 and stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    (policy_loss + value_loss).backward()
    assert logp.grad[mask == 0].abs().max() == 0 and logp.grad[mask == 1].abs().min() > 0
    assert values.grad[value_mask == 0].abs().max() == 0 and values.grad[value_mask == 1].abs().min() > 0


def test_recipe_file_loads_and_bad_settings_are_refused():
    from omrl.config import RecipeError, load_recipe

    recipe = load_recipe("recipes/ppo_grid.yaml", PPORecipe, ["level=token", "rollout.max_turns=3"])
    assert (recipe.level, recipe.rollout.max_turns, recipe.rollout.env) == ("token", 3, "grid")
    with pytest.raises(RecipeError, match="level"):
        load_recipe("recipes/ppo_grid.yaml", PPORecipe, ["level=episode"])
    with pytest.raises(RecipeError, match="critic"):
        load_recipe("recipes/ppo_grid.yaml", PPORecipe, ["critic=twin"])


@pytest.mark.slow
def test_cli_prints_the_resolved_ppo_config():
    from click.testing import CliRunner

    from omrl.cli.main import cli

    out = CliRunner().invoke(cli, ["train", "ppo", "--recipe", "recipes/ppo_grid.yaml", "level=token",
                                   "--print-config"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["level"] == "token"
