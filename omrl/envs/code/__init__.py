"""The `code` environment: repair a small Python project, tests run in the sandbox (env.py); its projects
(projects.py), the shipped tasks (tasks.py) and the expert replaying a task's fix (expert.py)."""

from omrl.envs.code.env import CodeEnv
from omrl.envs.code.projects import project_files

__all__ = ["CodeEnv", "project_files"]
