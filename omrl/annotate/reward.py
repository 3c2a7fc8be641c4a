"""Combined reward: a recipe of weights over the env reward, metric annotators and judge annotators.

Recipe YAML (see recipes/reward.yaml):

    name: reward                       # annotator written by `omrl annotate --reward-recipe`
    components:
      env_reward: 1.0                  # "env_reward" is the trajectories.reward column
      exact_match: 0.5                 # any other name is an annotator (its latest ok score)
      judge:quality: {weight: 0.5, scale: [1, 10]}   # rescaled to 0..1 before weighting
    missing: null                      # or: renormalize

reward = sum(weight * value). Missing components are explicit, never 0:
  missing: null         the row's reward is NULL when any component is missing (and counted);
  missing: renormalize  the weighted sum over present components, scaled by total/present weight
                        (equal to the plain sum when nothing is missing); NULL when none is present.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from omrl.store import Store

ENV_REWARD = "env_reward"
MISSING_POLICIES = ("null", "renormalize")


@dataclass
class Component:
    name: str
    weight: float
    scale: tuple[float, float] | None = None  # (min, max) mapped to (0, 1)


@dataclass
class RewardRecipe:
    name: str = "reward"
    components: list[Component] = field(default_factory=list)
    missing: str = "null"
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "missing": self.missing,
                "components": {c.name: {"weight": c.weight, **({"scale": list(c.scale)} if c.scale else {})}
                               for c in self.components}}


def recipe_from_dict(data: dict[str, Any], source: str = "<dict>") -> RewardRecipe:
    """Validate a reward recipe mapping; errors name the file and the key."""
    if not isinstance(data, dict):
        raise ValueError(f"reward recipe {source}: expected a mapping")
    unknown = set(data) - {"name", "components", "missing"}
    if unknown:
        raise ValueError(f"reward recipe {source}: unknown key(s) {', '.join(sorted(unknown))}")
    name = str(data.get("name") or "reward")
    missing = "null" if data.get("missing") is None else str(data["missing"])
    if missing not in MISSING_POLICIES:
        raise ValueError(f"reward recipe {source}: 'missing' must be null or renormalize, got {missing!r}")
    raw = data.get("components")
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"reward recipe {source}: 'components' must map names to weights")
    components = []
    for cname, spec in raw.items():
        if cname == name:
            raise ValueError(f"reward recipe {source}: component {cname!r} is the recipe's own output")
        scale = None
        if isinstance(spec, dict):
            extra = set(spec) - {"weight", "scale"}
            if extra:
                raise ValueError(f"reward recipe {source}: components.{cname}: unknown key(s) {sorted(extra)}")
            weight = spec.get("weight", 1.0)
            if spec.get("scale") is not None:
                s = spec["scale"]
                if not (isinstance(s, list) and len(s) == 2 and float(s[0]) < float(s[1])):
                    raise ValueError(f"reward recipe {source}: components.{cname}.scale must be [min, max]")
                scale = (float(s[0]), float(s[1]))
        else:
            weight = spec
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ValueError(f"reward recipe {source}: components.{cname} weight must be a number")
        components.append(Component(str(cname), float(weight), scale))
    return RewardRecipe(name=name, components=components, missing=missing, source=source)


def load_recipe(recipe: str | Path | dict[str, Any] | RewardRecipe) -> RewardRecipe:
    """A recipe from a YAML path, a mapping, or as is."""
    if isinstance(recipe, RewardRecipe):
        return recipe
    if isinstance(recipe, dict):
        return recipe_from_dict(recipe)
    path = Path(recipe)
    if not path.is_file():
        raise FileNotFoundError(f"reward recipe {path} not found")
    return recipe_from_dict(yaml.safe_load(path.read_text()), str(path))


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def reward_sql(recipe: RewardRecipe, annotators: set[str] | None = None) -> str:
    """SQL over the store's views giving (trajectory_id, reward, missing) for every trajectory.

    `annotators`: the columns present in `scores`; a component without a column is NULL (missing).
    When None, every component is assumed present. `missing` lists absent components, comma-separated.
    """
    values = []
    for c in recipe.components:
        if c.name == ENV_REWARD:
            v = "t.reward"
        elif annotators is None or c.name in annotators:
            v = f"s.{_q(c.name)}"
        else:
            v = "CAST(NULL AS DOUBLE)"
        if c.scale:
            lo, hi = c.scale
            v = f"(({v}) - {lo!r}) / {hi - lo!r}"
        values.append((c, f"({v})"))
    terms = " + ".join(f"{c.weight!r} * {v}" for c, v in values)
    if recipe.missing == "null":
        reward = terms
    else:
        present = " + ".join(f"(CASE WHEN {v} IS NULL THEN 0 ELSE {c.weight!r} END)" for c, v in values)
        total = sum(c.weight for c in recipe.components)
        filled = " + ".join(f"{c.weight!r} * coalesce({v}, 0)" for c, v in values)
        reward = f"({filled}) * {total!r} / nullif({present}, 0)"
    missing = ", ".join(f"CASE WHEN {v} IS NULL THEN {_lit(c.name)} END" for c, v in values)
    return (f"SELECT t.id AS trajectory_id, CAST({reward} AS DOUBLE) AS reward, "
            f"concat_ws(',', {missing}) AS missing "
            f"FROM trajectories t LEFT JOIN scores s ON s.trajectory_id = t.id ORDER BY t.id")


def score_columns(con) -> set[str]:
    """The annotator columns of the `scores` view."""
    return {r[0] for r in con.execute("DESCRIBE scores").fetchall()} - {"trajectory_id", "n_annotations"}


def combined_reward(store: Store | str | Path, recipe: str | Path | dict[str, Any] | RewardRecipe) -> pa.Table:
    """Arrow table (trajectory_id string, reward float64 | null, missing string) for every trajectory.

    `reward` is NULL where a component is missing under `missing: null`; `missing` names the absent
    components ("" when none). Uses the latest ok annotation per annotator.
    """
    store = store if isinstance(store, Store) else Store(store)
    recipe = load_recipe(recipe)
    con = store.connect()
    return con.sql(reward_sql(recipe, score_columns(con))).to_arrow_table()


def reward_annotations(table: pa.Table, recipe: RewardRecipe, run_id: str) -> list[dict[str, Any]]:
    """Annotation rows for a combined-reward table: ok with the score, or an error naming what is missing."""
    rows = []
    meta = {"recipe": recipe.to_dict(), "source": recipe.source}
    for r in table.to_pylist():
        base = {"trajectory_id": r["trajectory_id"], "annotator": recipe.name, "kind": "score",
                "rubric": recipe.source or None, "run_id": run_id, "metadata": meta}
        if r["reward"] is None:
            rows.append({**base, "status": "error", "error": f"missing component(s): {r['missing'] or '?'}"})
        else:
            rows.append({**base, "status": "ok", "score": r["reward"]})
    return rows
