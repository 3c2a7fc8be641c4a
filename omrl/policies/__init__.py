"""Policies: what chooses the agent's next message (LLM endpoints, in-process models, scripted experts).

`make_policy(spec, **options)` builds one from its spec, NAME or NAME:ARG:

    openai:MODEL   an OpenAI-compatible endpoint (options: base_url, api_key, timeout, retries, ...)
    hf:PATH        an in-process transformers model (omrl.policies.hf); PATH may be a known model's name
                   (`omrl models list`, e.g. hf:smollm2-135m-instruct once fetched)
    scripted       the environment's scripted expert
    random         uniformly random moves (option: seed)

POLICIES (a Registry, omrl/plugins.py) maps each name to a factory `factory(arg, **options) -> Policy`
(arg: the text after the colon, "" without one). Installed packages add their own through the
`omrl.policies` entry-point group (name = "package.module:factory"; see omrl/plugins.py).
"""

from __future__ import annotations

from typing import Any

from omrl.errors import UsageError
from omrl.plugins import Registry
from omrl.policies.base import EpisodeContext, Policy, PolicyError, PolicyReply, PolicyTimeout

__all__ = ["EpisodeContext", "Policy", "PolicyError", "PolicyReply", "PolicyTimeout", "make_policy"]

POLICIES = Registry("policy", "omrl.policies", {
    "openai": "omrl.policies.openai_policy:OpenAIPolicy",
    "hf": "omrl.policies.hf:HFPolicy.from_spec",
    "scripted": "omrl.policies.scripted:ScriptedPolicy.from_spec",
    "random": "omrl.policies.random_policy:RandomPolicy.from_spec",
})
SPECS = ("openai:MODEL", "hf:PATH", "scripted", "random")


def make_policy(spec: str, **options: Any) -> Policy:
    """The policy a spec names; options set to None are ignored (so CLI flags can pass through)."""
    options = {k: v for k, v in options.items() if v is not None}
    name, _, arg = spec.partition(":")
    if POLICIES.get(name) is None:
        plugins = sorted(POLICIES.plugin_names())
        raise UsageError(f"unknown policy {spec!r}; use one of {', '.join([*SPECS, *plugins])}")
    return POLICIES.create(name, arg, **options)  # a plugin's failing factory: one error line naming it

