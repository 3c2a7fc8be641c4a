"""The `math` environment: word problems with a calculator tool (env.py), generated tasks (tasks.py) and
the expert replaying a solution's calculations (expert.py)."""

from omrl.envs.math.env import MathEnv
from omrl.envs.math.tasks import generate_tasks

__all__ = ["MathEnv", "generate_tasks"]
