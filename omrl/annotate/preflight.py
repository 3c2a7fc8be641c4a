"""Checks before annotating: each judge's endpoint answers, and a reward recipe's components are supplied.

Both stop the run with one line instead of writing an error annotation per trajectory for a cause that is
the same for every row (no server at the judge's URL; a component nothing computes and nothing stored).
A reachable server whose calls then fail still gives error annotations, row by row (never a score of 0).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from omrl.annotate.judge import JudgeConfig, judge_mode
from omrl.annotate.reward import ENV_REWARD, RewardRecipe
from omrl.annotate.rubric import load_rubric
from omrl.errors import UsageError
from omrl.schema.redact import display_url

OFFLINE_RECIPE = "shipped:reward_offline"  # the shipped reward recipe without a judge
CONNECT_TIMEOUT_S = 5.0


def unreachable(base_url: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why no server accepts a connection at `base_url`'s host and port (name lookup or TCP connect failed),
    or None when one does. Only the connection is tried: what the server answers is the judge's business."""
    try:
        parts = urlsplit(base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return f"not a URL: {exc}"
    if not parts.hostname:
        return "not a URL with a host"
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


def check_judges_reachable(judges: Iterable[JudgeConfig], recipe: RewardRecipe | None = None) -> None:
    """UsageError, one line naming the endpoint and how to set it, for the first judge whose server does not
    accept connections. `recipe`: the reward recipe whose `judges` entries may say where the URL came from."""
    for config in judges:
        why = unreachable(config.base_url)
        if why is None:
            continue
        spec = next((j for j in (recipe.judges if recipe else []) if isinstance(j, dict)
                     and _judges(j, config.annotator)), {})
        variable = spec.get("base_url") if isinstance(spec.get("base_url"), str) else ""
        how = (f"set {variable[1:]} to the URL of an OpenAI-compatible server serving it" if variable.startswith("$")
               else "start the server there or give the judge another URL")
        where = f" of reward recipe {recipe.source or '<dict>'}" if recipe is not None and spec else ""
        offline = f", or use {OFFLINE_RECIPE} (no judge)" if recipe is not None else ""
        raise UsageError(f"judge {config.annotator}{where} needs a server at {display_url(config.base_url)} and "
                         f"none answers ({why}): {how}{offline}")


def check_components_supplied(recipe: RewardRecipe, computed: set[str], stored: set[str]) -> None:
    """Under `missing: null`, UsageError when a component is neither computed by this run (`computed`: the
    annotators of its metrics and judges) nor stored for any selected trajectory (`stored`): every reward
    would be NULL. The line names what computes each such component: a metric flag, or the recipe's judge
    and the endpoint it needs."""
    if recipe.missing != "null":
        return
    lacking = [c.name for c in recipe.components if c.name != ENV_REWARD and c.name not in computed | stored]
    if not lacking:
        return
    needs = []
    for name in lacking:
        spec = next((j for j in recipe.judges if isinstance(j, dict) and _judges(j, name)), None)
        if spec is None:
            needs.append(f"{name} (--metric {name}, or --judge for a judge)")
        else:
            needs.append(f"{name} (--judge {spec.get('rubric')} --judge-model {spec.get('model')} "
                         f"--base-url {display_url(str(spec.get('base_url')))}, an OpenAI-compatible server)")
    raise UsageError(f"reward recipe {recipe.source or '<dict>'}: nothing stored or computed here gives "
                     f"{'; '.join(needs)}, so every reward would be missing; compute it in this run, or use "
                     f"{OFFLINE_RECIPE} (env_reward and exact_match, no judge)")


def _judges(spec: dict, annotator: str) -> bool:
    """Whether the recipe's judge entry `spec` writes `annotator`: its rubric and mode are read, not its model
    and URL, which may name environment variables that are not set here."""
    rubric = spec.get("rubric")
    try:
        loaded = load_rubric(rubric) if rubric else None
        return loaded is not None and judge_mode(str(spec.get("mode") or "pointwise")).annotator(loaded) == annotator
    except (UsageError, ValueError, OSError):  # a bad entry is reported when its judge is built
        return False
