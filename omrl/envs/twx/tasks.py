"""TwxEnv tasks: games of TextWorldExpress's seed folds (train, dev, test), their descriptions read from the
package in an engine process."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from omrl.envs import textgame
from omrl.envs.base import Task
from omrl.envs.twx.engine import DEFAULT_STEP_LIMIT, start_engine
from omrl.errors import UsageError

GAMES = ("cookingworld", "coin", "twc", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")
FOLD_SEEDS = {"train": range(0, 1000), "dev": range(10000, 11000), "test": range(20000, 21000)}


def canonical_params(params: Any) -> str:
    """Game properties as TextWorldExpress reads them, "key=value" pairs sorted by key ("" for defaults)."""
    if params is None or params == "":
        return ""
    if isinstance(params, dict):
        pairs = [(str(k), v) for k, v in params.items()]
    elif isinstance(params, str):
        pairs = []
        for item in params.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"twx params must be key=value pairs separated by commas, got {params!r}")
            pairs.append((key.strip(), value.strip()))
    else:
        raise UsageError(f"twx params must be a 'key=value,...' string or an object, got {type(params).__name__}")
    out = []
    for key, value in sorted(pairs):
        if isinstance(value, bool):
            value = int(value)
        out.append(f"{key}={value}")
    return ",".join(out)


def draw_seeds(n: int, seed: int, split: str, game: str) -> list[int]:
    """`n` distinct game seeds of TextWorldExpress's `split` fold, the same for the same arguments."""
    seeds = list(FOLD_SEEDS[split])
    if n > len(seeds):
        raise UsageError(f"the twx {split} fold has {len(seeds)} seeds, asked for {n}")
    random.Random(f"twx-{seed}-{split}-{game}").shuffle(seeds)
    return seeds[:n]


def twx_tasks(n: int, seed: int = 0, split: str = "train", game: str = "cookingworld", params: Any = "",
              step_limit: int = DEFAULT_STEP_LIMIT) -> list[Task]:
    """`n` games of `split` (distinct seeds of TextWorldExpress's fold), the same for the same arguments."""
    if game not in GAMES:
        raise UsageError(f"twx game must be one of {', '.join(GAMES)}, got {game!r}")
    if split not in FOLD_SEEDS:
        raise UsageError(f"twx splits are {', '.join(FOLD_SEEDS)}, got {split!r}")
    if not 1 <= int(step_limit) <= 10000:
        raise UsageError(f"step_limit must be between 1 and 10000, got {step_limit!r}")
    params = canonical_params(params)
    seeds = draw_seeds(n, seed, split, game)
    engine = start_engine()
    try:
        from omrl.envs.engine import EngineError

        try:
            descriptions = engine.call("describe", game, params, split, seeds, timeout=60 + 2 * n)
        except EngineError as exc:
            raise UsageError(f"twx {game} params {params!r}: {exc}") from None
    finally:
        engine.close()
    version = textgame.installed_version("textworld-express")
    suffix = f"-{hashlib.sha256(params.encode()).hexdigest()[:6]}" if params else ""
    return [Task(id=f"twx-{game}{suffix}-{split}-{game_seed}", instruction=description, env="twx", split=split,
                 payload={"game": game, "params": params, "seed": game_seed, "fold": split,
                          "step_limit": int(step_limit), "textworld_express": version})
            for game_seed, description in zip(seeds, descriptions, strict=True)]
