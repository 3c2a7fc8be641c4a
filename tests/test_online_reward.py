"""Rewards in the loop: GRPO rollouts scored online by the reward recipe's metrics and a judge served in its
own process (omrl.testing.judge_server), every score stored; failures are missing components, never 0."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from omrl.envs.base import Reset, StepResult, Task  # noqa: E402
from omrl.models.tiny import build_tiny_model  # noqa: E402
from omrl.rollout import RolloutSettings  # noqa: E402
from omrl.store import Store  # noqa: E402
from omrl.tasks import write_tasks  # noqa: E402
from omrl.testing.judge_server import JudgeProcess  # noqa: E402
from omrl.train.algorithms.grpo import train_grpo  # noqa: E402
from omrl.train.config.grpo import GRPORecipe  # noqa: E402

RUBRIC = {"name": "brevity", "criteria": ["Shorter replies are better."], "scale": {"min": 0, "max": 10}}


class LetterEnv:
    """One-turn text env whose reward varies across samples of an untrained model."""

    name = "letter"

    def reset(self, task):
        return Reset(observation="say something", system_prompt="Reply.")

    def step(self, action):
        reward = float(sum(map(ord, action.text)) % 2)
        return StepResult("ok", reward, True, {"success": reward >= 1})

    def close(self):
        pass


def reward_recipe(base_url: str, missing: str = "renormalize", mode: str = "group", **judge) -> dict:
    return {"name": "reward", "missing": missing,
            "components": {"env_reward": 1.0, "num_turns": 0.1,
                           f"judge:brevity{'' if mode == 'pointwise' else ':' + mode}": {"weight": 1.0,
                                                                                        "scale": [0, 10]}},
            "judges": [{"rubric": RUBRIC, "model": "rule-judge", "base_url": base_url, "mode": mode,
                        "max_retries": 1, "max_invalid": 1, "max_tokens": 128, "max_prompt_tokens": 4096,
                        "price_prompt": 1.0, "price_completion": 2.0, **judge}]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden=32, layers=2)


def grpo(tmp_path, tiny, reward, store="store", out="out", steps=1):
    tasks = write_tasks([Task(id=f"t{i}", instruction="say", env="letter") for i in range(4)],
                        tmp_path / "tasks.jsonl")
    return GRPORecipe(model=str(tiny), tasks=str(tasks), output_dir=str(tmp_path / out),
                      rollout=RolloutSettings(env="test_online_reward:LetterEnv", max_turns=1, max_new_tokens=8),
                      store=str(tmp_path / store), run_name="t", round=2, max_steps=steps, tasks_per_step=2,
                      samples_per_task=4, warmup_steps=0, learning_rate=1e-2, logging_steps=1, quiet=True,
                      reward=reward)


@pytest.mark.slow
def test_grpo_with_env_metric_and_group_judge_stores_every_score_and_a_second_run_asks_nothing(tmp_path, tiny):
    with JudgeProcess(rule="length") as judge:
        out = train_grpo(grpo(tmp_path, tiny, reward_recipe(judge.base_url), steps=2)).checkpoint
        first = judge.stats()["requests"]
        store = Store(tmp_path / "store")
        rollouts = store.read().to_pylist()
        assert len(rollouts) == 16  # 2 steps x 2 tasks x 4 samples
        ann = store.read("annotations").to_pylist()
        for a in ann:
            assert a["kind"] == "score" and a["status"] == "ok" and a["run_id"] == next(
                r["run_id"] for r in rollouts if r["id"] == a["trajectory_id"])
            meta = json.loads(a["metadata"])
            assert meta["grpo_round"] == 2 and meta["grpo_step"] in (0, 1)
        per = {}
        for a in ann:
            per.setdefault(a["annotator"], []).append(a)
        # One annotation per component per rollout, plus the combined reward (env_reward is the row's own).
        assert sorted(per) == ["judge:brevity:group", "num_turns", "reward"]
        assert all(sorted(a["trajectory_id"] for a in rows) == sorted(r["id"] for r in rollouts)
                   for rows in per.values())
        judged = per["judge:brevity:group"]
        assert all(a["judge_model"] == "rule-judge" and a["rubric"] == "brevity" and a["prompt_hash"]
                   and a["prompt_tokens"] > 0 and a["cost_usd"] > 0 for a in judged)
        # Group judging: one call per (step, task) group of 4.
        assert first == 4
        # The stored combined reward is the recipe's formula over the stored components.
        by = {(a["annotator"], a["trajectory_id"]): a["score"] for a in ann}
        for r in rollouts:
            expected = r["reward"] + 0.1 * by[("num_turns", r["id"])] + by[("judge:brevity:group", r["id"])] / 10
            assert by[("reward", r["id"])] == pytest.approx(expected)
        record = json.loads((out / "omrl_grpo.json").read_text())
        assert [s["missing"] for s in record["reward_steps"]] == [{}, {}]
        assert record["reward_summary"]["judges"]["judge:brevity:group"]["calls"] == 4
        assert all("loss" in e and e["reward_missing"] == {} for e in record["log"])

        # The same run again (a fresh store, the first one's judge cache): every reply comes from the cache.
        shared = {**reward_recipe(judge.base_url), "cache": str(tmp_path / "store" / "cache" / "judge")}
        train_grpo(grpo(tmp_path, tiny, shared, store="store2", out="out2", steps=2))
        assert judge.stats()["requests"] == first
        again = json.loads((tmp_path / "out2" / "omrl_grpo.json").read_text())["reward_summary"]["judges"]
        assert again["judge:brevity:group"] == {**again["judge:brevity:group"], "calls": 0, "cache_hits": 4}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["500", "malformed", "badjson", "range"])
def test_failed_judge_calls_are_missing_components_renormalised_never_zero(tmp_path, tiny, fault):
    with JudgeProcess(rule="length", faults={fault: 1.0}) as judge:
        out = train_grpo(grpo(tmp_path, tiny, reward_recipe(judge.base_url, mode="pointwise"))).checkpoint
    store = Store(tmp_path / "store")
    ann = store.read("annotations").to_pylist()
    judged = [a for a in ann if a["annotator"] == "judge:brevity"]
    assert len(judged) == 8 and all(a["status"] == "error" and a["score"] is None for a in judged)
    rows = {r["id"]: r for r in store.read().to_pylist()}
    turns = {a["trajectory_id"]: a["score"] for a in ann if a["annotator"] == "num_turns"}
    total, present = 1.0 + 0.1 + 1.0, 1.0 + 0.1
    for a in (a for a in ann if a["annotator"] == "reward"):
        # Renormalised over env_reward and num_turns: the judge's absence is not a 0.
        expected = (rows[a["trajectory_id"]]["reward"] + 0.1 * turns[a["trajectory_id"]]) * total / present
        assert a["status"] == "ok" and a["score"] == pytest.approx(expected)
    record = json.loads((out / "omrl_grpo.json").read_text())
    steps = record["reward_steps"]
    assert steps == [{"step": 0, "scored": 8, "dropped": 0, "failed": 0, "missing": {"judge:brevity": 8},
                      "first_error": steps[0]["first_error"]}]
    assert "judge" in steps[0]["first_error"]
    # TRL's own log entry keeps its keys and gains the step's missing counts; the run summary totals them.
    assert "loss" in record["log"][0] and record["log"][0]["reward_missing"] == {"judge:brevity": 8}
    assert record["reward_summary"]["missing"] == {"judge:brevity": 8}


@pytest.mark.slow
def test_missing_null_drops_samples_and_a_step_without_any_reward_stops_with_the_first_error(tmp_path, tiny):
    with JudgeProcess(rule="length", faults={"500": 1.0}) as judge, \
            pytest.raises(RuntimeError, match="no rollout has a reward.*first error: judge:brevity.*500"):
        train_grpo(grpo(tmp_path, tiny, reward_recipe(judge.base_url, missing="null", mode="pointwise")))
    ann = Store(tmp_path / "store").read("annotations").to_pylist()
    rewards = [a for a in ann if a["annotator"] == "reward"]
    assert len(rewards) == 8 and all(a["status"] == "error" and "judge:brevity" in a["error"] for a in rewards)


@pytest.mark.slow
def test_some_failures_leave_those_samples_out_of_the_step(tmp_path, tiny):
    with JudgeProcess(rule="length", faults={"badjson": 0.5}) as judge:
        out = train_grpo(grpo(tmp_path, tiny, reward_recipe(judge.base_url, missing="null", mode="pointwise"))).checkpoint
    ann = Store(tmp_path / "store").read("annotations").to_pylist()
    bad = {a["trajectory_id"] for a in ann if a["annotator"] == "judge:brevity" and a["status"] == "error"}
    dropped = {a["trajectory_id"] for a in ann if a["annotator"] == "reward" and a["status"] == "error"}
    assert bad == dropped
    step = json.loads((out / "omrl_grpo.json").read_text())["reward_steps"][0]
    assert step["dropped"] == len(bad) and step["missing"] == ({"judge:brevity": len(bad)} if bad else {})


@pytest.mark.slow
def test_a_recipe_component_nothing_computes_is_refused(tmp_path, tiny):
    recipe = {"components": {"env_reward": 1.0, "judge:unknown": 1.0}}
    with pytest.raises(ValueError, match="no metric or judge computes component.*judge:unknown"):
        train_grpo(grpo(tmp_path, tiny, recipe))


def test_turn_rewards_keep_the_env_shaping_and_add_up_to_the_trained_reward():
    from omrl.train.rl.advantages import turn_rewards

    row = {"id": "a", "reward": 1.0, "turns": [{"reward": 0.0}, {"reward": 0.25}, {"reward": 0.75}]}
    assert turn_rewards(row) == [0.0, 0.25, 0.75]
    judged = turn_rewards(row, episode_reward=0.4)  # a judge's combined reward replaces the env's total
    assert judged == pytest.approx([0.0, 0.25, 0.15]) and sum(judged) == pytest.approx(0.4)
    assert turn_rewards({**row, "reward": None}) is None  # a failed episode: nothing, not zeros
    assert turn_rewards({**row, "turns": []}) is None
    with pytest.raises(ValueError, match="not finite"):
        turn_rewards(row, episode_reward=float("nan"))


@pytest.mark.slow
def test_omrl_train_grpo_takes_a_reward_recipe_file_and_reports_the_judge(tmp_path, tiny):
    import yaml
    from click.testing import CliRunner

    from omrl.cli.main import cli

    tasks = write_tasks([Task(id=f"t{i}", instruction="say", env="letter") for i in range(2)], tmp_path / "tasks.jsonl")
    with JudgeProcess(rule="length") as judge:
        path = tmp_path / "reward.yaml"
        path.write_text(yaml.safe_dump(reward_recipe(judge.base_url)))
        result = CliRunner().invoke(cli, [
            "train", "grpo", f"model={tiny}", f"tasks={tasks}", f"output_dir={tmp_path / 'out'}",
            f"store={tmp_path / 'store'}", f"reward={path}", "rollout.env=test_online_reward:LetterEnv",
            "rollout.max_turns=1", "rollout.max_new_tokens=4", "max_steps=1", "tasks_per_step=2",
            "samples_per_task=2", "warmup_steps=0", "logging_steps=1", "quiet=true"])
        assert result.exit_code == 0, result.output
        assert judge.stats()["requests"] == 2
    assert "4 rollouts scored, 0 dropped" in result.output and "judge:brevity:group: 2 calls" in result.output
    stored = Store(tmp_path / "store").sql("SELECT DISTINCT rubric FROM annotations WHERE annotator = 'reward'")
    assert stored.column("rubric").to_pylist() == [str(path)]
