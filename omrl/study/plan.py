"""A study's plan as recipe keys: dotted grid points and budgets, and what omrl study run refuses up front.

    grid_points({"learning_rate": [1e-4, 3e-4]})         # [{"learning_rate": 1e-4}, {"learning_rate": 3e-4}]
    budget_settings(spec, "grpo", recipe, point)          # {"max_steps": 64}
"""

from __future__ import annotations

import itertools
from typing import Any

from omrl.errors import UsageError
from omrl.study.spec import TRAINS_NOTHING, StudySpec


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: grid points and budgets as dotted recipe keys."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def unflatten(values: dict[str, Any]) -> dict[str, Any]:
    """{"a.b": 1} -> {"a": {"b": 1}}: dotted recipe keys as the trainers' nested settings."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every point of a method's grid (the product of its lists, in declared order); [{}] for no grid."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def budget_keys(kind: str) -> tuple[str, ...]:
    """The recipe keys the study's budget sets for a method of `kind` (a grid may not tune them)."""
    return {"base": (), "sft": (), "more_sft": ("max_steps", "epochs"), "rft": ("sft.max_steps", "sft.epochs"),
            "iterate": ("grpo.max_steps",)}.get(kind, ("max_steps",))


def budget_settings(spec: StudySpec, kind: str, recipe: Any, point: dict[str, Any]) -> dict[str, Any]:
    """The dotted recipe keys that give a method of `kind` (at grid `point`) the study's budget."""
    steps = int(spec.budget.value)
    if kind in TRAINS_NOTHING:
        return {}
    if kind == "more_sft":
        return {"max_steps": steps}
    if kind == "rft":
        return {"sft.max_steps": steps}
    if kind == "iterate":  # the budget spread over its rounds, each a GRPO run of grpo.max_steps
        return {"grpo.max_steps": max(1, steps // int(point.get("rounds", recipe.rounds)))}
    if kind.startswith("ppo_"):  # a PPO step is one rollout batch of ppo_epochs x minibatches optimizer steps
        per_batch = point.get("ppo_epochs", recipe.ppo.ppo_epochs) * point.get("minibatches", recipe.ppo.minibatches)
        return {"max_steps": max(1, steps // per_batch)}
    return {"max_steps": steps}


def recipe_class(kind: str) -> Any:
    """The recipe class whose keys a method of `kind` tunes (its grid keys; RFT's `sft.*` and bare SFT keys
    tune the SFT on its kept attempts; iterate's are iterate keys: rounds, grpo.*, collect.*, filter.*); None for
    base and sft, which train nothing."""
    from omrl.train.config.grpo import GRPORecipe
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.config.ppo import PPORecipe
    from omrl.train.config.rft import RFTRecipe
    from omrl.train.config.sft import SFTRecipe

    return {"more_sft": SFTRecipe, "rft": RFTRecipe, "grpo": GRPORecipe, "step_credit": GRPORecipe,
            "ppo_turn": PPORecipe, "ppo_token": PPORecipe, "iterate": IterateRecipe}.get(kind)


def unknown_grid_key(kind: str, key: str) -> bool:
    """Whether grid key `key` (dotted) names no setting of a `kind` method's recipe (checked by its first part)."""
    import dataclasses

    from omrl.train.config.sft import SFTRecipe

    known = {f.name for f in dataclasses.fields(recipe_class(kind))}
    if kind == "rft":  # the rest of an RFT grid tunes its SFT section (omrl.study.run._train_rft)
        known |= {f.name for f in dataclasses.fields(SFTRecipe)}
    return key.split(".")[0] not in known


def check_runnable(spec: StudySpec) -> None:
    """UsageError, before anything runs, for what the runner cannot do: a budget unit other than optimizer
    steps, a grid on base or sft, on a key its recipe does not have or on a key the budget sets, a greedy contrast
    without greedy evaluations."""
    if spec.budget.unit != "optimizer_steps":
        raise UsageError(f"budget.unit {spec.budget.unit!r}: omrl study run matches optimizer_steps only so far "
                         "(tokens, env_steps and seconds are recorded for every run)")
    for method in spec.methods:
        if method.kind in TRAINS_NOTHING and method.grid:
            raise UsageError(f"method {method.name}: {method.kind} trains nothing (a checkpoint of the shared "
                             "stages); it has no grid")
        unknown = sorted(key for key in method.grid if unknown_grid_key(method.kind, key))
        if unknown:
            raise UsageError(f"method {method.name}: grid.{unknown[0]} is not a setting of a {method.kind} run "
                             f"({recipe_class(method.kind).__name__}'s keys)")
        clash = sorted(set(flatten(method.grid)) & set(budget_keys(method.kind)))
        if clash:
            raise UsageError(f"method {method.name}: grid.{clash[0]} is set by the budget "
                             f"({spec.budget.value:g} {spec.budget.unit}): tune another key")
    for condition in spec.conditions:
        if spec.primary.metric == "greedy" and flatten(condition.overrides).get("eval.greedy") is False:
            raise UsageError(f"condition {condition.name}: eval.greedy false, but the primary metric is greedy")
