"""Judge rubrics: YAML files (recipes/judges/*.yaml) naming the criteria, the score scale and examples."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.config import load_recipe
from omrl.errors import UsageError


@dataclass
class Example:
    """A few-shot example: a trajectory rendering and the verdict the judge should give it."""

    trajectory: str = field(metadata={"help": "the trajectory as the judge reads it"})
    score: float = field(metadata={"help": "the score it deserves (within the scale)"})
    rationale: str = field(default="", metadata={"help": "why"})


@dataclass
class Scale:
    min: float = field(default=0.0, metadata={"help": "the worst score"})
    max: float = field(default=1.0, metadata={"help": "the best score"})

    def __post_init__(self) -> None:
        if self.min >= self.max:
            raise UsageError(f"scale min {self.min} must be below max {self.max}")


@dataclass
class Rubric:
    """A judge rubric (recipes/judges/*.yaml); loaded by `load_rubric`, errors naming file and key."""

    name: str = field(metadata={"help": "the rubric's name; the annotator is judge:<name> by default"})
    criteria: list[str] = field(metadata={"comma": False, "help": "what the judge checks (text or a list)"})
    scale: Scale = field(default_factory=Scale, metadata={"help": "the score range {min, max}"})
    instructions: str = field(default="", metadata={"help": "text put before the criteria"})
    examples: list[Example] = field(default_factory=list, metadata={"help": "few-shot examples"})
    annotator: str = field(default="", metadata={"help": "the annotator name written to the store"})
    source: str = field(default="", init=False)  # the file it came from

    def __post_init__(self) -> None:
        if not self.name:
            raise UsageError("'name' must be a non-empty string")
        if not self.criteria:
            raise UsageError("'criteria' must be a non-empty list of strings")
        for i, example in enumerate(self.examples):
            if not self.in_range(example.score):
                raise UsageError(f"examples[{i}].score {example.score:g} is outside the scale")
        if not self.annotator:
            self.annotator = f"judge:{self.name}"

    @property
    def scale_min(self) -> float:
        return self.scale.min

    @property
    def scale_max(self) -> float:
        return self.scale.max

    def describe(self) -> str:
        """The rubric as the judge reads it."""
        lines = [self.instructions.strip()] if self.instructions.strip() else []
        lines.append("Criteria:")
        lines += [f"- {c}" for c in self.criteria]
        lines.append(f"Scale: from {self.scale_min:g} (worst) to {self.scale_max:g} (best).")
        return "\n".join(lines)

    def in_range(self, score: float) -> bool:
        return self.scale_min <= score <= self.scale_max


def load_rubric(source: str | Path | dict[str, Any], where: str = "rubric <dict>") -> Rubric:
    """A rubric from a YAML file (or `shipped:NAME`, e.g. `shipped:judges/grid_goal`), or from a mapping
    (an inline rubric, named `where` in errors), by omrl.config.load_recipe."""
    rubric = load_recipe(source, Rubric, where=where)
    rubric.source = where if isinstance(source, dict) else str(source)
    return rubric
