"""The `sql` environment: DBBench-style questions over a table in SQLite (env.py)."""

from omrl.envs.sql.env import SqlEnv

__all__ = ["SqlEnv"]
