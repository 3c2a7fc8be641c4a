"""The `grid` environment of the learning demo: navigation on a small board (env.py), open and walled tasks
(tasks.py)."""

from omrl.envs.grid.env import GridEnv
from omrl.envs.grid.tasks import grid_tasks, grid_wall_tasks

__all__ = ["GridEnv", "grid_tasks", "grid_wall_tasks"]
