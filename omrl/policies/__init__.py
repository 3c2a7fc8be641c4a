"""Policies: what chooses the agent's next message (LLM endpoints, in-process models, scripted experts).

`make_policy(spec, **options)` builds one from its spec:

    openai:MODEL   an OpenAI-compatible endpoint (options: base_url, api_key, timeout, retries, ...)
    hf:PATH        an in-process transformers model (omrl.policies.hf)
    scripted       the environment's scripted expert
    random         uniformly random moves (option: seed)
"""

from __future__ import annotations

from typing import Any

from omrl.errors import UsageError
from omrl.policies.base import EpisodeContext, Policy, PolicyError, PolicyReply, PolicyTimeout

__all__ = ["EpisodeContext", "Policy", "PolicyError", "PolicyReply", "PolicyTimeout", "make_policy"]

SPECS = ("openai:MODEL", "hf:PATH", "scripted", "random")


def make_policy(spec: str, **options: Any) -> Policy:
    """The policy a spec names; options set to None are ignored (so CLI flags can pass through)."""
    options = {k: v for k, v in options.items() if v is not None}
    kind, _, arg = spec.partition(":")
    if kind == "openai":
        from omrl.policies.openai_policy import OpenAIPolicy

        return OpenAIPolicy(arg, **options)
    if kind == "hf":
        if not arg:
            raise UsageError("hf policy needs a model folder: hf:PATH")
        from omrl.policies.hf import HFPolicy  # imports torch: only when asked for

        return HFPolicy(arg, **options)
    if kind in ("scripted", "random") and not arg:
        if kind == "scripted":
            from omrl.policies.scripted import ScriptedPolicy

            _no_options(spec, options)
            return ScriptedPolicy()
        from omrl.policies.random_policy import RandomPolicy

        seed = options.pop("seed", None)
        _no_options(spec, options)
        return RandomPolicy(seed=seed)
    raise UsageError(f"unknown policy {spec!r}; use one of {', '.join(SPECS)}")


def _no_options(spec: str, options: dict[str, Any]) -> None:
    if options:
        raise UsageError(f"policy {spec!r} takes no option(s) {', '.join(sorted(options))}")
