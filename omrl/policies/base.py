"""The policy protocol shared by the agent loop and every policy backend.

    reply = await policy.act(messages, tools, context)

`messages` is the conversation so far in OpenAI chat format (dicts), `tools` the OpenAI function
schemas offered, `context` the episode being played (its environment, task, sampling settings and a
scratch dict the policy may keep per-episode state in, e.g. token ids for token-native training).
A policy raises PolicyError when it cannot produce a reply (after its own retries); the agent loop then
stores the trajectory with status policy_error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from omrl.errors import OmrlError, UsageError


class PolicyError(OmrlError, RuntimeError):
    """The policy could not produce a reply (endpoint down, retries exhausted, bad output format)."""


class PolicyTimeout(PolicyError):
    """The policy did not reply within its time limit."""


class ContextFull(PolicyError):
    """The conversation no longer fits the model's context: the episode ends as `truncated`, with this reason."""


@dataclass
class PolicyReply:
    """One assistant turn. tool_calls are dicts {id, name, arguments (JSON text)}."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str | None = None
    raw_text: str | None = None  # the model's text before tool-call parsing, kept for audit
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class EpisodeContext:
    """The episode a policy is acting in."""

    env: Any
    task: Any
    episode_id: str = ""
    sample: int = 0
    temperature: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None
    model_call_timeout: float | None = None  # seconds per model request (each retry gets its own)
    scratch: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    name: str  # recorded in the trajectory's `model` column

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  context: EpisodeContext) -> PolicyReply: ...


def no_argument(spec: str, arg: str, options: dict[str, Any]) -> None:
    """Refuse an argument (NAME:ARG) or options given to a policy that takes none."""
    if arg:
        raise UsageError(f"policy {spec!r} takes no argument, got {spec}:{arg}")
    if options:
        raise UsageError(f"policy {spec!r} takes no option(s) {', '.join(sorted(options))}")
