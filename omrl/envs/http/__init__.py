"""The `http` environment: a client for AgentGym-style environment servers (env.py), and a server giving any
omrl environment that protocol (server.py)."""

from omrl.envs.http.env import HttpEnv

__all__ = ["HttpEnv"]
