"""The one agent loop: prompt -> policy -> tool calls -> environment, shared by collect, eval and GRPO.

    episode = await run_episode(env, task, policy, run_id="r", max_turns=10)
    episode.row       # the normalized trajectory row (omrl.schema), ready for Store.append
    episode.context   # the EpisodeContext: token-native policies leave token traces in context.scratch

Every environment call runs in a worker thread (`asyncio.to_thread`) because environments may block
(subprocesses, databases); the event loop keeps serving the other episodes meanwhile.

Outcome of an episode (the `status` column):
- ok: the environment said done. reward = sum of step rewards; success = info["success"] of the last
  step, or (when absent) last step reward >= 1.
- truncated: max_turns reached first, or the next prompt would not fit the model's context (the policy
  raised ContextFull; `error` says so). reward = sum so far (a real outcome under the budget);
  success = False.
- policy_error / env_error / timeout: something failed; `error` says what. reward and success are
  None: a failed episode is never scored, not even 0. The reward earned before the failure stays in
  the per-turn rewards and in metadata["partial_reward"].

A policy that says how it sent the conversation (`prompt_format`: OpenAIPolicy's "text_tools" when tools went
as text) has it recorded in metadata["prompt_format"]: the prompt the model saw is rebuilt from it.

Text that is not Unicode (a lone surrogate in a model's reply, e.g. a server's JSON escape of half a
UTF-16 pair, or in an observation) is stored with U+FFFD in its place and counted in
metadata["replaced_surrogates"]: it could be neither sent back to the model nor written to the store.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from omrl.envs.base import Action, Reset, StepResult
from omrl.policies.base import ContextFull, EpisodeContext, PolicyError, PolicyReply, PolicyTimeout
from omrl.schema import group_id, is_failed, normalize_trajectory, replace_lone_surrogates, trajectory_id
from omrl.schema.rows import TrajectoryRow

DEFAULT_SYSTEM_PROMPT = ("You are an agent solving a task step by step. Use the tools offered to act; "
                         "each tool result comes back as the next message.")
DEFAULT_TEXT_SYSTEM_PROMPT = "You are an agent solving a task step by step. Reply with your next action."


@dataclass
class Episode:
    """A finished episode: the stored row and the context the policy played in."""

    row: TrajectoryRow
    context: EpisodeContext

    @property
    def status(self) -> str:
        return self.row["status"]

    @property
    def reward(self) -> float | None:
        return self.row["reward"]

    @property
    def success(self) -> bool | None:
        return self.row["success"]


class _Stop(Exception):
    """Ends an episode early with a failure status."""

    def __init__(self, status: str, error: str):
        super().__init__(error)
        self.status = status
        self.error = error


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _within(awaitable, seconds: float | None, error: str):
    """Await with an optional time limit; running out ends the episode with status timeout."""
    if not seconds:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError:
        raise _Stop("timeout", error) from None


async def _env_call(what: str, func, *args):
    """Run an environment method in a thread; its exceptions become env_error."""
    try:
        return await asyncio.to_thread(func, *args)
    except Exception as exc:
        raise _Stop("env_error", f"{what} failed: {_describe(exc)}") from exc


def _assistant_message(reply: PolicyReply, turn: int) -> dict[str, Any]:
    calls = []
    for i, call in enumerate(reply.tool_calls):
        args = call.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args if args is not None else {}, ensure_ascii=False)
        calls.append({"id": call.get("id") or f"call_{turn}_{i}", "type": "function",
                      "function": {"name": call.get("name") or "", "arguments": args}})
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if calls:
        message["tool_calls"] = calls
    if reply.reasoning:
        message["reasoning"] = reply.reasoning
    return message


def _parse_arguments(call: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(arguments, None) or (None, why they are unusable)."""
    fn = call["function"]
    if not fn["name"]:
        return None, "the tool call has no function name"
    try:
        args = json.loads(fn["arguments"] or "{}")
    except json.JSONDecodeError as exc:
        return None, f"the arguments of {fn['name']} are not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(args, dict):
        return None, f"the arguments of {fn['name']} must be a JSON object, got {type(args).__name__}"
    return args, None


async def run_episode(env: Any, task: Any, policy: Any, *, run_id: str, round: int = 0, sample: int = 0,
                      max_turns: int = 10, temperature: float = 1.0, seed: int | None = None,
                      max_tokens: int | None = None, model_call_timeout: float | None = None,
                      turn_timeout: float | None = None, episode_timeout: float | None = None,
                      source: str = "collected", metadata: dict[str, Any] | None = None,
                      attempt: int = 0) -> Episode:
    """Play one episode of `task` in `env` with `policy`; never raises for env or policy failures.

    `attempt` > 0 replays an episode whose earlier attempts failed (a new id, metadata "attempt")."""
    tid = trajectory_id(run_id, round, task.id, sample, attempt)
    context = EpisodeContext(env=env, task=task, episode_id=tid, sample=sample, temperature=temperature,
                             seed=seed, max_tokens=max_tokens, model_call_timeout=model_call_timeout)
    state: dict[str, Any] = {"messages": [], "turns": [], "tools": [], "last": None, "invalid": 0, "replaced": 0}
    started = time.monotonic()
    status, error = "ok", None
    try:
        status = await _within(_play(env, task, policy, context, state, max_turns, turn_timeout),
                               episode_timeout, f"episode exceeded episode_timeout={episode_timeout}s")
    except _Stop as stop:
        status, error = stop.status, stop.error
    duration = time.monotonic() - started

    turns = state["turns"]
    earned = sum(t["reward"] or 0.0 for t in turns)
    last: StepResult | None = state["last"]
    if status == "ok":
        reward = earned
        info = last.info or {}  # an environment may leave info (or reward) None, as the step handling allows
        success = bool(info.get("success", (last.reward or 0.0) >= 1))
    elif status == "truncated":
        reward, success = earned, False
    else:
        reward, success = None, None
    meta = {"seed": seed, "temperature": temperature, "max_turns": max_turns,
            "invalid_actions": state["invalid"], **(metadata or {}), **({"attempt": attempt} if attempt else {})}
    meta.update(_prompt_format(policy))
    if is_failed(status):
        meta["partial_reward"] = earned
    prompt_tokens = [t["prompt_tokens"] for t in turns if t["prompt_tokens"] is not None]
    completion_tokens = [t["completion_tokens"] for t in turns if t["completion_tokens"] is not None]
    task_row = task.to_row() if hasattr(task, "to_row") else dict(task)
    row = {
        "id": tid, "run_id": run_id, "round": round, "task_id": task.id,
        "group_id": group_id(run_id, round, task.id), "sample": sample,
        "env": getattr(env, "name", type(env).__name__), "model": getattr(policy, "name", type(policy).__name__),
        "instruction": task.instruction, "task": task_row, "tools": state["tools"],
        "messages": state["messages"], "turns": turns, "reward": reward, "success": success,
        "status": status, "error": error, "num_turns": len(turns),
        "prompt_tokens": sum(prompt_tokens) if prompt_tokens else None,
        "completion_tokens": sum(completion_tokens) if completion_tokens else None,
        "duration_s": duration, "source": source, "metadata": meta,
    }
    # The messages are clean already; an error text, a turn's info or the task may still hold some.
    for key in ("instruction", "task", "tools", "error", "metadata"):
        row[key] = _storable(state, row[key])
    for entry in turns:
        entry["info"] = _storable(state, entry["info"])
    if state["replaced"]:
        row["metadata"] = {**row["metadata"], "replaced_surrogates": state["replaced"]}
    return Episode(row=normalize_trajectory(row), context=context)


def _prompt_format(policy: Any) -> dict[str, str]:
    """{"prompt_format": ...} when the policy says how the conversation went to the model (OpenAIPolicy:
    "text_tools" or "native"), else nothing. Read at the episode's end: tool_format auto switches to text on the
    server's first refusal, before any reply. Training and `store check --tokens` rebuild the prompt from it."""
    fmt = getattr(policy, "prompt_format", None)
    return {"prompt_format": fmt} if isinstance(fmt, str) and fmt else {}


def _storable(state: dict[str, Any], value: Any) -> Any:
    """`value` as text that can be sent and stored (lone surrogates replaced, counted in `state`)."""
    value, replaced = replace_lone_surrogates(value)
    state["replaced"] += replaced
    return value


async def _play(env, task, policy, context, state, max_turns: int, turn_timeout: float | None) -> str:
    """The loop itself; returns "ok" or "truncated", raises _Stop on failure."""
    first: Reset = await _env_call("env.reset", env.reset, task)
    state["tools"] = list(first.tools or [])
    system = first.system_prompt or (DEFAULT_SYSTEM_PROMPT if state["tools"] else DEFAULT_TEXT_SYSTEM_PROMPT)
    state["messages"] += [{"role": "system", "content": system},
                          _storable(state, {"role": "user", "content": first.observation})]
    for turn in range(max_turns):
        if await _within(_play_turn(env, policy, context, state, turn), turn_timeout,
                         f"turn {turn} exceeded turn_timeout={turn_timeout}s"):
            return "ok"
    return "truncated"


def _offer(state: dict[str, Any], result: StepResult) -> None:
    """A step that changes the tools offered (StepResult.tools): the next model call gets them, the row keeps the last set."""
    if getattr(result, "tools", None) is not None:
        state["tools"] = list(result.tools)


async def _play_turn(env, policy, context, state, turn: int) -> bool:
    """One assistant turn and the environment steps it causes; returns whether the episode is done."""
    messages = state["messages"]
    started = time.monotonic()
    try:
        # A copy: a policy that keeps or edits the list must not change the record.
        reply = await policy.act([dict(m) for m in messages], state["tools"], context)
    except ContextFull as exc:  # an outcome under the context budget, like max_turns; not a failure
        raise _Stop("truncated", f"turn {turn}: {exc}") from exc
    except PolicyTimeout as exc:
        raise _Stop("timeout", f"turn {turn}: {_describe(exc)}") from exc
    except asyncio.TimeoutError as exc:
        raise _Stop("timeout", f"turn {turn}: policy timed out: {_describe(exc)}") from exc
    except PolicyError as exc:
        raise _Stop("policy_error", f"turn {turn}: {_describe(exc)}") from exc
    except Exception as exc:  # a bug or crash inside the policy: recorded, the run goes on
        raise _Stop("policy_error", f"turn {turn}: policy raised {_describe(exc)}") from exc
    latency = time.monotonic() - started
    message = _storable(state, _assistant_message(reply, turn))
    messages.append(message)

    reward, done, infos, invalid = 0.0, False, [], 0
    calls = message.get("tool_calls") or []
    if calls:
        for call in calls:
            if done:  # the environment ended the episode: later calls in the same turn are not run
                infos.append({"skipped_call": call["function"]["name"]})
                continue
            args, problem = _parse_arguments(call)
            if problem is not None:
                observation, info = f"Invalid action: {problem}. Call the tool again with valid JSON arguments.", {
                    "invalid_action": True, "reason": problem}
            else:
                action = Action(tool=call["function"]["name"], arguments=args, turn=turn)
                result = await _env_call(f"env.step({action.describe()[:200]})", env.step, action)
                observation, info = result.observation, dict(result.info or {})
                reward += result.reward or 0.0
                done = bool(result.done)
                state["last"] = result
                _offer(state, result)
            invalid += bool(info.get("invalid_action"))
            infos.append(info)
            messages.append(_storable(state, {"role": "tool", "tool_call_id": call["id"],
                                              "name": call["function"]["name"], "content": observation}))
    else:
        action = Action(text=reply.content or "", turn=turn)
        result = await _env_call(f"env.step({action.text[:200]!r})", env.step, action)
        reward, done, state["last"] = result.reward or 0.0, bool(result.done), result
        _offer(state, result)
        info = dict(result.info or {})
        invalid += bool(info.get("invalid_action"))
        infos.append(info)
        messages.append(_storable(state, {"role": "user", "content": result.observation}))
    state["invalid"] += invalid

    turn_info: dict[str, Any] = {"steps": infos} if len(infos) != 1 else dict(infos[0])
    if reply.raw_text is not None and reply.raw_text != reply.content:
        turn_info["raw_text"] = reply.raw_text  # the model's text before tool calls were parsed out
    if reply.finish_reason:
        turn_info["finish_reason"] = reply.finish_reason
    state["turns"].append({
        "index": turn, "reward": reward, "done": done, "latency_s": latency,
        "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
        "info": json.dumps(turn_info, ensure_ascii=False, default=str),
        "completion_ids": reply.completion_ids, "logprobs": reply.logprobs,
    })
    return done
