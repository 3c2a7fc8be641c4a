"""`bfcl`: BFCL multi-turn function calling (Berkeley Function Calling Leaderboard v4), scored by its own checker.

Needs bfcl-eval (its data and API classes), installed without its heavy dependencies:
`pip install 'omrl[bfcl]' && pip install --no-deps bfcl-eval==2026.3.23`.

Tasks: `omrl tasks generate bfcl --split multi_turn_base --n 50` picks entries of one BFCL multi-turn
category (multi_turn_base, multi_turn_miss_func, multi_turn_miss_param, multi_turn_long_context; 200
each). Entry i of every category is a variant of the same scenario i, so to hold scenarios out give a
range: `--option scenarios=0-159` for training, `scenarios=160-199` for testing. The payload holds the
BFCL entry id, the category, the scenario index and the bfcl-eval version: the package's data replays
the episode (question, initial state, ground truth).

An episode is one BFCL conversation. The first observation is the first user turn; the tools are the
functions of the entry's API classes (file system, trading, travel, vehicle, messages, posts, tickets,
math) as OpenAI schemas made from BFCL's function docs. A tool call runs on the entry's stateful API
instances (made from its initial config) and its result is the observation, exactly as BFCL renders it;
a wrong call (unknown function, bad arguments) is an observation ("Error during execution: ..."), never a
crash. The model ends a user turn by replying without a tool call, as in BFCL's own inference loop;
that turn is then scored and the next user turn arrives as the observation. In miss_func entries the
held-out functions are added to the tools at their turn (with BFCL's message "I have updated some more
functions you can choose from. What about now?"); the stored row's `tools` are the last set. More than
20 replies with tool calls in one user turn end the episode as failed (BFCL's force-quit, MAXIMUM_STEP_LIMIT).

Scoring: each user turn is checked with bfcl-eval's state_checker and response_checker by the rules of
its multi_turn_checker (the API instances equal the ground truth's after the turn; every ground-truth
result of the turn is among the model's results so far); turns whose ground truth is empty are not
checked. Every turn's result goes to that turn's `turns.info` (`turn_valid`, `bfcl_turn`, a `note` that
`omrl show` prints, `error_type`, `error_message`, the differences); success = every turn passes (BFCL's entry accuracy), reward 1.0 then,
else 0.0. As in BFCL, any public method of the entry's classes runs, offered or not (a held-back
function called anyway is marked `not_offered` in the step's info). Differences from BFCL's harness:
calls are made directly with their JSON arguments (BFCL `eval`s a call string, so nothing but the API
methods can run here), and a call that runs longer than `call_timeout_s` ends the episode as failed
(one that outgrows `memory_mb` gets "Error during execution: ..." like any failing call).

The API instances live in an engine process per environment (omrl.envs.engine.EngineWorker; reusable, so
episodes reuse it), which never outlives omrl. If it dies mid-episode the episode is stored as env_error. The expert (`--policy scripted`) plays the ground truth: one reply with all of a turn's calls,
then a reply without calls; the random policy calls random functions with random arguments.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from omrl.envs.base import Action, Reset, StepResult, Task
from omrl.envs.bfcl.data import turn_text
from omrl.envs.bfcl.tasks import bfcl_tasks
from omrl.envs.engine import EngineTimeout, EngineWorker
from omrl.errors import UsageError

SYSTEM_PROMPT = ("You are a helpful assistant with access to functions. Complete each user request by calling "
                 "the functions; the result of each call comes back as the next message. When you have done "
                 "what the request asks, or it cannot be done with your functions or without more information, "
                 "reply in plain text without a function call; the user's next request then follows.")
END_OF_CONVERSATION = "The conversation is over."
EXPERT_DONE = "Done."
EXPERT_CANNOT = "I cannot complete this request with the functions and information I have."
ENGINE = "omrl.envs.bfcl.worker:BfclEngine"
START_TIMEOUT_S = 60.0  # the engine's start: Python plus the API classes (about 0.3 s on a quiet machine)


def _install_hint() -> str:
    return "pip install 'omrl[bfcl]' && pip install --no-deps bfcl-eval==2026.3.23"


@dataclass
class BfclOptions:
    """BfclEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    call_timeout_s: float = 10.0
    memory_mb: int = 1024


class BfclEnv:
    """BFCL multi-turn function calling: stateful APIs, per-turn state and response checks by bfcl-eval."""

    name = "bfcl"
    options_class = BfclOptions
    default_max_turns = 100  # BFCL allows 20 replies with calls per user turn; entries have up to ~5 turns
    splits = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
    reusable = True  # one engine process serves episode after episode

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            import bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker  # noqa: F401

            from omrl.envs.bfcl import data

            for name in ("GorillaFileSystem", "MathAPI", "TradingBot"):
                data.api_class(name)
        except ImportError as exc:
            return f"needs bfcl-eval and mpmath ({exc}): {_install_hint()}"
        return None

    @classmethod
    def resource_limits(cls) -> str:
        return "each call 10 s (call_timeout_s), engine process 1024 MB of address space (memory_mb)"

    @classmethod
    def generate_tasks(cls, n: int, seed: int = 0, split: str = "multi_turn_base", scenarios: Any = None
                       ) -> list[Task]:
        """`n` entries of category `split`, drawn by `seed` (the same arguments, the same tasks), from the
        scenario indices `scenarios` selects (default: all 200)."""
        return bfcl_tasks(n, seed=seed, split=split, scenarios=scenarios)

    def __init__(self, call_timeout_s: float = 10.0, memory_mb: int = 1024) -> None:
        if float(call_timeout_s) <= 0 or int(memory_mb) < 256:
            raise UsageError("call_timeout_s must be positive and memory_mb at least 256")
        from omrl.envs.bfcl import data

        self.data = data
        self.call_timeout_s = float(call_timeout_s)
        self.memory_mb = int(memory_mb)
        self.engine = EngineWorker(ENGINE, {"memory_mb": self.memory_mb}, name="bfcl",
                                   start_timeout=START_TIMEOUT_S, call_timeout=START_TIMEOUT_S)
        self.item: dict[str, Any] = {}
        self.done = True

    # ---------------------------------------------------------------- episode

    def reset(self, task: Task) -> Reset:
        entry_id = task.payload.get("entry_id")
        if not entry_id:
            raise UsageError(f"bfcl task {task.id}: the payload has no entry_id (generate tasks with "
                             "`omrl tasks generate bfcl`)")
        self.item = self.data.entry(str(entry_id))
        offered, self.held = self.data.entry_functions(self.item)
        self.tools = [self.data.tool_schema(doc) for doc in offered]
        self.engine.ensure()  # a new engine process if a runaway call had the last one killed
        self.engine.call("start", self.item["id"])
        self.turn = 0  # the user turn being played
        self.replies = 0  # replies with tool calls in this user turn
        self.last_reply: int | None = None
        self.results: list[dict[str, Any]] = []  # each user turn's check
        self.expert_sent = False
        self.done = False
        return Reset(observation=self._question(0), tools=list(self.tools), system_prompt=SYSTEM_PROMPT)

    def step(self, action: Action) -> StepResult:
        if self.done:
            return StepResult("The conversation is over; no more actions are accepted.", 0.0, True,
                              {"invalid_action": True, "success": False})
        if action.tool is None:
            return self._end_turn()
        if action.turn is None or action.turn != self.last_reply:
            self.replies += 1
            self.last_reply = action.turn
        try:
            reply = self.engine.call("call", action.tool, action.arguments, timeout=self.call_timeout_s)
        except EngineTimeout:  # the engine was killed; the next reset starts a new one
            return self._finish(f"The call {action.tool} ran longer than {self.call_timeout_s:g} s and was stopped.",
                                {"error_type": "omrl:call_limit", "error_message":
                                 f"{action.tool} ran past call_timeout_s={self.call_timeout_s:g}"})
        info: dict[str, Any] = {"bfcl_turn": self.turn}
        if reply["error"]:
            info["invalid_action"] = True
        elif not any(t["function"]["name"] == action.tool for t in self.tools):
            info["not_offered"] = True  # a held-back function called anyway: BFCL runs it too
        from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT

        if self.replies > MAXIMUM_STEP_LIMIT:
            return self._finish(reply["result"], {
                **info, "error_type": "multi_turn:force_terminated",
                "error_message": f"more than {MAXIMUM_STEP_LIMIT} replies with function calls in turn {self.turn}"})
        return StepResult(reply["result"], 0.0, False, info)

    def _end_turn(self) -> StepResult:
        check = self.engine.call("end_turn")
        self.results.append(check)
        info = {"turn_valid": check["valid"], "bfcl_turn": self.turn, "note": _verdict(self.turn, check),
                **{k: v for k, v in check.items() if k not in ("turn", "valid")}}
        self.turn += 1
        self.replies, self.last_reply, self.expert_sent = 0, None, False
        if self.turn >= len(self.item["question"]):
            return self._finish(END_OF_CONVERSATION, info)
        added = self.held.get(self.turn)
        if added:
            from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

            self.tools = self.tools + [self.data.tool_schema(doc) for doc in added]
            info["tools_added"] = [d["name"] for d in added]
            return StepResult(self._question(self.turn) or DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC, 0.0,
                              False, info, tools=list(self.tools))
        return StepResult(self._question(self.turn), 0.0, False, info)

    def _finish(self, observation: str, info: dict[str, Any]) -> StepResult:
        """The episode's last step: success when every user turn was played and passed its check."""
        self.done = True
        played = len(self.results) == len(self.item["question"])
        success = played and all(r["valid"] for r in self.results)
        failed = next((r for r in self.results if not r["valid"]), None)
        summary = {"success": success, "turns_valid": [r["valid"] for r in self.results],
                   "turns": len(self.item["question"]), "entry_id": self.item["id"]}
        if failed is not None and "error_type" not in info:
            summary.update(failed_turn=failed["turn"], error_type=failed.get("error_type"))
        return StepResult(observation, 1.0 if success else 0.0, True, {**info, **summary})

    def _question(self, turn: int) -> str:
        return turn_text(self.item["question"][turn])

    # ---------------------------------------------------------------- policies

    def expert_action(self) -> Action | list[Action]:
        """The ground truth of the current user turn: all its calls in one reply, then a reply without calls
        (at once when the turn's ground truth is empty: the request cannot be done yet)."""
        truths = self.item["ground_truth"][self.turn] if not self.done else []
        if self.expert_sent or not truths:
            return Action(text=EXPERT_DONE if truths else EXPERT_CANNOT)
        self.expert_sent = True
        actions = []
        for text in truths:
            name, arguments = self.data.call_arguments(self.item, text)
            actions.append(Action(tool=name, arguments=arguments))
        return actions

    def random_action(self, rng: random.Random) -> Action:
        """A random offered function with random arguments of the right types; a quarter of the time, the
        end of the turn."""
        if rng.random() < 0.25:
            return Action(text=rng.choice(["ok", "Done.", "What next?"]))
        words = [w.strip("'\".,?!") for w in self._question(self.turn).split()] or ["x"]
        schema = rng.choice(self.tools)["function"]
        arguments = {}
        for name, spec in schema["parameters"]["properties"].items():
            if name not in schema["parameters"].get("required", []) and rng.random() < 0.5:
                continue
            arguments[name] = _random_value(spec, rng, words)
        return Action(tool=schema["name"], arguments=arguments)

    # ---------------------------------------------------------------- lifecycle

    def close(self) -> None:
        self.done = True
        self.engine.close()


def _verdict(turn: int, check: dict[str, Any]) -> str:
    if not check["checked"]:
        return f"user turn {turn}: not checked (no ground-truth calls)"
    if check["valid"]:
        return f"user turn {turn}: passed"
    return f"user turn {turn}: failed ({check.get('error_type')})"


def _random_value(spec: dict[str, Any], rng: random.Random, words: list[str]) -> Any:
    kind = spec.get("type")
    if spec.get("enum"):
        return rng.choice(spec["enum"])
    if kind == "integer":
        return rng.randint(0, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_random_value(spec.get("items") or {"type": "string"}, rng, words) for _ in range(rng.randint(1, 3))]
    if kind == "object":
        return {}
    return rng.choice(words)
