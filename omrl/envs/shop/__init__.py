"""The `shop` environment: WebShop-style shopping (env.py) over a generated catalogue (catalogue.py), with
goals drawn from it (tasks.py)."""

from omrl.envs.shop.catalogue import catalogue
from omrl.envs.shop.env import ShopEnv, shop_reward
from omrl.envs.shop.tasks import generate_tasks

__all__ = ["ShopEnv", "catalogue", "generate_tasks", "shop_reward"]
