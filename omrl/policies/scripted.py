"""`scripted`: the environment's own expert (`env.expert_action()`), rendered as an assistant turn."""

from __future__ import annotations

import json
from typing import Any

from omrl.envs.base import Action
from omrl.policies.base import EpisodeContext, PolicyError, PolicyReply, no_argument


def action_reply(action: Action, call_id: str) -> PolicyReply:
    """An environment Action as the assistant reply that would produce it (a tool call, or plain text)."""
    if action.tool is None:
        return PolicyReply(content=action.text, raw_text=action.text, finish_reason="stop")
    call = {"id": call_id, "name": action.tool, "arguments": json.dumps(action.arguments, ensure_ascii=False)}
    return PolicyReply(content=None, tool_calls=[call], finish_reason="tool_calls")


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
        return action_reply(action, f"call_{turn}_0")
