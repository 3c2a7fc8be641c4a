"""`random`: a uniformly random move, the floor every learned policy should beat."""

from __future__ import annotations

import random
from typing import Any

from omrl.envs.base import Action
from omrl.policies.base import EpisodeContext, PolicyReply, no_argument
from omrl.policies.scripted import action_reply

_DUMMY = {"string": "", "number": 0, "integer": 0, "boolean": False, "array": [], "object": {}}


def dummy_arguments(tool: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Arguments of the right JSON types for a function schema: an enum member when given, else a blank."""
    params = (tool.get("function", tool).get("parameters") or {}).get("properties") or {}
    out = {}
    for name, spec in params.items():
        if spec.get("enum"):
            out[name] = rng.choice(spec["enum"])
        else:
            out[name] = _DUMMY.get(spec.get("type"), "")
    return out


class RandomPolicy:
    """`env.random_action(rng)` when the environment offers one; else a random tool with dummy arguments."""

    name = "random"

    def __init__(self, seed: int | None = None):
        self.seed = seed

    @classmethod
    def from_spec(cls, arg: str, seed: int | None = None, **options: Any) -> RandomPolicy:
        """`random`: no argument; the one option is `seed`."""
        no_argument("random", arg, options)
        return cls(seed=seed)

    def _rng(self, context: EpisodeContext) -> random.Random:
        rng = context.scratch.get("random_rng")
        if rng is None:
            # Per episode, so a resumed or reordered run plays the same moves for the same episode.
            seed = context.seed if context.seed is not None else self.seed
            rng = random.Random(f"{seed}-{context.episode_id}")
            context.scratch["random_rng"] = rng
        return rng

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  context: EpisodeContext) -> PolicyReply:
        rng = self._rng(context)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        chooser = getattr(context.env, "random_action", None)
        if chooser is not None:
            action = chooser(rng)
        elif tools:
            tool = rng.choice(tools)
            action = Action(tool=tool.get("function", tool)["name"], arguments=dummy_arguments(tool, rng))
        else:
            action = Action(text=rng.choice(["yes", "no", "ok", "done", "0", "1"]))
        return action_reply(action, turn)
