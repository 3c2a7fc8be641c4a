"""The `twx` environment: TextWorldExpress games (env.py) played in an engine process (engine.py), tasks from
its seed folds (tasks.py)."""

from omrl.envs.twx.env import TwxEnv

__all__ = ["TwxEnv"]
