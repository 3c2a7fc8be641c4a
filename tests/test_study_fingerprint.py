"""Task fingerprints (omrl.study.fingerprint) and the overlap screen (omrl.study.overlap): a train task copied
into test under another id is caught, refused, or dropped and counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omrl.envs.base import Reset, Task
from omrl.shipped import resolve_tasks
from omrl.study.fingerprint import DROPPED_PAYLOAD_KEYS, fingerprint_tasks, task_fingerprint
from omrl.study.overlap import OverlapError, overlap_report, screen
from omrl.study.spec import load_study
from omrl.study.tasksets import screened_task_sets


class SeedGame:
    """A game whose first observation depends on the payload's `map` only (as a generated game on its seed)."""

    def __init__(self, structure: str | None = None) -> None:
        self.structure = structure

    def reset(self, task: Task) -> Reset:
        return Reset(observation=f"you are in room {task.payload.get('map')}")

    def fingerprint(self, task: Task) -> str | None:
        return self.structure


def _task(task_id: str, **payload) -> Task:
    return Task(id=task_id, instruction="find the coin", payload=payload)


def test_labels_and_seeds_do_not_make_a_task_new_but_content_does():
    env = SeedGame()
    train = _task("a-train-1", map=3, seed=11, fold="train", source="generated", split="train")
    assert task_fingerprint(env, train) == task_fingerprint(env, _task("b-test-2", map=3, seed=97, fold="test"))
    assert task_fingerprint(env, train) != task_fingerprint(env, _task("c", map=4, seed=11, fold="train"))
    assert task_fingerprint(env, train) != task_fingerprint(env, _task("d", map=3, seed=11, step_limit=12))
    assert set(DROPPED_PAYLOAD_KEYS) == {"id", "task_id", "split", "fold", "seed", "source"}


def test_the_environment_hook_adds_the_game_structure():
    a, b = _task("a", map=3), _task("b", map=3)
    assert task_fingerprint(SeedGame("rooms: kitchen, hall"), a) != task_fingerprint(SeedGame("rooms: hall"), b)
    assert task_fingerprint(SeedGame("rooms: hall"), a) == task_fingerprint(SeedGame("rooms: hall"), b)
    assert task_fingerprint(SeedGame(None), a) == task_fingerprint(SeedGame(None), b)


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _grid_sets(tmp_path, copied: bool):
    rows = [json.loads(line) for line in Path(resolve_tasks("shipped:grid_train")).read_text().splitlines()][:30]
    train, dev, test = rows[:20], rows[20:25], rows[25:30]
    if copied:  # a train task copied into test under another id: the same task to the agent
        test = [*test, {**train[3], "id": "fresh-looking-id", "split": "test"}]
    for name, part in (("train", train), ("dev", dev), ("test", test)):
        _write(tmp_path / f"{name}.jsonl", part)
    return {"env": "grid", "tasks": {"train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl"},
            "methods": {"sft": "sft", "grpo": "grpo"}, "budget": {"unit": "optimizer_steps", "value": 4},
            "seeds": 2, "primary": {"a": "grpo", "b": "sft", "metric": "greedy"}}


def test_a_duplicated_test_task_is_refused_or_dropped_and_counted(tmp_path):
    study = _grid_sets(tmp_path, copied=True)
    with pytest.raises(OverlapError, match=r"test_train_overlap 1, .*test task 'fresh-looking-id'.*drop_overlaps") as exc:
        screened_task_sets(load_study(study), tmp_path)
    assert exc.value.report["test_train_overlap"] == 1 and exc.value.report["test_tasks"] == 6
    screened, fingerprints = screened_task_sets(load_study(study, ["drop_overlaps=true"]), tmp_path)
    assert [t.id for t in screened.test] == [t["id"] for t in map(json.loads, (tmp_path / "test.jsonl").read_text().splitlines())][:5]
    assert screened.report["test_train_overlap"] == 0 and screened.report["dropped_test_tasks"] == 1
    assert screened.report["test_tasks"] == screened.report["distinct_test_tasks"] == 5
    assert fingerprints["test"]["fresh-looking-id"] in fingerprints["train"].values()
    clean, _ = screened_task_sets(load_study(_grid_sets(tmp_path, copied=False)), tmp_path)
    assert (clean.report["test_train_overlap"], clean.report["dev_test_overlap"], clean.report["distinct_test_tasks"],
            clean.report["dropped_test_tasks"]) == (0, 0, 5, 0)


def test_dev_gives_way_to_test_and_duplicates_inside_a_set_are_counted():
    fingerprints = {"train": {"t1": "A", "t2": "B"}, "dev": {"d1": "C", "d2": "D", "d3": "A"},
                    "test": {"x1": "D", "x2": "E", "x3": "E", "x4": "B"}}
    report = overlap_report(fingerprints)
    assert (report["distinct_test_tasks"], report["distinct_dev_tasks"], report["test_train_overlap"],
            report["dev_train_overlap"], report["dev_test_overlap"]) == (3, 3, 1, 1, 1)
    tasks = {split: [_task(i) for i in ids] for split, ids in fingerprints.items()}
    with pytest.raises(OverlapError):
        screen(tasks, fingerprints, drop=False)
    kept = screen(tasks, fingerprints, drop=True)
    assert [t.id for t in kept.dev] == ["d1"] and [t.id for t in kept.test] == ["x1", "x2", "x3"]
    assert (kept.report["dropped_dev_tasks"], kept.report["dropped_test_tasks"], kept.report["distinct_test_tasks"],
            kept.report["dev_test_overlap"], kept.report["test_train_overlap"]) == (2, 1, 2, 0, 0)
    with pytest.raises(OverlapError, match="every dev task"):
        screen(tasks, {**fingerprints, "dev": {"d1": "A", "d2": "B", "d3": "D"}}, drop=True)


class Counting(SeedGame):
    """A SeedGame that counts its instances, made by name through the environment registry."""

    made: list[Counting] = []

    def __init__(self) -> None:
        super().__init__()
        Counting.made.append(self)

    def step(self, action): ...

    def close(self) -> None: ...


def test_a_fresh_environment_per_task_unless_reusable(monkeypatch):
    tasks = [_task(f"t{i}", map=i) for i in range(3)]
    monkeypatch.setattr(Counting, "made", [])
    prints = fingerprint_tasks(f"{__name__}:Counting", tasks)
    assert len(Counting.made) == 3 and len(set(prints.values())) == 3
    monkeypatch.setattr(Counting, "reusable", True, raising=False)
    monkeypatch.setattr(Counting, "made", [])
    assert fingerprint_tasks(f"{__name__}:Counting", tasks) == prints and len(Counting.made) == 1
