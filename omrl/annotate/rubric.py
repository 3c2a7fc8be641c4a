"""Judge rubrics: YAML files (recipes/judges/*.yaml) naming the criteria, the score scale and examples."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.recipes import read_yaml


@dataclass
class Example:
    """A few-shot example: a trajectory rendering and the verdict the judge should give it."""

    trajectory: str
    score: float
    rationale: str = ""


@dataclass
class Rubric:
    name: str
    criteria: list[str]
    scale_min: float = 0.0
    scale_max: float = 1.0
    instructions: str = ""
    examples: list[Example] = field(default_factory=list)
    annotator: str = ""  # the annotator name written to the store; default "judge:<name>"
    source: str = ""  # the file it came from

    def __post_init__(self) -> None:
        if not self.annotator:
            self.annotator = f"judge:{self.name}"

    def describe(self) -> str:
        """The rubric as the judge reads it."""
        lines = [self.instructions.strip()] if self.instructions.strip() else []
        lines.append("Criteria:")
        lines += [f"- {c}" for c in self.criteria]
        lines.append(f"Scale: from {self.scale_min:g} (worst) to {self.scale_max:g} (best).")
        return "\n".join(lines)

    def in_range(self, score: float) -> bool:
        return self.scale_min <= score <= self.scale_max


def rubric_from_dict(data: dict[str, Any], source: str = "<dict>") -> Rubric:
    """Validate a rubric mapping; errors name the file and the key."""
    if not isinstance(data, dict):
        raise UsageError(f"rubric {source}: expected a mapping at the top level")
    unknown = set(data) - {"name", "criteria", "scale", "instructions", "examples", "annotator"}
    if unknown:
        raise UsageError(f"rubric {source}: unknown key(s) {', '.join(sorted(unknown))}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise UsageError(f"rubric {source}: 'name' must be a non-empty string")
    criteria = data.get("criteria")
    if isinstance(criteria, str):
        criteria = [criteria]
    if not isinstance(criteria, list) or not criteria or not all(isinstance(c, str) for c in criteria):
        raise UsageError(f"rubric {source}: 'criteria' must be a non-empty list of strings")
    scale = data.get("scale") or {"min": 0, "max": 1}
    try:
        lo, hi = float(scale["min"]), float(scale["max"])
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"rubric {source}: 'scale' must be a mapping with numeric min and max") from None
    if lo >= hi:
        raise UsageError(f"rubric {source}: scale min {lo} must be below max {hi}")
    examples = []
    for i, ex in enumerate(data.get("examples") or []):
        if not isinstance(ex, dict) or "trajectory" not in ex or "score" not in ex:
            raise UsageError(f"rubric {source}: examples[{i}] needs 'trajectory' and 'score'")
        if not lo <= float(ex["score"]) <= hi:
            raise UsageError(f"rubric {source}: examples[{i}].score {ex['score']} is outside the scale")
        examples.append(Example(str(ex["trajectory"]), float(ex["score"]), str(ex.get("rationale", ""))))
    return Rubric(name=name, criteria=criteria, scale_min=lo, scale_max=hi,
                  instructions=str(data.get("instructions") or ""), examples=examples,
                  annotator=str(data.get("annotator") or ""), source=source)


def load_rubric(path: str | Path) -> Rubric:
    """Read and validate a rubric YAML file (or `shipped:NAME`, e.g. `shipped:judges/grid_goal`)."""
    return rubric_from_dict(read_yaml(path), str(path))
