"""LLM-as-judge through the `openai` client against any OpenAI-compatible endpoint.

Modes (pointwise, pairwise, group): omrl.annotate.judge_modes, registered by name in JUDGE_MODES.

Replies must be JSON (```json fences tolerated). An unparseable or out-of-range reply is re-asked
(`max_invalid` times, telling the judge what was wrong), then stored as an error annotation. 429, 5xx,
timeouts, connection errors and malformed bodies are retried by the one LLM client (omrl/llm/client.py: the openai
client's own exponential backoff, `max_retries`); a call that still fails is an error annotation, never a
score. Valid replies are cached by prompt hash (cache.py), so a second run makes no calls.

Prompt budget: every request carries `max_tokens` (the reply's limit). With `max_prompt_tokens` set (the
judge's context minus `max_tokens`), the trajectories are rendered into what is left after the rubric,
the examples and room for one re-ask (estimated at `chars_per_token`), eliding as render.py states; a
re-ask sends the original prompt plus the invalid reply clipped to REASK_CLIP characters, so it never
grows with the number of attempts. A group larger than `group_max` is scored in chunks of at most that
many members (each chunk relative within itself); a prompt that still cannot fit is an error annotation,
never a request the judge would refuse.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omrl.annotate.cache import JudgeCache, prompt_hash
from omrl.annotate.render import clip
from omrl.annotate.rubric import Rubric
from omrl.errors import OmrlError, UsageError
from omrl.llm.client import LLMClient, LLMError, LLMStatusError
from omrl.plugins import Registry
from omrl.schema.rows import TrajectoryRow, UncheckedRow


def judged_together(mode: str) -> str | None:
    """The trajectory field whose equal values a judge of `mode` scores together: a pairwise judge compares
    the trajectories of one task, a group judge those of one group_id (None: each trajectory alone)."""
    return judge_mode(mode).together


REASK_CLIP = 400  # characters of an invalid reply (and of its error) quoted back in a re-ask
REASK_ROOM_TOKENS = 2 * REASK_CLIP // 3 + 40  # budget kept free for that re-ask


@dataclass
class JudgeConfig:
    rubric: Rubric
    model: str
    base_url: str
    api_key: str = "EMPTY"
    mode: str = "pointwise"
    concurrency: int = 16  # requests in flight at once
    max_retries: int = 4  # transport retries per call (429, 5xx, timeouts, malformed bodies); see omrl/llm/client.py
    max_invalid: int = 2  # re-asks after an unparseable or out-of-range reply
    timeout_s: float = 60.0
    temperature: float = 0.0
    max_chars: int = 12000  # judge rendering budget per trajectory (see render.py)
    keep_last: int = 6
    price_prompt: float | None = None  # USD per million prompt tokens
    price_completion: float | None = None  # USD per million completion tokens
    max_tokens: int | None = 512  # the reply's token limit, sent with every request
    max_prompt_tokens: int | None = None  # prompt budget (context - max_tokens); None: only max_chars applies
    chars_per_token: float = 3.0  # budget estimate; 3 is conservative for English and JSON-ish traces
    group_max: int | None = None  # group mode: larger groups are scored in chunks of at most this many

    def __post_init__(self) -> None:
        if JUDGE_MODES.get(self.mode) is None:
            raise UsageError(f"judge mode must be one of {', '.join(JUDGE_MODES.builtins)}, got {self.mode!r}")
        if self.concurrency < 1:
            raise UsageError("judge concurrency must be at least 1")
        if self.max_retries < 0 or self.max_invalid < 0:
            raise UsageError("judge max_retries and max_invalid must be at least 0")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise UsageError("judge max_tokens must be at least 1")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 64:
            raise UsageError("judge max_prompt_tokens must be at least 64")
        if self.group_max is not None and self.group_max < 2:
            raise UsageError("judge group_max must be at least 2 (a group of one has nothing to compare)")
        if self.chars_per_token <= 0:
            raise UsageError("judge chars_per_token must be positive")

    def promptchars(self) -> int | None:
        """The prompt budget in characters (None: unbounded)."""
        return None if self.max_prompt_tokens is None else int(self.max_prompt_tokens * self.chars_per_token)

    def estimate_tokens(self, messages: list[dict[str, Any]]) -> int:
        """The prompt's size in tokens as the budget counts it."""
        return math.ceil(chars(messages) / self.chars_per_token)

    @property
    def annotator(self) -> str:
        return judge_mode(self.mode).annotator(self.rubric)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        if self.price_prompt is None and self.price_completion is None:
            return None
        return (prompt_tokens * (self.price_prompt or 0.0) + completion_tokens * (self.price_completion or 0.0)) / 1e6


@dataclass
class JudgeStats:
    calls: int = 0  # HTTP requests sent, retries included
    cache_hits: int = 0
    prompt_tokens: int = 0  # of live calls only
    completion_tokens: int = 0
    transport_retries: int = 0
    invalid_replies: int = 0
    skipped: int = 0


class JudgeError(OmrlError, RuntimeError):
    """A judge request that failed for good; the message says why."""


@dataclass
class Answer:
    """A validated judge reply (or the reason there is none)."""

    value: Any = None
    error: str | None = None
    prompt_hash: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    attempts: int = 0


# ---------------------------------------------------------------- reply parsing

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def parse_json_reply(text: str | None) -> dict[str, Any]:
    """The JSON object in a reply: bare, inside ```json fences, or the outermost {...} in prose."""
    text = (text or "").strip()
    candidates = [text] + _FENCE.findall(text)
    if "{" in text and "}" in text:
        candidates.append(text[text.index("{"): text.rindex("}") + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate.strip())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    raise UsageError("the reply is not a JSON object")


def reply_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UsageError(f"{what} must be a number, got {value!r}")
    try:
        return float(value)
    except ValueError:
        raise UsageError(f"{what} must be a number, got {value!r}") from None


# ---------------------------------------------------------------- the client


class Judge:
    """Sends judge requests through the one LLM client (omrl.llm.client) with bounded concurrency and a reply cache."""

    def __init__(self, config: JudgeConfig, cache: JudgeCache | None = None):
        self.config = config
        self.cache = cache or JudgeCache(None)
        self.stats = JudgeStats()
        # At most `concurrency` requests in flight; a call backing off between attempts holds no slot.
        self.client = LLMClient(config.base_url, config.api_key, timeout=config.timeout_s,
                                max_retries=config.max_retries, max_connections=config.concurrency)

    async def close(self) -> None:
        await self.client.aclose()

    async def _complete(self, messages: list[dict[str, Any]]) -> tuple[str, int, int]:
        """One chat completion (the client retries transport failures); raises JudgeError when they run out."""
        try:
            extra = {"max_tokens": self.config.max_tokens} if self.config.max_tokens else {}
            resp = await self.client.chat(model=self.config.model, messages=messages,
                                          temperature=self.config.temperature, **extra)
        except LLMStatusError as exc:
            if not exc.retried:
                raise JudgeError(f"judge endpoint refused the request: {exc}") from None
            raise JudgeError(f"judge call failed after {exc.attempts} attempts: {exc}") from None
        except LLMError as exc:
            raise JudgeError(f"judge call failed after {exc.attempts} attempts: {type(exc).__name__}: {exc}") from None
        finally:
            self.stats.calls = self.client.stats["requests"]
            self.stats.transport_retries = self.client.stats["retries"]
        content = resp.choices[0].message.content or ""
        usage = resp.usage
        pt = int(usage.prompt_tokens) if usage else 0
        ct = int(usage.completion_tokens) if usage else 0
        self.stats.prompt_tokens += pt
        self.stats.completion_tokens += ct
        return content, pt, ct

    async def ask(self, messages: list[dict[str, Any]], validate: Callable[[str], Any]) -> Answer:
        """A validated reply for a prompt: from the cache, or asked (re-asked while invalid). A prompt over
        the judge's budget is an error answer, not a request."""
        key = prompt_hash(self.config.model, messages, self.config.temperature)
        limit = self.config.max_prompt_tokens
        if limit is not None and self.config.estimate_tokens(messages) + REASK_ROOM_TOKENS > limit:
            return Answer(error=f"judge prompt of ~{self.config.estimate_tokens(messages)} tokens (+ "
                                f"{REASK_ROOM_TOKENS} for a re-ask) exceeds max_prompt_tokens={limit}",
                          prompt_hash=key)
        hit = self.cache.get(key)
        if hit is not None:
            try:
                value = validate(hit["content"])
                self.stats.cache_hits += 1
                return Answer(value, None, key, hit.get("prompt_tokens", 0), hit.get("completion_tokens", 0),
                              cached=True)
            except ValueError:
                pass  # a cache written under other validation rules: ask again
        answer = Answer(prompt_hash=key)
        convo = list(messages)
        for _ in range(self.config.max_invalid + 1):
            answer.attempts += 1
            try:
                content, pt, ct = await self._complete(convo)
            except JudgeError as exc:
                answer.error = str(exc)
                return answer
            answer.prompt_tokens += pt
            answer.completion_tokens += ct
            try:
                answer.value = validate(content)
            except ValueError as exc:
                self.stats.invalid_replies += 1
                answer.error = f"invalid judge reply after {answer.attempts} attempt(s): {exc}: {content[:200]!r}"
                # The original prompt and only the last invalid reply, clipped: re-asks never grow the prompt.
                convo = [*messages, {"role": "assistant", "content": clip(content, REASK_CLIP)},
                         {"role": "user", "content": f"That reply was invalid: {clip(str(exc), REASK_CLIP)}. "
                                                     "Reply again with the JSON only."}]
                continue
            answer.error = None
            self.cache.put(key, content, answer.prompt_tokens, answer.completion_tokens, self.config.model)
            return answer
        return answer


# ---------------------------------------------------------------- modes


def chars(messages: list[dict[str, Any]]) -> int:
    """A prompt's size as the budget counts it: the contents plus some framing per message."""
    return sum(len(str(m.get("content") or "")) + 16 for m in messages)


Progress = Callable[[int], None]


class JudgeMode:
    """One way of judging trajectories; a subclass sets `name`, `together` and `kind` and implements `judge`."""

    name = ""
    together: str | None = None  # the trajectory field whose equal values are judged together (None: alone)
    kind = "score"  # the annotations' kind

    def annotator(self, rubric: Rubric) -> str:
        """The annotator name this mode's annotations carry."""
        return f"{rubric.annotator}:{self.name}"

    def sets(self, rows: list[TrajectoryRow]) -> dict[Any, list[TrajectoryRow]]:
        """`rows` by the value of the field this mode judges together, in the order first seen."""
        out: dict[Any, list[TrajectoryRow]] = defaultdict(list)
        for row in rows:
            out[row[self.together]].append(row)
        return out

    def row(self, config: JudgeConfig, tid: str, run_id: str, answer: Answer | None, **fields: Any) -> UncheckedRow:
        """An annotation row for one trajectory (not yet normalised); an error when `fields` has no score."""
        row: dict[str, Any] = {"trajectory_id": tid, "annotator": config.annotator, "judge_model": config.model,
                               "rubric": config.rubric.name, "run_id": run_id, "kind": self.kind}
        if answer is not None:
            row.update(prompt_hash=answer.prompt_hash, prompt_tokens=answer.prompt_tokens,
                       completion_tokens=answer.completion_tokens,
                       cost_usd=config.cost(answer.prompt_tokens, answer.completion_tokens))
        row.update(fields)
        row["status"] = "error" if row.get("error") else "ok"
        return row

    async def judge(self, judge: Judge, rows: list[TrajectoryRow], run_id: str,
                    progress: Progress = lambda n: None) -> list[UncheckedRow]:
        """Annotation rows for `rows` (a failed call is an error row, never a score)."""
        raise NotImplementedError


JUDGE_MODES = Registry("judge mode", None, {
    "pointwise": "omrl.annotate.judge_modes:Pointwise",
    "pairwise": "omrl.annotate.judge_modes:Pairwise",
    "group": "omrl.annotate.judge_modes:Group",
})


def judge_mode(name: str) -> JudgeMode:
    """The mode registered as `name`."""
    return JUDGE_MODES.load(name)()


async def judge_rows(judge: Judge, rows: list[TrajectoryRow], run_id: str,
                     progress: Progress = lambda n: None) -> list[UncheckedRow]:
    """Annotation rows for trajectory rows, judged in the judge's configured mode."""
    return await judge_mode(judge.config.mode).judge(judge, rows, run_id, progress)


async def run_judge(config: JudgeConfig, rows: list[TrajectoryRow], run_id: str, cache: JudgeCache | None = None,
                    progress: Progress = lambda n: None) -> tuple[list[UncheckedRow], JudgeStats]:
    """Judge trajectory rows in the configured mode; returns annotation rows and call statistics."""
    judge = Judge(config, cache)
    try:
        rows_out = await judge_rows(judge, rows, run_id, progress)
    finally:
        await judge.close()
    return rows_out, judge.stats


def judge_config(spec: Any, source: str = "<dict>", index: int = 0) -> JudgeConfig:
    """A JudgeConfig from entry `index` of a reward recipe's `judges` list, by omrl.config.from_dict (errors
    name the recipe and the key, `judges[0].max_tokens`).

    `rubric` is a rubric YAML path or an inline rubric mapping; `base_url` or `model` of the form "$VAR" is
    read from that environment variable (a server started per run); the API key only ever comes from the variable
    named by `api_key_env` (default OPENAI_API_KEY), never from the recipe, which is stored with the scores.
    """
    import os

    from omrl.annotate.rubric import load_rubric
    from omrl.config import RecipeError, from_dict

    where, key = f"reward recipe {source}", f"judges[{index}]"
    if not isinstance(spec, dict):
        raise RecipeError(f"{where}: {key} must be a mapping of judge settings")
    if "api_key" in spec:
        raise RecipeError(f"{where}: {key}.api_key: the key is never written in a recipe (it is stored with "
                          "the scores); name its environment variable with api_key_env")
    # An empty rubric, model or base_url is as good as none: the loader names it as missing.
    values = {k: v for k, v in spec.items() if k != "api_key_env" and (v or k not in ("rubric", "model", "base_url"))}
    rubric = spec.get("rubric")
    if isinstance(rubric, dict):
        values["rubric"] = load_rubric(rubric, where=f"{where} (inline rubric of {key})")
    elif rubric:
        values["rubric"] = load_rubric(rubric)
    for name in ("model", "base_url"):
        value = spec.get(name)
        if isinstance(value, str) and value.startswith("$"):
            if not os.environ.get(value[1:]):
                raise RecipeError(f"{where}: {key}.{name} {value} names an environment variable that is not set")
            values[name] = os.environ[value[1:]]
    values["api_key"] = os.environ.get(str(spec.get("api_key_env") or "OPENAI_API_KEY"), "EMPTY")
    return from_dict(JudgeConfig, values, where=where, prefix=f"{key}.")
