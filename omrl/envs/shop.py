"""`shop`: WebShop-style shopping over a generated catalogue with search[...] and click[...] actions.

Pages: search (a search bar), results (10 per page, [Next >] / [< Prev] / [Back to Search]), product
(options to click, [Buy Now]). Buying ends the episode with WebShop's reward: the fraction of goal
attributes, goal options and the price limit that the purchase satisfies, times a product-type match.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field
from typing import Any

from omrl.envs.base import Action, Reset, StepResult, Task, tool_schema
from omrl.envs.toolenv import InvalidAction, ToolEnv
from omrl.errors import UsageError

PAGE_SIZE = 10
PRICE_STEPS = [10.0 * i for i in range(1, 100)]
SYSTEM_PROMPT = ("You are shopping online. Use search[keywords] on the search page and click[label] on a "
                 "bracketed label of the current page. Find the product that matches the instruction, choose "
                 "its options, and click Buy Now.")
TOOLS = [
    tool_schema("search", "Type keywords in the search bar (only on the search page).",
                {"query": {"type": "string", "description": "search keywords"}}),
    tool_schema("click", "Click a bracketed label of the current page (a product id, an option, Next >, "
                "< Prev, Back to Search, Buy Now).", {"label": {"type": "string"}}),
]

COLORS = ["black", "white", "red", "blue", "green", "grey", "navy", "pink", "beige", "brown"]
# product type -> (category path, attribute pool, option names -> value pool, price range)
PRODUCT_TYPES: dict[str, tuple[str, list[str], dict[str, list[str]], tuple[float, float]]] = {
    "shirt": ("Clothing › Men › Shirts", ["cotton", "long sleeve", "short sleeve", "slim fit", "machine wash",
                                         "button down"], {"color": COLORS, "size": ["s", "m", "l", "xl"]}, (12, 60)),
    "dress": ("Clothing › Women › Dresses", ["cotton", "sleeveless", "floral", "machine wash", "knee length"],
              {"color": COLORS, "size": ["xs", "s", "m", "l"]}, (18, 90)),
    "jeans": ("Clothing › Men › Jeans", ["slim fit", "stretch", "relaxed fit", "machine wash", "high waist"],
              {"color": ["blue", "black", "grey"], "size": ["30", "32", "34", "36"]}, (20, 80)),
    "sneakers": ("Shoes › Sneakers", ["running", "lightweight", "non slip", "breathable", "memory foam"],
                 {"color": COLORS, "size": ["7", "8", "9", "10", "11"]}, (25, 120)),
    "backpack": ("Bags › Backpacks", ["waterproof", "laptop sleeve", "lightweight", "usb charging", "anti theft"],
                 {"color": COLORS}, (15, 70)),
    "headphones": ("Electronics › Audio › Headphones", ["wireless", "noise cancelling", "over ear", "bluetooth",
                                                        "foldable"], {"color": ["black", "white", "blue"]}, (20, 200)),
    "mug": ("Home › Kitchen › Mugs", ["ceramic", "dishwasher safe", "microwave safe", "insulated"],
            {"color": COLORS, "size": ["12 oz", "16 oz", "20 oz"]}, (6, 30)),
    "lamp": ("Home › Lighting › Lamps", ["led", "dimmable", "usb charging", "touch control", "adjustable"],
             {"color": ["black", "white", "gold", "silver"]}, (15, 90)),
    "shampoo": ("Beauty › Hair Care › Shampoo", ["sulfate free", "paraben free", "natural", "for dry hair"],
                {"size": ["8 oz", "16 oz", "32 oz"]}, (5, 40)),
    "phone case": ("Electronics › Accessories › Cases", ["shockproof", "slim", "clear", "magnetic"],
                   {"color": COLORS, "model": ["iphone 14", "iphone 15", "galaxy s23", "pixel 8"]}, (8, 45)),
}
GOAL_KEYS = {"asin", "query", "product_category", "attributes", "options", "price_upper"}
BRANDS = ["Acme", "Northwind", "Zenith", "Bluepeak", "Evergreen", "Solara", "Kestrel", "Harbor", "Lumen", "Orchard"]


@dataclass
class Product:
    asin: str
    title: str
    query: str                      # the product type
    product_category: str
    attributes: list[str]
    options: dict[str, list[str]]
    price: float
    words: set[str] = field(default_factory=set)


@functools.lru_cache(maxsize=16)
def catalogue(seed: int = 0, size: int = 200) -> tuple[Product, ...]:
    """A deterministic product catalogue: the same (seed, size) always gives the same products."""
    rng = random.Random(f"shop-catalogue-{seed}")
    products = []
    types = sorted(PRODUCT_TYPES)
    for i in range(size):
        kind = types[i % len(types)]
        category, pool, option_pool, (low, high) = PRODUCT_TYPES[kind]
        attributes = rng.sample(pool, rng.randint(2, 3))
        while {"long sleeve", "short sleeve"} <= set(attributes):  # no contradictory products
            attributes = rng.sample(pool, rng.randint(2, 3))
        options = {name: sorted(rng.sample(values, min(len(values), rng.randint(2, 4))))
                   for name, values in option_pool.items()}
        title = f"{rng.choice(BRANDS)} {' '.join(a.title() for a in attributes[:2])} {kind.title()}"
        asin = "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))
        product = Product(asin=asin, title=title, query=kind, product_category=category, attributes=attributes,
                          options=options, price=round(rng.uniform(low, high), 2))
        product.words = set(_words(" ".join([title, kind, category, *attributes])))
        products.append(product)
    return tuple(products)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


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


def shop_reward(product: Product, chosen: dict[str, str], goal: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """WebShop's reward: (attributes matched + options matched + price ok) / (their count + 1), times r_type."""
    text = " ".join([product.title.lower(), *product.attributes])
    attribute_hits = sum(1 for a in goal["attributes"] if a in product.attributes or a in text)
    chosen_values = {v.lower() for v in chosen.values()}
    option_hits = sum(1 for v in goal["options"].values() if str(v).lower() in chosen_values)
    price_ok = product.price <= goal["price_upper"]
    total = (attribute_hits + option_hits + int(price_ok)) / (len(goal["attributes"]) + len(goal["options"]) + 1)
    r_type = _type_reward(product, goal)
    return total * r_type, {"r_type": r_type, "attribute_hits": attribute_hits, "option_hits": option_hits,
                            "price_ok": price_ok}


def _type_reward(product: Product, goal: dict[str, Any]) -> float:
    # As in WebShop: same query or shared category levels or enough title overlap -> 1; weak overlap -> less.
    if product.query == goal["query"]:
        return 1.0
    shared = set(product.product_category.split(" › ")) & set(goal["product_category"].split(" › "))
    goal_words = set(_words(goal["query"]))
    title_score = len(goal_words & set(_words(product.title))) / max(1, len(goal_words))
    if len(shared) >= 2 or title_score > 0.2:
        return 1.0
    if title_score == 0:
        return 0.0
    return 0.1 if title_score < 0.1 else 0.5


class ShopEnv(ToolEnv):
    """WebShop-style shopping: search[query] / click[label] over a generated catalogue; WebShop reward on Buy Now."""

    name = "shop"
    tools = TOOLS

    @classmethod
    def generate_tasks(cls, n: int, seed: int = 0, split: str = "train", catalogue_size: int = 200) -> list[Task]:
        """Shopping goals over a generated catalogue (see the module function)."""
        return generate_tasks(n, seed=seed, catalogue_size=catalogue_size, split=split)

    def reset(self, task: Task) -> Reset:
        super().__init__()
        spec = task.payload.get("catalogue") or {}
        self.products = catalogue(int(spec.get("seed", 0)), int(spec.get("size", 200)))
        self.by_asin = {p.asin.lower(): p for p in self.products}
        self.goal = task.payload.get("goal")
        if not isinstance(self.goal, dict):
            raise UsageError(f"shop task {task.id!r} has no goal in its payload")
        missing = sorted(GOAL_KEYS - set(self.goal))
        if missing:  # found now, not as a KeyError at Buy Now
            raise UsageError(f"shop task {task.id!r}: payload goal lacks {missing}")
        self.task = task
        self.page, self.query, self.results, self.page_number = "search", "", [], 0
        self.product: Product | None = None
        self.chosen: dict[str, str] = {}
        return Reset(observation=self.render(), tools=list(TOOLS), system_prompt=SYSTEM_PROMPT)

    # ---------------------------------------------------------------- pages

    def clickables(self) -> list[str]:
        if self.page == "results":
            labels = ["Back to Search"]
            if self.page_number > 0:
                labels.append("< Prev")
            if (self.page_number + 1) * PAGE_SIZE < len(self.results):
                labels.append("Next >")
            return labels + [p.asin for p in self._page_items()]
        if self.page == "item":
            values = [v for vs in self.product.options.values() for v in vs]
            return ["Back to Search", "< Prev", *values, "Buy Now"]
        return []

    def _page_items(self) -> list[Product]:
        start = self.page_number * PAGE_SIZE
        return self.results[start:start + PAGE_SIZE]

    def render(self) -> str:
        head = f"Instruction: {self.task.instruction}\n"
        if self.page == "search":
            return head + "[Search]  (use search[keywords])"
        if self.page == "results":
            lines = [head + "[Back to Search]",
                     f"Page {self.page_number + 1} (Total results: {len(self.results)}) for {self.query!r}"]
            if self.page_number > 0:
                lines.append("[< Prev]")
            if (self.page_number + 1) * PAGE_SIZE < len(self.results):
                lines.append("[Next >]")
            for product in self._page_items():
                lines.append(f"[{product.asin}] {product.title} ${product.price:.2f}")
            if not self.results:
                lines.append("No products found.")
            return "\n".join(lines)
        product = self.product
        lines = [head + "[Back to Search] [< Prev]", product.title, f"Price: ${product.price:.2f}",
                 f"Features: {', '.join(product.attributes)}"]
        for name, values in product.options.items():
            shown = " ".join(f"[{v}]" + (" (selected)" if self.chosen.get(name) == v else "") for v in values)
            lines.append(f"{name}: {shown}")
        lines.append("[Buy Now]")
        return "\n".join(lines)

    # ---------------------------------------------------------------- actions

    def tool_search(self, query: str) -> StepResult:
        if self.page != "search":
            raise InvalidAction("there is no search bar on this page; click[Back to Search] first")
        words = set(_words(str(query)))
        if not words:
            raise InvalidAction("search needs keywords")
        scored = [(len(words & p.words), p) for p in self.products]
        self.results = [p for score, p in sorted(scored, key=lambda s: (-s[0], s[1].asin)) if score > 0][:50]
        self.query, self.page, self.page_number = str(query), "results", 0
        return StepResult(observation=self.render())

    def tool_click(self, label: str) -> StepResult:
        wanted = str(label).strip().strip("[]").strip().lower()
        labels = {c.lower(): c for c in self.clickables()}
        if wanted not in labels:
            shown = ", ".join(f"[{c}]" for c in self.clickables()) or "none (use search[...])"
            raise InvalidAction(f"{label!r} is not clickable on this page. Clickable: {shown}")
        if wanted == "back to search":
            self.page, self.product, self.chosen = "search", None, {}
        elif wanted == "next >":
            self.page_number += 1
        elif wanted == "< prev":
            if self.page == "item":
                self.page, self.product, self.chosen = "results", None, {}
            else:
                self.page_number -= 1
        elif wanted == "buy now":
            return self._buy()
        elif self.page == "results":
            self.page, self.product, self.chosen = "item", self.by_asin[wanted], {}
        else:
            for name, values in self.product.options.items():
                if labels[wanted] in values:
                    self.chosen[name] = labels[wanted]
        return StepResult(observation=self.render())

    def _buy(self) -> StepResult:
        reward, details = shop_reward(self.product, self.chosen, self.goal)
        self.done = True
        success = abs(reward - 1.0) < 1e-9
        return StepResult(observation=f"Thank you for shopping with us! Your score (min 0.0, max 1.0): {reward:.2f}",
                          reward=reward, done=True,
                          info={"success": success, "bought": self.product.asin, "options": dict(self.chosen),
                                **details})

    # ---------------------------------------------------------------- scripted policies

    def expert_action(self) -> Action:
        """Search the goal's words, page to the goal product, pick its options, buy."""
        goal = self.goal
        if self.page == "search":
            return Action(tool="search", arguments={"query": " ".join([*goal["attributes"], goal["query"]])})
        if self.page == "results":
            if any(p.asin == goal["asin"] for p in self._page_items()):
                return Action(tool="click", arguments={"label": goal["asin"]})
            if "Next >" in self.clickables():
                return Action(tool="click", arguments={"label": "Next >"})
            return Action(tool="click", arguments={"label": "Back to Search"})
        if self.product.asin != goal["asin"]:
            return Action(tool="click", arguments={"label": "< Prev"})
        for name, value in goal["options"].items():
            if self.chosen.get(name) != value:
                return Action(tool="click", arguments={"label": value})
        return Action(tool="click", arguments={"label": "Buy Now"})

    def random_action(self, rng: random.Random) -> Action:
        if self.page == "search":
            kind = rng.choice(sorted(PRODUCT_TYPES))
            return Action(tool="search", arguments={"query": kind})
        return Action(tool="click", arguments={"label": rng.choice(self.clickables())})
