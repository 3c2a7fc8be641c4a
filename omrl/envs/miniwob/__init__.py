"""The `miniwob` environment: MiniWoB++ pages in headless Chromium (env.py, browser.py, page.py), tasks drawn
from them (tasks.py) and the scripted expert (expert.py)."""

from omrl.envs.miniwob.env import MiniWoBEnv

__all__ = ["MiniWoBEnv"]
