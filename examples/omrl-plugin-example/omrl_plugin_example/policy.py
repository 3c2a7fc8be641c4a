"""`parrot`: says the last quoted word of the instruction (a policy that needs no model)."""

from __future__ import annotations

import json
import re
from typing import Any

from omrl.errors import UsageError
from omrl.policies.base import EpisodeContext, PolicyReply


class ParrotPolicy:
    """Calls the first tool offered with the instruction's last "quoted" word (prefixed by its argument)."""

    name = "parrot"

    def __init__(self, prefix: str = ""):
        self.prefix = prefix

    @classmethod
    def from_spec(cls, arg: str, **options: Any) -> ParrotPolicy:
        """`parrot` or `parrot:PREFIX`; no options."""
        if options:
            raise UsageError(f"policy 'parrot' takes no option(s) {', '.join(sorted(options))}")
        return cls(prefix=arg)

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  context: EpisodeContext) -> PolicyReply:
        words = re.findall(r'"([^"]+)"', context.task.instruction)
        word = self.prefix + (words[-1] if words else "")
        if not tools:
            return PolicyReply(content=word, raw_text=word, finish_reason="stop")
        function = tools[0]["function"]
        argument = next(iter(function["parameters"]["properties"]), "text")
        call = {"id": "call_0", "name": function["name"], "arguments": json.dumps({argument: word})}
        return PolicyReply(content=None, tool_calls=[call], finish_reason="tool_calls")
