"""Step-level credit for GRPO (omrl/train/rl/step_credit.py): step groups and advantages on hand-made groups,
rows' turn infos in and out, per-token spreading, and the credit stored with real grid rollouts."""

from __future__ import annotations

import asyncio
import json

import pytest

from omrl.train.rl.step_credit import (
    RESET_STATE,
    EpisodeSteps,
    StepCreditSettings,
    credit_rows,
    discounted_returns,
    episodes_from_rows,
    step_credit,
    step_token_advantages,
    store_in_turns,
    token_advantages,
    turn_states,
    visited_states,
)


def test_step_groups_and_step_advantages_on_a_hand_made_group():
    assert discounted_returns([0, 0, 1], 0.5) == [0.25, 0.5, 1.0]
    episodes = [EpisodeSteps("g", 1.0, [0.0, 1.0], ["A", "B"]),  # all three start at A; 0 and 2 meet at B
                EpisodeSteps("g", 0.0, [0.0, 0.0], ["A", "C"]),
                EpisodeSteps("g", 0.0, [0.0, 0.0], ["A", "B"]),
                EpisodeSteps("h", 0.0, [0.0], ["A"])]  # another task's A is another step group
    out = step_credit(episodes, gamma=1.0, scale_std=False)
    assert out.episode_advantages == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0])
    assert out.step_returns == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0]]
    assert out.step_group_sizes == [[3, 2], [3, 1], [3, 2], [1]]
    # (g, A): returns 1, 0, 0 -> 2/3, -1/3, -1/3; (g, B): 1 vs 0 -> +-1/2; (g, C) and (h, A) alone -> 0.
    assert out.step_advantages == [pytest.approx(v) for v in ([2 / 3, 0.5], [-1 / 3, 0.0], [-1 / 3, -0.5], [0.0])]
    assert out.advantages == [pytest.approx(v) for v in ([4 / 3, 7 / 6], [-2 / 3, -1 / 3], [-2 / 3, -5 / 6], [0.0])]
    assert out.step_groups[0][1] == out.step_groups[2][1] != out.step_groups[3][0]
    half = step_credit(episodes, gamma=1.0, scale_std=False, weight=0.5)
    assert half.advantages[0] == pytest.approx([2 / 3 + 1 / 3, 2 / 3 + 0.25])


def test_unknown_states_are_groups_of_their_own_and_stored_turns_give_states():
    out = step_credit([EpisodeSteps("g", 1.0, [1.0], [None]), EpisodeSteps("g", 0.0, [0.0], [None])], gamma=1.0)
    assert out.step_advantages == [[0.0], [0.0]] and out.step_groups == [[None], [None]]
    row = {"turns": [{"info": '{"state": [1, 2]}'}, {"info": "{}"}, {"info": '{"steps": [{"state": "x"}]}'}]}
    assert turn_states(row) == [RESET_STATE, "[1, 2]", None]
    with pytest.raises(ValueError, match="states"):
        step_credit([EpisodeSteps("g", 1.0, [1.0, 0.0], ["A"])])


def turn(state, reward=0.0):
    return {"info": json.dumps({"state": state}), "reward": reward}


# One task's group as stored rows: e0 and e2 meet at cell "a" after their first move; e3 failed (no reward).
ROWS = [
    {"id": "e0", "group_id": "g", "reward": 1.0, "turns": [turn("a"), turn("goal", 1.0)]},
    {"id": "e1", "group_id": "g", "reward": 0.0, "turns": [turn("b"), turn("c")]},
    {"id": "e2", "group_id": "g", "reward": 0.5, "turns": [turn("a"), turn("d", 0.5)]},
    {"id": "e3", "group_id": "g", "reward": None, "turns": [turn("a")]},
]


def test_rows_give_known_step_groups_and_advantages_and_a_failed_episode_is_left_out():
    credit = credit_rows(ROWS, StepCreditSettings(weight=1.0, gamma=1.0, scale_std=False))
    # episodes: rewards 1, 0, 0.5 (e3 left out, not a 0) -> mean 0.5
    assert credit.episode_advantages == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert credit.step_group_sizes == [[3, 2], [3, 1], [3, 2], [0]]  # e3's visit to "a" is not counted
    # (g, reset): 1, 0, 0.5 -> 0.5, -0.5, 0; (g, a): e0's turn 2 returns 1, e2's 0.5 -> +-0.25; (g, b) alone
    assert credit.step_advantages == [pytest.approx(v) for v in ([0.5, 0.25], [-0.5, 0.0], [0.0, -0.25], [0.0])]
    assert credit.advantages == [pytest.approx(v) for v in ([1.0, 0.75], [-1.0, -0.5], [0.0, -0.25], [0.0])]
    assert credit.step_groups[3] == [None] and credit.scored == [True, True, True, False]
    discounted = credit_rows(ROWS, StepCreditSettings(gamma=0.5, scale_std=False))
    assert discounted.step_returns[0] == [0.5, 1.0] and discounted.step_advantages[0] == pytest.approx([0.25, 0.25])
    scaled = credit_rows(ROWS, StepCreditSettings(gamma=1.0))  # std of (1, 0, 0.5) with Bessel's correction: 0.5
    assert scaled.step_advantages[0][0] == pytest.approx(0.5 / (0.5 + 1e-4))


def test_an_outside_episode_reward_lands_on_the_last_turn():
    # A judge's combined reward of 0.8 for e0 (the env paid 1.0): the turns account for it, the first turn's
    # undiscounted return is the reward GRPO trains on.
    episodes = episodes_from_rows(ROWS, rewards=[0.8, 0.0, 0.5, None])
    assert episodes[0].turn_rewards == [0.0, pytest.approx(0.8)] and episodes[3].reward is None
    assert episodes[0].states == [RESET_STATE, "a"] and episodes[0].group == "g"
    with pytest.raises(ValueError, match="rewards"):
        episodes_from_rows(ROWS, rewards=[1.0])


def test_the_visited_anchor_tells_a_first_visit_from_a_return():
    # A search game: both episodes stand in the kitchen twice. e0 goes west, comes back and then north to the
    # coin; e1 goes north at once. By state alone all four kitchen turns are one step group; by state and
    # visited set, e0's return to the kitchen is its own group, and the first visits compare e0's "west"
    # with e1's "north".
    rows = [{"id": "e0", "group_id": "g", "reward": 1.0,
             "turns": [turn("kitchen"), turn("pantry"), turn("kitchen"), turn("coin", 1.0)]},
            {"id": "e1", "group_id": "g", "reward": 1.0, "turns": [turn("kitchen"), turn("coin", 1.0)]}]
    by_state = credit_rows(rows, StepCreditSettings(gamma=0.5, scale_std=False))
    assert by_state.step_group_sizes == [[2, 3, 1, 3], [2, 3]]
    visited = credit_rows(rows, StepCreditSettings(gamma=0.5, scale_std=False, anchor="visited"))
    assert visited.step_group_sizes == [[2, 2, 1, 1], [2, 2]]
    assert visited.step_groups[0][1] == visited.step_groups[1][1] != visited.step_groups[0][3]
    # first kitchen visit: e0 (west) returns 0.5**2 = 0.25, e1 (north) 1.0 -> mean 0.625
    assert visited.step_advantages[0][1] == pytest.approx(-0.375) and visited.step_advantages[1][1] == pytest.approx(0.375)
    assert visited.episode_advantages == [0.0, 0.0]  # both found the coin: only the steps tell them apart
    assert visited_states(["A", None, "B"]) == [("A", ()), None, None]  # after an unknown state, unknown
    from omrl.config import RecipeError, from_dict

    with pytest.raises(RecipeError, match="anchor must be one of state, visited, not 'history'"):
        from_dict(StepCreditSettings, {"anchor": "history"})


def test_turn_values_spread_over_each_turns_trainable_tokens_only():
    mask = [0, 1, 1, 0, 0, 0, 1, 0]  # template token, turn 1 (2 tokens), observation, turn 2, template
    assert token_advantages(mask, [0.5, -2.0]) == [0.0, 0.5, 0.5, 0.0, 0.0, 0.0, -2.0, 0.0]
    with pytest.raises(ValueError, match="runs"):
        token_advantages(mask, [1.0])
    credit = credit_rows(ROWS, StepCreditSettings(weight=2.0, gamma=1.0, scale_std=False))
    masks = [[1, 0, 1, 1], [1, 0, 1], [1, 1, 0, 1], [0]]  # e3: a placeholder trace with no turn tokens
    tokens = step_token_advantages(masks, credit)
    assert tokens == [pytest.approx(v) for v in ([1.0, 0.0, 0.5, 0.5], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0, -0.5],
                                                 [0.0])]
    with pytest.raises(ValueError, match="traces"):
        step_token_advantages(masks[:2], credit)


def test_credit_of_real_grid_rollouts_is_stored_in_turn_info_and_visible_in_sql(tmp_path):
    from omrl.envs.grid import grid_wall_tasks
    from omrl.policies.scripted import ScriptedPolicy
    from omrl.rollout import RolloutSettings, play_episodes
    from omrl.store import Store
    from omrl.store.query import run_query

    tasks = grid_wall_tasks(2, seed=0, split="train")
    settings = RolloutSettings(env="grid", env_options={"noise": 0.5, "seed": 3}, max_turns=20, concurrency=8)
    episodes = asyncio.run(play_episodes([(t, s) for t in tasks for s in range(4)], None, ScriptedPolicy(),
                                         settings, run_id="credit"))
    rows = [e.row for e in episodes]
    credit = credit_rows(rows, StepCreditSettings(gamma=1.0))
    store_in_turns(rows, credit)
    store = Store.create(tmp_path / "store")
    store.append(rows)
    got = run_query(store, "SELECT trajectory_id, index, json_extract_string(info, '$.state') AS state, "
                           "json_extract_string(info, '$.credit.group') AS step_group, "
                           "CAST(json_extract(info, '$.credit.size') AS INTEGER) AS size, "
                           "CAST(json_extract(info, '$.credit.advantage') AS DOUBLE) AS advantage "
                           "FROM turns ORDER BY trajectory_id, index").to_pylist()
    assert len(got) == sum(len(r["turns"]) for r in rows)
    for i, row in enumerate(rows):
        mine = [g for g in got if g["trajectory_id"] == row["id"]]
        assert [g["advantage"] for g in mine] == pytest.approx(credit.advantages[i])
        assert [g["size"] for g in mine] == credit.step_group_sizes[i]
    # every episode of a task starts from the reset state: the first turns of a group form one step group of 4
    firsts = [g for g in got if g["index"] == 0]
    assert {g["size"] for g in firsts} == {4} and len({g["step_group"] for g in firsts}) == 2
    # a state the step reports is the next turn's anchor: same (group, state) -> same step group key
    by_key = {}
    for g in got:
        by_key.setdefault(g["step_group"], set()).add(g["size"])
    assert all(len(sizes) == 1 for sizes in by_key.values())
    with pytest.raises(ValueError, match="rows"):
        store_in_turns(rows[:1], credit)
    # the diagnostics over the stored turns agree with the credit computed in Python
    from omrl.train.rl.step_credit import credit_diagnostics

    turns = [(credit.step_group_sizes[i][k], credit.step_advantages[i][k], credit.episode_advantages[i],
              credit.step_groups[i][k]) for i in range(len(rows)) for k in range(len(rows[i]["turns"]))]
    # "index = 0" below counts the first turns a second time
    turns += [(credit.step_group_sizes[i][0], credit.step_advantages[i][0], credit.episode_advantages[i],
               credit.step_groups[i][0]) for i in range(len(rows))]
    diag = credit_diagnostics([(store, "TRUE"), (store, "index = 0")])
    n = len(turns)
    in_group = sum(size > 1 for size, *_ in turns)
    assert diag["turns"] == n
    assert diag["share_in_step_group"] == round(in_group / n, 4)
    assert diag["share_nonzero_step_advantage"] == round(sum(abs(a) > 1e-9 for _, a, _, _ in turns) / n, 4)
    assert diag["share_step_advantage_where_episode_advantage_0"] == round(
        sum(abs(a) > 1e-9 and abs(e) <= 1e-9 for _, a, e, _ in turns) / n, 4)
    assert sum(diag["turns_by_group_size"].values()) == n
    assert diag["max_step_group_size"] == max(size for size, *_ in turns)
    # distinct step groups are counted per store query, so the first turns' groups count twice
    once = {g for size, _, _, g in turns[: n - len(rows)] if size > 1}
    again = {g for size, _, _, g in turns[n - len(rows):] if size > 1}
    assert diag["step_groups"] == len(once) + len(again)
    assert diag["mean_step_group_size"] == round(in_group / diag["step_groups"], 2)
    assert credit_diagnostics([(store, "FALSE")])["share_in_step_group"] is None


# ---------------------------------------------------------------- the GRPO trainer piece (omrl/train/rl/grpo_credit.py)

def test_add_step_advantages_broadcasts_the_episode_advantage_and_masks_env_tokens():
    torch = pytest.importorskip("torch")
    from omrl.train.rl.grpo_credit import add_step_advantages

    output = {"advantages": torch.tensor([1.0, 0.0]), "completion_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]),
              "tool_mask": torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]])}
    out = add_step_advantages(output, [[0.5, 0.0, -0.5, 0.25], [2.0]])
    assert out["advantages"].tolist() == [[1.5, 0.0, 0.5, 1.25], [2.0, 0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="no omrl_step_advantages"):
        add_step_advantages({**output, "advantages": torch.tensor([1.0, 0.0])}, [[0.0], None])
    with pytest.raises(ValueError, match="5 step advantages for 4"):
        add_step_advantages({**output, "advantages": torch.tensor([1.0, 0.0])}, [[0.0] * 5, [0.0]])


def test_one_grpo_step_with_per_token_step_advantages(tmp_path):
    """A real GRPOTrainer step on a tiny model: a flat group (TRL's episode advantage 0), so only the step
    term from rollout_func can move the policy; a trainable token whose step advantage is 0 gets no
    gradient, the others do; the loss is finite and the parameters change."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from datasets import Dataset
    from omrl.models.tiny import cached_tiny_model
    from omrl.train.rl.grpo_credit import STEP_ADVANTAGES, step_credit_trainer

    source = cached_tiny_model(hidden=32)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source)
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = enc("<|im_start|>user\ngoal: 3 up<|im_end|>\n<|im_start|>assistant\n")
    turn1, observation, turn2 = enc("left") + [end], enc("\n<|im_start|>user\ngoal: 2 up<|im_end|>\n"), enc("up") + [end]
    completion = turn1 + observation + turn2
    env_mask = [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
    # turn 1 of rollout 0 has step advantage 1, its turn 2 has 0; rollout 1: -1 then 0.5
    steps = [token_advantages(env_mask, [1.0, 0.0]), token_advantages(env_mask, [-1.0, 0.5])]

    def rollout(prompts, trainer):
        n = len(prompts)
        return {"prompt_ids": [prompt] * n, "completion_ids": [completion] * n,
                "logprobs": [[0.0] * len(completion)] * n, "env_mask": [env_mask] * n,
                "omrl_reward": [1.0] * n, STEP_ADVANTAGES: [steps[i % 2] for i in range(n)]}

    def reward(prompts, completions, omrl_reward, **kwargs):
        return omrl_reward  # the same for both: a flat group, TRL's episode advantage is 0

    seen = {}

    class Observed(step_credit_trainer()):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            seen["inputs"] = inputs
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            seen["loss"] = float(loss.detach())
            return loss

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                      max_steps=1, learning_rate=1e-2, beta=0.0, loss_type="dapo", max_completion_length=32,
                      save_strategy="no", report_to="none", use_cpu=True, bf16=False, disable_tqdm=True,
                      logging_steps=1, seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Observed(model=model, reward_funcs=[reward], args=args, processing_class=tokenizer,
                       train_dataset=Dataset.from_dict({"prompt": ["task-a", "task-b"]}), rollout_func=rollout)
    trainer.train()
    assert seen["loss"] == seen["loss"] and abs(seen["loss"]) < 1e6  # finite
    assert any(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters())
    inputs = seen["inputs"]
    adv = inputs["advantages"]
    assert adv.shape == inputs["completion_ids"].shape
    by_rollout = {tuple(r[: len(completion)].tolist()) for r in adv}
    assert by_rollout == {tuple(float(v) for v in s) for s in steps}  # episode advantage 0 + the step term

    # Gradient at the final hidden state that predicts each completion token (TRL 1.16 scores tokens with a
    # fused LM head, no logits tensor: the last norm's output feeds only its own position's prediction),
    # through TRL's own loss on the same inputs.
    captured = {}

    def keep(module, args, out):  # returns None: the output is left as it is
        out.retain_grad()
        captured["hidden"] = out

    hook = model.model.norm.register_forward_hook(keep)
    try:
        model.zero_grad()
        trainer.compute_loss(model, inputs).backward()
    finally:
        hook.remove()
    logits_grad = captured["hidden"].grad  # [B, prompt + completion, H]; token t is predicted at P + t - 1
    offset = inputs["prompt_ids"].shape[1] - 1
    for b in range(adv.shape[0]):
        for t in range(len(completion)):
            signal = float(logits_grad[b, offset + t].abs().sum())
            if env_mask[t] == 0 or float(adv[b, t]) == 0.0:
                assert signal == 0.0, (b, t)  # an environment token, or a token whose advantage is 0
            else:
                assert signal > 0.0, (b, t)


def test_the_step_credit_trainer_refuses_a_whole_sequence_loss(tmp_path):
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from datasets import Dataset
    from omrl.models.tiny import cached_tiny_model
    from omrl.train.rl.grpo_credit import step_credit_trainer

    source = cached_tiny_model(hidden=32)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                      max_steps=1, loss_type="vespo", report_to="none", use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="per-token loss"):
        step_credit_trainer()(model=AutoModelForCausalLM.from_pretrained(source), reward_funcs=[lambda **k: [0.0]],
                              args=args, processing_class=AutoTokenizer.from_pretrained(source),
                              train_dataset=Dataset.from_dict({"prompt": ["a"]}), rollout_func=lambda p, t: {})
