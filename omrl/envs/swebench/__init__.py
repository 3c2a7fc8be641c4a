"""The `swebench` environment: SWE-bench task rows, run in Docker task images (env.py)."""

from omrl.envs.swebench.env import SwebenchEnv

__all__ = ["SwebenchEnv"]
