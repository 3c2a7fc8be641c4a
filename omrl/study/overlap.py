"""Held-out sets that are new: the overlap report of a study's task sets by fingerprint, and the refusal.

A test task whose fingerprint appears in train, and a dev task whose fingerprint appears in train or in test,
is an overlap: the study refuses it (OverlapError), or with `drop_overlaps` drops it and counts it. Dev gives
way to test where the two meet (the test set stays as declared; what dev shared with it goes), so after the
drop both held-out sets are new to train and to each other. Duplicates inside one set stay: they are counted
(`distinct_test_tasks` < `test_tasks`) and grouped by fingerprint in the statistics (omrl.study.stats).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omrl.envs.base import Task
from omrl.errors import UsageError


class OverlapError(UsageError):
    """A study whose dev or test set holds tasks the agent has seen, refused (drop_overlaps: drop them instead);
    `report` is the overlap report of the sets as declared."""

    def __init__(self, message: str, report: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Screened:
    """The task sets a study uses after the screen, and the report of what it found."""

    train: list[Task]
    dev: list[Task]
    test: list[Task]
    report: dict[str, Any]


def overlap_report(fingerprints: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Counts over split -> (task id -> fingerprint) for train, dev and test: the sets' sizes, their distinct
    tasks, and how many held-out tasks share a fingerprint with train or with the other held-out split."""
    train, dev, test = (set(fingerprints[s].values()) for s in ("train", "dev", "test"))
    return {
        "train_tasks": len(fingerprints["train"]),
        "dev_tasks": len(fingerprints["dev"]),
        "test_tasks": len(fingerprints["test"]),
        "distinct_train_tasks": len(train),
        "distinct_dev_tasks": len(dev),
        "distinct_test_tasks": len(test),
        "test_train_overlap": sum(fp in train for fp in fingerprints["test"].values()),
        "dev_train_overlap": sum(fp in train for fp in fingerprints["dev"].values()),
        "dev_test_overlap": sum(fp in test for fp in fingerprints["dev"].values()),
    }


def overlapping(fingerprints: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """The ids of the held-out tasks the screen takes out: test tasks seen in train, dev tasks seen in train or
    test."""
    train, test = set(fingerprints["train"].values()), set(fingerprints["test"].values())
    return {"test": [i for i, fp in fingerprints["test"].items() if fp in train],
            "dev": [i for i, fp in fingerprints["dev"].items() if fp in train or fp in test]}


def screen(tasks: dict[str, list[Task]], fingerprints: dict[str, dict[str, str]], *, drop: bool) -> Screened:
    """The study's task sets with no held-out task seen before, or OverlapError naming the counts and one
    example; `drop`: the overlapping tasks are dropped instead, counted in `dropped_dev_tasks` and
    `dropped_test_tasks`, and the report describes the sets as used (its overlaps 0)."""
    found = overlap_report(fingerprints)
    gone = overlapping(fingerprints)
    if not gone["test"] and not gone["dev"]:
        return Screened(tasks["train"], tasks["dev"], tasks["test"],
                        {**found, "dropped_dev_tasks": 0, "dropped_test_tasks": 0})
    if not drop:
        example = (gone["test"] or gone["dev"])[0]
        raise OverlapError(
            f"held-out tasks the agent has seen: test_train_overlap {found['test_train_overlap']}, "
            f"dev_train_overlap {found['dev_train_overlap']}, dev_test_overlap {found['dev_test_overlap']} "
            f"(e.g. {'test' if gone['test'] else 'dev'} task {example!r}); "
            "set drop_overlaps: true to drop and count them", {**found, "dropped_dev_tasks": 0, "dropped_test_tasks": 0})
    kept = {split: [t for t in tasks[split] if t.id not in set(gone.get(split, ()))] for split in ("dev", "test")}
    for split in ("dev", "test"):
        if not kept[split]:
            raise OverlapError(f"every {split} task is seen in train or the other held-out split: none is left",
                               found)
    used = {"train": fingerprints["train"],
            **{split: {t.id: fingerprints[split][t.id] for t in kept[split]} for split in ("dev", "test")}}
    return Screened(tasks["train"], kept["dev"], kept["test"],
                    {**overlap_report(used), "dropped_dev_tasks": len(gone["dev"]),
                     "dropped_test_tasks": len(gone["test"])})
