"""The task files shipped in datasets/tasks, regenerated from the environments' own generators (deterministic)."""

from __future__ import annotations

from omrl.envs.grid.tasks import grid_tasks, grid_wall_tasks
from omrl.tasks import write_tasks


def write_shipped_grid_tasks(out_dir: str = "datasets/tasks", n_train: int = 1000, n_eval: int = 200,
                             seed: int = 0) -> list[str]:
    """Regenerate the shipped task files grid_train.jsonl and grid_eval.jsonl (deterministic)."""
    paths = []
    for split, n in (("train", n_train), ("eval", n_eval)):
        paths.append(str(write_tasks(grid_tasks(n, seed, split), f"{out_dir}/grid_{split}.jsonl")))
    return paths


def write_shipped_grid_wall_tasks(out_dir: str = "datasets/tasks", n_train: int = 1000, n_eval: int = 200,
                                  seed: int = 0) -> list[str]:
    """Regenerate the shipped walled-grid files grid_walls_train.jsonl and grid_walls_eval.jsonl."""
    paths = []
    for split, n in (("train", n_train), ("eval", n_eval)):
        paths.append(str(write_tasks(grid_wall_tasks(n, seed, split), f"{out_dir}/grid_walls_{split}.jsonl")))
    return paths
