"""The BFCL engine: one episode's API instances, its calls and the check of each user turn.

It lives in the environment's engine process (omrl.envs.engine.EngineWorker, which also guarantees the
process never outlives omrl), so that a runaway call can be stopped and a crash is the engine's alone:

    engine.call("start", "multi_turn_base_0")
    engine.call("call", "cd", {"folder": "document"})   -> {"result": "...", "error": False}
    engine.call("end_turn")                             -> the turn's check (see Episode.end_turn)

Calls go to the public methods of the entry's API classes, with the model's JSON arguments as keyword
arguments: nothing is evaluated as code (BFCL itself builds a call string and `eval`s it; for JSON values
the call made is the same). As in BFCL, every public method of the entry's classes can be called, offered
or not (miss_func holds some back from the tools only); any other name gets BFCL's undefined-name error.
Results are rendered as BFCL renders them (str as is, dict as JSON, else str()); an exception inside a
call becomes "Error during execution: ..." as in BFCL. The ground-truth calls run on a second set of
instances of the same scenario; each user turn is then checked with bfcl-eval's own state_checker and
response_checker, by the rules of its multi_turn_checker.
"""

from __future__ import annotations

import copy
import inspect
import json
import resource
from typing import Any

from omrl.envs.bfcl import data

DETAIL_CHARS = 300  # how much of a mismatching value a check result shows


def render_result(result: Any) -> str:
    """A call's return value as BFCL shows it to the model and compares it: str as is, dict as JSON, else str()."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


class Scenario:
    """The API instances of one entry (model side or ground-truth side) and their public methods."""

    def __init__(self, item: dict[str, Any]) -> None:
        from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

        long_context = "long_context" in data.category_of(item["id"])
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        for class_name in item["involved_classes"]:
            instance = data.api_class(class_name)()
            if class_name not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(item["initial_config"].get(class_name, {})),
                                        long_context=long_context)
            self.instances[class_name] = instance
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method

    def execute(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """(the result text, whether the call failed to execute) of one call."""
        method = self.methods.get(name)
        if method is None:
            return f"Error during execution: name '{name}' is not defined", True
        try:
            return render_result(method(**arguments)), False
        except Exception as exc:  # BFCL turns any exception of a call into its result text
            return f"Error during execution: {exc}", True


class Episode:
    """One entry being played: the model's instances, the ground truth's, and the turn being scored."""

    def __init__(self, entry_id: str) -> None:
        self.item = data.entry(entry_id)
        self.model = Scenario(self.item)
        self.truth = Scenario(self.item)
        self.turn = 0
        self.calls_this_turn = 0
        self.model_results: list[str] = []  # every result of the model's calls so far, all turns

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.calls_this_turn += 1
        result, failed = self.model.execute(name, arguments)
        self.model_results.append(result)
        return {"result": result, "error": failed}

    def end_turn(self) -> dict[str, Any]:
        """Run this turn's ground-truth calls, then check the turn as multi_turn_checker does: a turn whose
        ground truth is empty is not checked (the model should not achieve it); otherwise the model must
        have called something this turn, its instances must equal the ground truth's (state_checker), and
        every ground-truth result of this turn must be among the model's results so far, in any order
        (response_checker)."""
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

        index = self.turn
        truths = self.item["ground_truth"][index] if index < len(self.item["ground_truth"]) else []
        expected = [self.truth.execute(*data.call_arguments(self.item, text))[0] for text in truths]
        called, self.calls_this_turn, self.turn = self.calls_this_turn > 0, 0, index + 1
        out: dict[str, Any] = {"turn": index, "checked": bool(truths)}
        if not truths:
            return {**out, "valid": True}
        if not called:
            return {**out, "valid": False, "error_type": "multi_turn:empty_turn_model_response",
                    "error_message": f"Model response list is empty for turn {index}"}
        state = state_checker(self.model.instances, self.truth.instances)
        if not state["valid"]:
            differences = state.get("details", {}).get("differences", {})
            return {**out, "valid": False, "error_type": state["error_type"], "error_message": state["error_message"],
                    "differences": {k: {side: repr(v)[:DETAIL_CHARS] for side, v in d.items()}
                                    for k, d in differences.items()}}
        response = response_checker(self.model_results, expected, index)
        if not response["valid"]:
            missing = response.get("details", {}).get("missing_items", [])
            return {**out, "valid": False, "error_type": response["error_type"],
                    "error_message": response["error_message"], "missing": [m[:DETAIL_CHARS] for m in missing]}
        return {**out, "valid": True}


class BfclEngine:
    """What the environment's engine process holds (omrl.envs.engine.EngineWorker builds it there): the
    episode being played. Its address space is capped at `memory_mb`, so a call that would outgrow it
    fails with MemoryError (an "Error during execution" result) instead of taking the machine's memory."""

    def __init__(self, memory_mb: int = 1024) -> None:
        if memory_mb > 0:
            limit = int(memory_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        self.version = data.version()
        self.episode: Episode | None = None

    def start(self, entry_id: str) -> None:
        self.episode = Episode(entry_id)

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self._episode().call(name, arguments)

    def end_turn(self) -> dict[str, Any]:
        return self._episode().end_turn()

    def _episode(self) -> Episode:
        if self.episode is None:
            raise RuntimeError("no episode was started")
        return self.episode
