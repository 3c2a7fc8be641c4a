"""The study file (omrl.study.spec): loaded by the one recipe loader, checked on load, and its settings hash."""

from __future__ import annotations

import pytest

from omrl.config import RecipeError
from omrl.study.spec import load_study, settings_hash, task_source

STUDY = {
    "env": "grid",
    "tasks": {"train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl"},
    "methods": {"sft": "sft", "more_sft": {"kind": "more_sft", "grid": {"epochs": [1, 2]}},
                "grpo": {"kind": "grpo", "grid": {"learning_rate": [1e-4, 3e-4]}}},
    "budget": {"unit": "optimizer_steps", "value": 64},
    "axis": "expert_quality",
    "conditions": {"gold": {}, "noisy": {"overrides": {"demos.random_moves": 0.5}}},
    "primary": {"a": "best_rl_on_dev", "b": "more_sft", "metric": "greedy", "condition": "noisy"},
}


def test_a_study_file_loads_with_its_defaults(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("env: grid\ntasks: {train: a.jsonl, dev: b.jsonl, test: 'c.jsonl[:10]'}\n"
                    "methods: {sft: sft, grpo: {kind: grpo, grid: {learning_rate: [0.0001]}}}\n"
                    "budget: {unit: seconds, value: 600}\nprimary: {a: grpo, b: sft, metric: sampled}\n")
    spec = load_study(path)
    assert spec.seeds == 5 and spec.drop_overlaps is False and spec.env_options == {}
    assert [(m.name, m.kind, m.grid) for m in spec.methods] == [("sft", "sft", {}),
                                                                  ("grpo", "grpo", {"learning_rate": [0.0001]})]
    assert spec.condition_names == ["default"] and spec.primary.condition == "default"
    assert (spec.budget.unit, spec.budget.value) == ("seconds", 600.0)
    spec = load_study(STUDY)
    assert spec.axis == "expert_quality" and spec.conditions[1].overrides == {"demos.random_moves": 0.5}
    assert spec.method("more_sft").grid == {"epochs": [1, 2]}


@pytest.mark.parametrize(("change", "message"), [
    ({"primary": {"a": "ppo", "b": "more_sft", "metric": "greedy", "condition": "noisy"}},
     r"primary\.a names 'ppo', not a method of the study \(sft, more_sft, grpo or best_rl_on_dev\)"),
    ({"primary": {"a": "grpo", "b": "grpo", "metric": "greedy", "condition": "noisy"}}, "both 'grpo'"),
    ({"primary": {"a": "best_rl_on_dev", "b": "sft", "metric": "greedy", "condition": "half"}},
     r"primary\.condition names 'half', not a condition of the study \(gold, noisy\)"),
    ({"primary": {"a": "best_rl_on_dev", "b": "sft", "metric": "best", "condition": "gold"}},
     "primary.metric must be one of greedy, sampled"),
    ({"methods": {"sft": "sft", "more_sft": "more_sft"}}, "best_rl_on_dev but no method is RL"),
    ({"seeds": 1}, "seeds must be at least 2"),
    ({"methods": {"sft": "sft", "x": "dpo"}}, "must be one of base, sft, more_sft, rft"),
    ({"methods": {"sft": "sft", "more_sft": {"kind": "more_sft", "start": "base"}, "g": "grpo"}},
     "method more_sft: start 'base' is for rft and the RL kinds"),
    ({"methods": {"sft": "sft", "g": {"kind": "grpo", "start": "scratch"}}}, "start must be one of sft, base"),
    ({"methods": {"sft": "sft", "more_sft": {"kind": "more_sft", "grid": {"epochs": []}}, "g": "grpo"}},
     "grid.epochs must be a non-empty list"),
    ({"budget": {"unit": "flops", "value": 1}}, "budget.unit must be one of optimizer_steps, tokens, env_steps"),
    ({"budget": {"unit": "tokens", "value": 0}}, "budget.value must be positive"),
    ({"conditions": {}}, "at least one condition"),
    ({"colour": "red"}, "unknown key colour"),
])
def test_a_bad_study_is_refused_naming_the_key(change, message):
    with pytest.raises(RecipeError, match=message):
        load_study({**STUDY, **change})


def test_the_settings_hash_changes_with_every_choice():
    base = settings_hash(load_study(STUDY))
    assert settings_hash(load_study(dict(STUDY))) == base and len(base) == 16  # stable
    changes = ["env=math", "env_options.noise=0.1", "tasks.test=other.jsonl", "methods.grpo.grid.learning_rate=[1e-4]",
               "methods.grpo.kind=ppo_turn", "budget.unit=tokens", "budget.value=65", "seeds=4", "axis=noise",
               "conditions.gold.overrides.x=1", "primary.metric=sampled", "primary.condition=gold",
               "primary.b=sft", "drop_overlaps=true", "name=other", "methods.grpo.start=base"]
    hashes = {settings_hash(load_study(STUDY, [change])) for change in changes}
    assert base not in hashes and len(hashes) == len(changes)


def test_a_setting_added_later_keeps_the_hash_of_a_study_that_leaves_it_at_its_default():
    # a test ledger is keyed by this hash: an omrl upgrade must not turn an unchanged study into a changed one.
    # The Coin study's hash as it was when its run started, before methods had a `start`:
    assert settings_hash(load_study("shipped:studies/coin")) == "c5b62010d6648399"
    spec = load_study(STUDY, ["methods.grpo.start=sft"])  # the default written out: the same choice
    assert settings_hash(spec) == settings_hash(load_study(STUDY))


def test_a_task_set_may_name_a_row_slice(tmp_path):
    assert task_source("shipped:grid_eval[:100]", tmp_path) == ("shipped:grid_eval", slice(None, 100))
    assert task_source("sets/test.jsonl[10:-5]", tmp_path) == (tmp_path / "sets/test.jsonl", slice(10, -5))
    assert task_source("/abs/t.jsonl", tmp_path) == ("/abs/t.jsonl", slice(None))
