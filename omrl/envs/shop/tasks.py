"""Shop tasks: shopping goals drawn from a generated catalogue, the same for the same seed."""

from __future__ import annotations

import random

from omrl.envs.base import Task
from omrl.envs.shop.catalogue import catalogue

PRICE_STEPS = [10.0 * i for i in range(1, 100)]


def generate_tasks(n: int, seed: int = 0, catalogue_size: int = 200, split: str = "train") -> list[Task]:
    """Shopping goals drawn from the catalogue: a product's attributes (1-2), one value per option, a price limit."""
    products = catalogue(seed, catalogue_size)
    rng = random.Random(f"shop-goals-{seed}")
    tasks = []
    for i in range(n):
        product = rng.choice(products)
        attributes = rng.sample(product.attributes, rng.randint(1, 2))
        options = {name: rng.choice(values) for name, values in product.options.items()}
        above = [p for p in PRICE_STEPS if p > product.price]
        price_upper = above[min(len(above) - 1, rng.randint(0, 2))]
        option_text = ", ".join(f"{name} {value}" if name != "color" else value for name, value in options.items())
        instruction = (f"i need a {' and '.join(attributes)} {product.query} with {option_text}, "
                       f"and price lower than {price_upper:.2f} dollars")
        goal = {"asin": product.asin, "query": product.query, "product_category": product.product_category,
                "name": product.title, "attributes": attributes, "options": options, "price_upper": price_upper}
        tasks.append(Task(id=f"shop-{seed}-{i}", instruction=instruction, answer=product.asin, env="shop",
                          split=split, payload={"catalogue": {"seed": seed, "size": catalogue_size},
                                                "goal": goal}))
    return tasks
