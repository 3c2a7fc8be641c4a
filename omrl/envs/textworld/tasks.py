"""TextWorld tasks: game seeds of a split (by a hash of the seed) with a theme's checked options; the games
themselves are built on first use (env.py)."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from omrl.envs import textgame
from omrl.envs.base import Task
from omrl.errors import UsageError

THEMES: dict[str, dict[str, Any]] = {
    "cooking": {"recipe": 2, "take": 1, "go": 6, "open": True, "cook": True, "cut": True, "drop": False},
    "custom": {"rooms": 3, "objects": 6, "quest_length": 3},
}
SPLITS = ("train", "validation", "test")
INSTRUCTIONS = {
    "cooking": "Cook and eat the meal that the cookbook in the kitchen describes (TextWorld cooking game).",
    "custom": "Win the TextWorld game: its goal is told when the game starts.",
}
DEFAULT_MAX_STEPS = 50


def package_version() -> str | None:
    return textgame.installed_version("textworld")


def split_of(game_seed: int) -> str:
    """The split a game seed belongs to: 80% train, 10% validation, 10% test, by a hash of the seed."""
    bucket = hashlib.sha256(f"textworld-{game_seed}".encode()).digest()[0] % 10
    return "train" if bucket < 8 else ("validation" if bucket == 8 else "test")


def check_options(theme: str, options: dict[str, Any]) -> dict[str, Any]:
    """The theme's options with defaults filled in, checked; a bad value is a UsageError naming it."""
    if theme not in THEMES:
        raise UsageError(f"textworld theme must be one of {', '.join(THEMES)}, got {theme!r}")
    unknown = sorted(set(options) - set(THEMES[theme]))
    if unknown:
        raise UsageError(f"unknown textworld {theme} option(s) {', '.join(unknown)}; known: "
                         f"{', '.join(THEMES[theme])}")
    out = {**THEMES[theme], **options}

    def integer(key: str, low: int, high: int) -> None:
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise UsageError(f"textworld {theme} option {key} must be an integer from {low} to {high}, got {value!r}")

    def flag(key: str) -> None:
        if not isinstance(out[key], bool):
            raise UsageError(f"textworld {theme} option {key} must be true or false, got {out[key]!r}")

    if theme == "cooking":
        integer("recipe", 1, 5)
        integer("take", 0, out["recipe"])
        if out["go"] not in (1, 6, 9, 12):
            raise UsageError(f"textworld cooking option go (rooms) must be 1, 6, 9 or 12, got {out['go']!r}")
        for key in ("open", "cook", "cut", "drop"):
            flag(key)
    else:
        integer("rooms", 1, 20)
        integer("objects", 0, 40)
        integer("quest_length", 1, 20)
    return out


def textworld_tasks(n: int, seed: int = 0, split: str = "train", theme: str = "cooking",
                    max_steps: int = DEFAULT_MAX_STEPS, **options: Any) -> list[Task]:
    """`n` games of `split` (distinct game seeds of that split), the same for the same arguments; the
    games themselves are built on first use (or by `build_games`)."""
    if split not in SPLITS:
        raise UsageError(f"textworld splits are {', '.join(SPLITS)}, got {split!r}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not 1 <= max_steps <= 1000:
        raise UsageError(f"max_steps must be an integer from 1 to 1000, got {max_steps!r}")
    options = check_options(theme, options)
    rng = random.Random(f"textworld-{seed}-{split}-{theme}")
    seeds: list[int] = []
    taken: set[int] = set()
    while len(seeds) < n:
        game_seed = rng.randrange(1, 2**31)
        if game_seed not in taken and split_of(game_seed) == split:
            taken.add(game_seed)
            seeds.append(game_seed)
    version = package_version()
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:6]
    return [Task(id=f"textworld-{theme}-{digest}-{split}-{game_seed}", instruction=INSTRUCTIONS[theme],
                 env="textworld", split=split,
                 payload={"theme": theme, "seed": game_seed, "options": options, "max_steps": max_steps,
                          "textworld": version})
            for game_seed in seeds]
