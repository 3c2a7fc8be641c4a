"""The study file: what a study compares, on which tasks, at what budget, and its primary contrast, all declared
before anything runs, loaded by the one recipe loader (omrl.config).

    env: grid
    tasks: {train: shipped:grid_train, dev: "shipped:grid_eval[:100]", test: "shipped:grid_eval[100:]"}
    methods:
      sft: sft
      more_sft: {kind: more_sft, grid: {epochs: [1, 2]}}
      grpo: {kind: grpo, grid: {learning_rate: [1e-4, 3e-4]}}
    budget: {unit: optimizer_steps, value: 64}
    seeds: 5
    axis: expert_quality
    conditions: {gold: {}, noisy: {overrides: {demos.random_moves: 0.5}}}
    primary: {a: best_rl_on_dev, b: more_sft, metric: greedy, condition: noisy}

A task set is a tasks file (a path relative to the study file's folder, or `shipped:NAME`), optionally with a
row slice `[start:stop]` in Python's sense (`shipped:grid_eval[:100]`: its first 100 rows). `settings_hash`
names the frozen choices: any change of any key changes it; the test ledger (omrl.study.ledger) keys scorings
by it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from omrl.config import load_recipe

METHOD_KINDS = ("base", "sft", "more_sft", "rft", "grpo", "step_credit", "ppo_turn", "ppo_token", "iterate")
TRAINS_NOTHING = ("base", "sft")  # kinds that are a checkpoint of the shared stages, evaluated as they are
# The kinds that learn from the policy's own reward signal: the candidates of `best_rl_on_dev`. RFT (SFT on the
# policy's own successes) is the standard baseline the RL methods are measured against, so it is not one.
RL_KINDS = ("grpo", "step_credit", "ppo_turn", "ppo_token", "iterate")
BEST_RL_ON_DEV = "best_rl_on_dev"  # the RL method whose tuned score on dev (the contrast's metric) is highest
BUDGET_UNITS = ("optimizer_steps", "tokens", "env_steps", "seconds")
SPLITS = ("train", "dev", "test")
_SLICE = re.compile(r"^(?P<source>.+?)\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")


@dataclass(frozen=True)
class TaskSets:
    """The study's three task sets; held-out means new by fingerprint (omrl.study.overlap), not by seed."""

    train: str = field(metadata={"help": "tasks to learn from: a tasks file or shipped:NAME, optionally [start:stop]"})
    dev: str = field(metadata={"help": "tasks every tuning grid and best_rl_on_dev are chosen on"})
    test: str = field(metadata={"help": "held-out tasks, scored once per study (the test ledger)"})


@dataclass(frozen=True)
class Method:
    """One method of the study: its name, its kind, its small tuning grid (key -> the values tried) and the
    checkpoint it trains from."""

    name: str = field(metadata={"help": "the method's name in the study's tables"})
    kind: Literal["base", "sft", "more_sft", "rft", "grpo", "step_credit", "ppo_turn", "ppo_token", "iterate"] = field(
        metadata={"help": "the training method: " + ", ".join(METHOD_KINDS) + " (base and sft train nothing: "
                          "the starting model and the shared SFT checkpoint, evaluated)"})
    grid: dict[str, list[Any]] = field(default_factory=dict, metadata={
        "help": "the tuning grid: a recipe key -> the values tried on dev (each list non-empty)"})
    start: Literal["sft", "base"] = field(default="sft", metadata={
        "help": "the checkpoint it trains from: sft (the shared SFT stage's) or base (the starting model: RL "
                "from the base model); rft and the RL kinds only"})

    def __post_init__(self) -> None:
        if self.start != "sft" and self.kind in (*TRAINS_NOTHING, "more_sft"):
            raise ValueError(f"method {self.name}: start {self.start!r} is for rft and the RL kinds; a {self.kind} "
                             "method's checkpoint is fixed")
        for key, values in self.grid.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"method {self.name}: grid.{key} must be a non-empty list of values, not {values!r}")


@dataclass(frozen=True)
class Budget:
    """What each method gets; all four units are recorded anyway, `unit` is the one matched across methods."""

    unit: Literal["optimizer_steps", "tokens", "env_steps", "seconds"] = field(
        metadata={"help": "the matched unit: " + ", ".join(BUDGET_UNITS)})
    value: float = field(metadata={"help": "how much of `unit` every method gets (tuning counted apart)"})

    def __post_init__(self) -> None:
        if not self.value > 0:
            raise ValueError(f"budget.value must be positive, not {self.value!r}")


@dataclass(frozen=True)
class Condition:
    """One value of the study's axis (e.g. expert quality): its name and the recipe keys it overrides."""

    name: str = field(metadata={"help": "the condition's name"})
    overrides: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "recipe key -> value for every run under this condition"})


@dataclass(frozen=True)
class Contrast:
    """The primary contrast, declared before anything runs: a minus b, on `metric`, under `condition`."""

    a: str = field(metadata={"help": f"a method's name, or {BEST_RL_ON_DEV}"})
    b: str = field(metadata={"help": f"a method's name, or {BEST_RL_ON_DEV}"})
    metric: Literal["greedy", "sampled"] = field(metadata={
        "help": "held-out success greedy or sampled; dev selection uses the same figure"})
    condition: str = field(default="default", metadata={"help": "the condition the contrast is read under"})


@dataclass(frozen=True)
class StudySpec:
    """A whole study, checked on load: the contrast names existing methods, its condition exists, seeds >= 2."""

    env: str = field(metadata={"help": "the environment: a registered name or package.module:Class"})
    tasks: TaskSets = field(metadata={"help": "the train, dev and test task sets"})
    methods: list[Method] = field(metadata={"help": "the methods compared, as name: kind or name: {kind, grid}"})
    budget: Budget = field(metadata={"help": "the budget every method gets"})
    primary: Contrast = field(metadata={"help": "the primary contrast, declared up front"})
    name: str = field(default="study", metadata={"help": "the study's name"})
    recipe: str = field(default="shipped:quickstart", metadata={
        "help": "the iterate recipe every run starts from (a path relative to the study file, or shipped:NAME); "
                "the study's env, env_options and task sets replace its own, each condition's overrides apply"})
    env_options: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "the environment's constructor options (its options_class checks them)"})
    seeds: int = field(default=5, metadata={"help": "how many seeds each method runs (0 .. seeds-1), at least 2"})
    axis: str = field(default="condition", metadata={"help": "what the conditions vary, e.g. expert_quality"})
    conditions: list[Condition] = field(default_factory=lambda: [Condition("default")], metadata={
        "help": "the axis' values, as name: {overrides: {key: value}}"})
    drop_overlaps: bool = field(default=False, metadata={
        "help": "drop (and count) held-out tasks seen in train or the other held-out split instead of refusing"})

    def __post_init__(self) -> None:
        if self.seeds < 2:
            raise ValueError(f"seeds must be at least 2 (a seed-level interval needs two), not {self.seeds}")
        for kind, names in (("method", [m.name for m in self.methods]), ("condition", self.condition_names)):
            if not names:
                raise ValueError(f"a study needs at least one {kind}")
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{kind} {twice[0]!r} is declared twice")
        known = [m.name for m in self.methods]
        for side in ("a", "b"):
            name = getattr(self.primary, side)
            if name == BEST_RL_ON_DEV:
                if not any(m.kind in RL_KINDS for m in self.methods):
                    raise ValueError(f"primary.{side} is {BEST_RL_ON_DEV} but no method is RL ({', '.join(RL_KINDS)})")
            elif name not in known:
                raise ValueError(f"primary.{side} names {name!r}, not a method of the study "
                                 f"({', '.join(known)} or {BEST_RL_ON_DEV})")
        if self.primary.a == self.primary.b:
            raise ValueError(f"primary.a and primary.b are both {self.primary.a!r}")
        if self.primary.condition not in self.condition_names:
            raise ValueError(f"primary.condition names {self.primary.condition!r}, not a condition of the study "
                             f"({', '.join(self.condition_names)})")

    @property
    def condition_names(self) -> list[str]:
        return [c.name for c in self.conditions]

    def method(self, name: str) -> Method:
        """The method called `name` (KeyError when there is none)."""
        for m in self.methods:
            if m.name == name:
                return m
        raise KeyError(name)


def load_study(source: str | Path | dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> StudySpec:
    """The study in a YAML file (a path or `shipped:NAME`) or a mapping, plus `key=value` overrides; a RecipeError
    names the file and the key."""
    return load_recipe(source, StudySpec, overrides, where="study")


def settings_hash(spec: StudySpec) -> str:
    """16 hex digits of sha256 over the spec as canonical JSON (keys sorted, lists in declared order): the same
    choices give the same hash in any process, any change of any choice a different one."""
    data = dataclasses.asdict(spec)
    for method in data["methods"]:  # a method's start at its default is left out: studies written before it existed
        if method["start"] == "sft":  # keep their hash, so their test ledgers stay valid
            del method["start"]
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=repr)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()[:16]


def task_source(text: str, base: Path | None = None) -> tuple[str | Path, slice]:
    """A task set's source and row slice: `shipped:NAME` as it is, a path relative to `base` (the study file's
    folder) resolved there, `[start:stop]` taken off as the slice of rows (the whole file without one)."""
    match = _SLICE.match(text.strip())
    source, rows = text.strip(), slice(None)
    if match:
        source = match["source"]
        rows = slice(int(match["start"]) if match["start"] else None, int(match["stop"]) if match["stop"] else None)
    if source.startswith("shipped:") or base is None or Path(source).is_absolute():
        return source, rows
    return base / source, rows
