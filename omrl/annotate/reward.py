"""Combined reward: a recipe of weights over the env reward, metric annotators and judge annotators.

Recipe YAML (see recipes/reward.yaml):

    name: reward                       # annotator written by `omrl annotate --reward-recipe`
    components:
      env_reward: 1.0                  # "env_reward" is the trajectories.reward column
      exact_match: 0.5                 # any other name is an annotator (its latest ok score)
      judge:quality: {weight: 0.5, scale: [1, 10]}   # rescaled to 0..1 before weighting
    missing: null                      # or: renormalize
    metrics: [exact_match]             # optional: how metric components are computed online (default: the
                                       # components that are built-in metric names)
    judges:                            # optional: how judge components are computed online (GRPO, RFT, iterate)
      - {rubric: recipes/judges/quality.yaml, model: M, base_url: http://127.0.0.1:8000/v1, mode: pointwise,
         max_tokens: 256, max_prompt_tokens: 8192}   # keys: omrl.annotate.judge.judge_config
    cache: runs/judge-cache            # optional: the judge reply cache folder (default STORE/cache/judge)

reward = sum(weight * value). Missing components are explicit, never 0:
  missing: null         the row's reward is NULL when any component is missing (and counted);
  missing: renormalize  the weighted sum over present components, scaled by total/present weight
                        (equal to the plain sum when nothing is missing); NULL when none is present.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from omrl.config import load_recipe
from omrl.errors import UsageError
from omrl.store import Store

ENV_REWARD = "env_reward"
MissingPolicy = Literal["null", "renormalize"]  # a recipe's `missing`, checked when it is loaded


@dataclass
class Component:
    """One term of the combined reward: weight x the component's value (rescaled to 0..1 by `scale`)."""

    name: str = field(metadata={"help": "env_reward (the trajectories.reward column) or an annotator name"})
    weight: float = field(default=1.0, metadata={"help": "the term's weight"})
    scale: tuple[float, float] | None = field(default=None, metadata={"help": "[min, max] mapped to 0..1"})

    def __post_init__(self) -> None:
        if self.scale is not None and not self.scale[0] < self.scale[1]:
            raise UsageError(f"components.{self.name}.scale must be [min, max] with min below max")


@dataclass
class RewardRecipe:
    """A reward recipe (see the module docstring); loaded by `load_reward_recipe`, errors naming file and key."""

    components: list[Component] = field(metadata={
        "help": "name -> weight, or {weight, scale}: the terms of the sum"})
    name: str = field(default="reward", metadata={"help": "the annotator the combined reward is written as"})
    missing: MissingPolicy | None = field(default="null", metadata={"help": "null (or YAML null) or renormalize"})
    metrics: list[str] = field(default_factory=list, metadata={
        "comma": False, "help": "metric specs (omrl.annotate.metrics.load_metric) computing metric components"})
    judges: list[dict[str, Any]] = field(default_factory=list, metadata={
        "help": "judge specs (omrl.annotate.judge.judge_config) computing judge components"})
    cache: str | None = field(default=None, metadata={
        "help": "judge reply cache folder shared across stores (default: STORE/cache/judge)"})
    source: str = field(default="", init=False)  # the file it was read from ("<dict>": a mapping)

    def __post_init__(self) -> None:
        self.missing = "null" if self.missing is None else self.missing
        if not self.components:
            raise UsageError("'components' must map names to weights")
        for c in self.components:
            if c.name == self.name:
                raise UsageError(f"component {c.name!r} is the recipe's own output")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "missing": self.missing,
                "components": {c.name: {"weight": c.weight, **({"scale": list(c.scale)} if c.scale else {})}
                               for c in self.components},
                **({"metrics": self.metrics} if self.metrics else {}),
                **({"judges": [_shown(j) for j in self.judges]} if self.judges else {})}


def _shown(judge: dict[str, Any]) -> dict[str, Any]:
    """A judge spec as it is stored with the scores: a base URL without the credentials it may carry."""
    from omrl.schema.redact import display_url

    return {**judge, "base_url": display_url(judge["base_url"])} if isinstance(judge.get("base_url"), str) else judge


def load_reward_recipe(recipe: str | Path | dict[str, Any] | RewardRecipe) -> RewardRecipe:
    """A reward recipe from a YAML path (or `shipped:NAME`), a mapping, or as is (omrl.config.load_recipe)."""
    if isinstance(recipe, RewardRecipe):
        return recipe
    loaded = load_recipe(recipe, RewardRecipe, where="reward recipe <dict>")
    loaded.source = "<dict>" if isinstance(recipe, dict) else str(recipe)
    return loaded


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def components_sql(recipe: RewardRecipe, annotators: set[str] | None = None) -> str:
    """SQL over the store's views giving trajectory_id and one column per component (raw, unscaled).

    `annotators`: the columns present in `scores`; a component without a column is NULL (missing).
    When None, every component is assumed present. `combine` turns a row of it into the reward.
    """
    values = []
    for c in recipe.components:
        if c.name == ENV_REWARD:
            v = "t.reward"
        elif annotators is None or c.name in annotators:
            v = f"s.{_q(c.name)}"
        else:
            v = "CAST(NULL AS DOUBLE)"
        values.append(f"CAST({v} AS DOUBLE) AS {_q(c.name)}")
    return (f"SELECT t.id AS trajectory_id, {', '.join(values)} "
            f"FROM trajectories t LEFT JOIN scores s ON s.trajectory_id = t.id ORDER BY t.id")


def combine(recipe: RewardRecipe, values: dict[str, float | None]) -> tuple[float | None, list[str]]:
    """(reward, missing component names) from one trajectory's component values: the one combiner of
    `omrl annotate`, filter, RFT, GRPO and iterate. A value that is None or absent is missing, never 0."""
    present, missing = [], []
    for c in recipe.components:
        v = values.get(c.name)
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            missing.append(c.name)
            continue
        v = float(v)
        if c.scale:
            lo, hi = c.scale
            v = (v - lo) / (hi - lo)
        present.append((c.weight, v))
    total = sum(w * v for w, v in present)
    if recipe.missing == "null":
        return (None if missing else total), missing
    weight = sum(w for w, _ in present)
    if not present or weight == 0:  # nothing (with weight) to renormalise over
        return None, missing
    return total * sum(c.weight for c in recipe.components) / weight, missing


def score_columns(con) -> set[str]:
    """The annotator columns of the `scores` view."""
    return {r[0] for r in con.execute("DESCRIBE scores").fetchall()} - {"trajectory_id", "n_annotations"}


def combined_reward(store: Store | str | Path, recipe: str | Path | dict[str, Any] | RewardRecipe) -> pa.Table:
    """Arrow table (trajectory_id string, reward float64 | null, missing string) for every trajectory.

    `reward` is NULL where a component is missing under `missing: null`; `missing` names the absent
    components, comma-separated ("" when none). Uses the latest ok annotation per annotator.
    """
    store = store if isinstance(store, Store) else Store(store)
    recipe = load_reward_recipe(recipe)
    con = store.connect()
    table = con.sql(components_sql(recipe, score_columns(con))).to_arrow_table()
    ids, rewards, missing = table.column("trajectory_id").to_pylist(), [], []
    for values in table.drop_columns(["trajectory_id"]).to_pylist():
        reward, absent = combine(recipe, values)
        rewards.append(reward)
        missing.append(",".join(absent))
    return pa.table({"trajectory_id": pa.array(ids, pa.string()), "reward": pa.array(rewards, pa.float64()),
                     "missing": pa.array(missing, pa.string())})


def reward_annotations(table: pa.Table | list[dict[str, Any]], recipe: RewardRecipe, run_id: str
                       ) -> list[dict[str, Any]]:
    """Annotation rows for combined rewards (a combined_reward table, or its rows as dicts; run_id per row
    when a row has one): ok with the score, or an error naming what is missing."""
    rows = []
    meta = {"recipe": recipe.to_dict(), "source": recipe.source}
    for r in table.to_pylist() if isinstance(table, pa.Table) else table:
        base = {"trajectory_id": r["trajectory_id"], "annotator": recipe.name, "kind": "score",
                "rubric": recipe.source or None, "run_id": r.get("run_id") or run_id,
                "metadata": {**meta, "missing": [m for m in (r["missing"] or "").split(",") if m]}}
        if r["reward"] is None:
            rows.append({**base, "status": "error", "error": f"missing component(s): {r['missing'] or '?'}"})
        else:
            rows.append({**base, "status": "ok", "score": r["reward"]})
    return rows
