"""The `scienceworld` environment: ScienceWorld's task types (env.py) in its JVM simulator behind an engine
process (engine.py), tasks from its own variation splits (tasks.py)."""

from omrl.envs.scienceworld.env import SciWorldEnv

__all__ = ["SciWorldEnv"]
