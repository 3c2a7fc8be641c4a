"""`scripted`: the environment's own expert (`env.expert_action()`), rendered as an assistant turn."""

from __future__ import annotations

import json
from typing import Any

from omrl.envs.base import Action
from omrl.policies.base import EpisodeContext, PolicyError, PolicyReply, no_argument


def action_reply(action: Action | list[Action], turn: int) -> PolicyReply:
    """An environment Action as assistant turn `turn`'s reply that would produce it (a tool call, or plain
    text); a list of tool-call Actions is one reply with parallel calls (ids call_TURN_0, call_TURN_1, ...)."""
    actions = action if isinstance(action, list) else [action]
    if len(actions) == 1 and actions[0].tool is None:
        return PolicyReply(content=actions[0].text, raw_text=actions[0].text, finish_reason="stop")
    if not actions or any(a.tool is None for a in actions):
        raise PolicyError("an expert reply of several moves must be tool calls only")
    calls = [{"id": f"call_{turn}_{i}", "name": a.tool,
              "arguments": json.dumps(a.arguments, ensure_ascii=False)} for i, a in enumerate(actions)]
    return PolicyReply(content=None, tool_calls=calls, finish_reason="tool_calls")


class ScriptedPolicy:
    """Plays the environment's scripted expert; fails clearly when the environment has none."""

    name = "scripted"

    @classmethod
    def from_spec(cls, arg: str, **options: Any) -> ScriptedPolicy:
        """`scripted`: no argument, no options."""
        no_argument("scripted", arg, options)
        return cls()

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  context: EpisodeContext) -> PolicyReply:
        expert = getattr(context.env, "expert_action", None)
        if expert is None:
            raise PolicyError(f"environment {getattr(context.env, 'name', context.env)!r} has no scripted expert "
                              "(expert_action)")
        action = expert()
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        return action_reply(action, turn)
