"""How each environment reads to a person, beside the generic chat view: a registry env name -> renderer.

A renderer turns a stored trajectory row into plain data (strings, numbers, lists) for its template
(templates/env_KIND.html), which escapes every value like every page: no stored text is ever trusted as markup.
What each environment keeps in a turn's info (read from omrl/envs/NAME/env.py and scripted episodes):

- text games (textworld, twx, scienceworld): "command", "score" (textworld also "max_score"), "note";
- bfcl: per reply "bfcl_turn"; the end of a user turn "turn_valid", "note" and the checker's "error_type",
  "error_message";
- miniwob: "screenshot" (a data:image/png;base64 URL, with screenshots=True), "note";
- swe: the submit's "model_patch", "resolved", "fail_to_pass", "pass_to_pass", "patch_applied", ...;
- os: per bash call "returncode", "timed_out"; the answer's "expected", "checker".

A turn of several tool calls keeps one info per call under "steps" (omrl.rollout.agent).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from omrl.schema.payloads import info_of
from omrl.view.data import ShownTrajectory

EnvView = dict[str, Any]  # {"kind": templates/env_KIND.html, ...what that template shows}
Renderer = Callable[[ShownTrajectory], EnvView | None]

# Only this shape is shown as an image: a PNG in base64, nothing that could close the attribute or load a URL.
PNG_DATA_URL = re.compile(r"data:image/png;base64,[A-Za-z0-9+/]+={0,2}")


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    try:
        found = json.loads(call.get("arguments") or "{}")
    except (TypeError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def steps(row: ShownTrajectory) -> list[dict[str, Any]]:
    """The episode as actions: one entry per tool call (or per plain-text reply), with the turn it belongs
    to, its call name and arguments, the observation that answered it and the info the environment left."""
    messages = list(row.get("messages") or [])
    turns = {t.get("index"): t for t in row.get("turns") or []}
    out: list[dict[str, Any]] = []
    turn = -1
    for position, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        turn += 1
        info = info_of(turns[turn]) if turn in turns else {}
        calls = message.get("tool_calls") or []
        per_call = info.get("steps") if isinstance(info.get("steps"), list) else [info] * max(len(calls), 1)
        after = []  # the messages answering this one: up to the next assistant message
        for later in messages[position + 1:]:
            if later.get("role") == "assistant":
                break
            after.append(later)
        results = [m for m in after if m.get("role") == "tool"]
        base = {"turn": turn, "reward": turns.get(turn, {}).get("reward"), "position": position}
        if not calls:
            reply = next((m for m in after if m.get("role") == "user"), None)
            out.append(dict(base, name=None, arguments={}, text=message.get("content") or "",
                            observation=None if reply is None else reply.get("content") or "",
                            info=per_call[0] if per_call and isinstance(per_call[0], dict) else {}))
            continue
        for k, call in enumerate(calls):
            result = next((m for m in results if call.get("id") and m.get("tool_call_id") == call.get("id")),
                          results[k] if k < len(results) else None)
            step_info = per_call[k] if k < len(per_call) and isinstance(per_call[k], dict) else {}
            out.append(dict(base, name=call.get("name"), arguments=_arguments(call), text=message.get("content") or "",
                            observation=None if result is None else result.get("content") or "", info=step_info))
    return out


def _opening(row: ShownTrajectory) -> str:
    """The first user message: the task and the first observation."""
    return next((m.get("content") or "" for m in row.get("messages") or [] if m.get("role") == "user"), "")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def text_game(row: ShownTrajectory) -> EnvView:
    """A text game's transcript: per command, what the game answered and the score after it."""
    lines = []
    for s in steps(row):
        info = s["info"]
        score = info.get("score")
        if score is not None and info.get("max_score") is not None:
            score = f"{score}/{info['max_score']}"
        command = info.get("command") or s["arguments"].get("command") or s["text"]
        lines.append({"turn": s["turn"], "command": _text(command), "observation": _text(s["observation"]),
                      "score": _text(score) if score is not None else "", "reward": s["reward"],
                      "invalid": bool(info.get("invalid_action")), "position": s["position"]})
    return {"kind": "transcript", "title": "game transcript", "opening": _opening(row), "lines": lines}


def bfcl(row: ShownTrajectory) -> EnvView:
    """BFCL's conversation by user turn: the question, each function call with its result, the replies, and
    the checker's verdict on the turn."""
    played = steps(row)
    verdicts: dict[int, dict[str, Any]] = {}
    for s in played:
        if "turn_valid" in s["info"] and isinstance(s["info"].get("bfcl_turn"), int):
            info = s["info"]
            verdicts[info["bfcl_turn"]] = {
                "valid": bool(info["turn_valid"]), "note": _text(info.get("note")),
                "error": " ".join(_text(info.get(k)) for k in ("error_type", "error_message") if info.get(k))}
    sections: list[dict[str, Any]] = []
    by_position: dict[int, list[dict[str, Any]]] = {}
    for s in played:
        by_position.setdefault(s["position"], []).append(s)
    for position, message in enumerate(row.get("messages") or []):
        role = message.get("role")
        if role == "user":
            sections.append({"question": _text(message.get("content")), "entries": []})
        elif role == "assistant" and sections:
            for s in by_position.get(position, []):
                if s["name"]:
                    sections[-1]["entries"].append({"call": s["name"], "arguments": json.dumps(s["arguments"]),
                                                  "result": _text(s["observation"]),
                                                  "error": bool(s["info"].get("invalid_action"))})
                elif s["text"]:
                    sections[-1]["entries"].append({"reply": s["text"]})
    for number, section in enumerate(sections):
        section["number"] = number
        section["verdict"] = verdicts.get(number)
    return {"kind": "bfcl", "title": "user turns and the checker's verdicts", "sections": sections}


def miniwob(row: ShownTrajectory) -> EnvView:
    """MiniWoB's actions, each with the page it left (the stored screenshot, when it is a PNG data URL)."""
    actions = []
    for s in steps(row):
        shot = s["info"].get("screenshot")
        actions.append({"turn": s["turn"], "action": f"{s['name'] or 'reply'}({json.dumps(s['arguments'])})"
                        if s["name"] else s["text"], "observation": _text(s["observation"]),
                        "note": _text(s["info"].get("note")),
                        "screenshot": shot if isinstance(shot, str) and PNG_DATA_URL.fullmatch(shot) else None})
    return {"kind": "screenshots", "title": "actions and the page after each", "opening": _opening(row),
            "actions": actions, "shots": sum(a["screenshot"] is not None for a in actions)}


def diff_lines(patch: str) -> list[dict[str, str]]:
    """A unified diff's lines, each with its kind (file, hunk, add, del, context) for colouring."""
    out = []
    for line in patch.splitlines():
        if line.startswith(("diff --git", "index ", "--- ", "+++ ")):
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "context"
        out.append({"kind": kind, "text": line})
    return out


SWE_RESULTS = ("resolved", "fail_to_pass", "pass_to_pass", "patch_applied", "test_seconds", "dropped_from_patch",
               "forgery_signs", "report_error")


def swe(row: ShownTrajectory) -> EnvView:
    """The submitted diff and the tests' verdict (the submit step's info)."""
    submitted = next((s["info"] for s in reversed(steps(row)) if "model_patch" in s["info"]), None)
    if submitted is None:
        return {"kind": "swe", "title": "submission", "submitted": False, "diff": [], "results": []}
    results = [{"key": k, "value": _text(submitted[k])} for k in SWE_RESULTS if k in submitted]
    return {"kind": "swe", "title": "submission", "submitted": True, "resolved": submitted.get("resolved"),
            "diff": diff_lines(_text(submitted.get("model_patch"))), "results": results}


def os_shell(row: ShownTrajectory) -> EnvView:
    """The shell session as a terminal: each command, its output and exit status; the answer and its check."""
    entries = []
    for s in steps(row):
        info = s["info"]
        if s["name"] == "bash":
            entries.append({"command": _text(s["arguments"].get("command")), "output": _text(s["observation"]),
                            "status": info.get("returncode"), "timed_out": bool(info.get("timed_out"))})
        else:
            what = s["name"] or "reply"
            said = _text(s["arguments"].get("answer")) if s["name"] else s["text"]
            check = ", ".join(f"{k} {_text(info[k])}" for k in ("expected", "checker") if info.get(k) is not None)
            entries.append({"final": what, "said": said, "output": _text(s["observation"]), "check": check})
    return {"kind": "terminal", "title": "shell session", "entries": entries}


RENDERERS: dict[str, Renderer] = {
    "textworld": text_game, "twx": text_game, "scienceworld": text_game,
    "bfcl": bfcl, "miniwob": miniwob, "swe": swe, "os": os_shell,
}


def env_view(row: ShownTrajectory) -> EnvView | None:
    """The environment's own view of the row (None: no renderer for its env, the chat view alone)."""
    renderer = RENDERERS.get(str(row.get("env") or ""))
    return None if renderer is None else renderer(row)
