"""The `swe` environment: SWE tasks made from real package sources (packages.py: sdists, environments, test
runs; bugs.py: modifiers; tasks.py: generation and validation), played with SWE-agent-style tools in the
sandbox (env.py)."""

from omrl.envs.swe.env import SweEnv

__all__ = ["SweEnv"]
