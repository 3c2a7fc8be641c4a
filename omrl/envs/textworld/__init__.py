"""The `textworld` environment: generated TextWorld adventures played through an engine process (env.py), tasks
as game seeds of a split with a theme's options (tasks.py)."""

from omrl.envs.textworld.env import TextWorldEnv, build_games

__all__ = ["TextWorldEnv", "build_games"]
