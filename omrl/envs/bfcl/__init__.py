"""The `bfcl` environment: BFCL multi-turn function calling (env.py), its data (data.py), tasks drawn from it
(tasks.py) and the engine running its API classes (worker.py)."""

from omrl.envs.bfcl.env import BfclEnv

__all__ = ["BfclEnv"]
