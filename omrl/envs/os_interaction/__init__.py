"""The `os` environment: AgentBench OS interaction in a sandboxed bash (env.py), its tasks from AgentBench
files (tasks.py) and the expert (expert.py)."""

from omrl.envs.os_interaction.env import OsEnv

__all__ = ["OsEnv"]
