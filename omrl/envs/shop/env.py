"""`shop`: WebShop-style shopping over a generated catalogue with search[...] and click[...] actions.

Pages: search (a search bar), results (10 per page, [Next >] / [< Prev] / [Back to Search]), product
(options to click, [Buy Now]). Buying ends the episode with WebShop's reward: the fraction of goal
attributes, goal options and the price limit that the purchase satisfies, times a product-type match.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from omrl.envs.base import Action, Reset, StepResult, Task, tool_schema
from omrl.envs.shop.catalogue import PRODUCT_TYPES, Product, catalogue, words_of
from omrl.envs.shop.tasks import generate_tasks
from omrl.envs.toolenv import InvalidAction, ToolEnv
from omrl.errors import UsageError

PAGE_SIZE = 10
SYSTEM_PROMPT = ("You are shopping online. Use search[keywords] on the search page and click[label] on a "
                 "bracketed label of the current page. Find the product that matches the instruction, choose "
                 "its options, and click Buy Now.")
TOOLS = [
    tool_schema("search", "Type keywords in the search bar (only on the search page).",
                {"query": {"type": "string", "description": "search keywords"}}),
    tool_schema("click", "Click a bracketed label of the current page (a product id, an option, Next >, "
                "< Prev, Back to Search, Buy Now).", {"label": {"type": "string"}}),
]

GOAL_KEYS = {"asin", "query", "product_category", "attributes", "options", "price_upper"}


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
    goal_words = set(words_of(goal["query"]))
    title_score = len(goal_words & set(words_of(product.title))) / max(1, len(goal_words))
    if len(shared) >= 2 or title_score > 0.2:
        return 1.0
    if title_score == 0:
        return 0.0
    return 0.1 if title_score < 0.1 else 0.5


@dataclass
class ShopOptions:
    """ShopEnv's constructor options, as `--env-option KEY=VALUE` gives them: it takes none."""


class ShopEnv(ToolEnv):
    """WebShop-style shopping: search[query] / click[label] over a generated catalogue; WebShop reward on Buy Now."""

    name = "shop"
    options_class = ShopOptions
    tools = TOOLS

    @classmethod
    def generate_tasks(cls, n: int, seed: int = 0, split: str = "train", catalogue_size: int = 200) -> list[Task]:
        """Shopping goals over a generated catalogue (tasks.py)."""
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
        words = set(words_of(str(query)))
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
