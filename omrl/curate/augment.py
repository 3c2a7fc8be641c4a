"""Perturbation augmentation: derived trajectories that keep their parent's outcome and lineage.

Each op is `op(row, rng, k) -> row | None` (None: not applicable to this trajectory, counted). Every
output gets id = hash(parent id, op, k, seed), parent_id, source "augmented:<op>", and metadata
{"augment": {...}}; reward and success are copied (no op here changes the outcome).

  paraphrase         rewrites the instruction (rule-based templates; an LLM when `paraphraser` is given)
                     in the `instruction` field and in the user message that states it
  observation_noise  tool outputs: an irrelevant line, reordered bullet lists, or long outputs cut
                     (head and tail kept); JSON outputs are left intact
  tool_rename        renames every tool consistently: tools JSON, assistant tool_calls, tool messages'
                     name, whole-word mentions in system messages; also shuffles the tools' order
  error_recovery     inserts, before a correct tool call, a failed call (a misspelt tool name or a
                     missing argument) and its error observation, both trainable=False
  drop_redundant     drops a repeated identical call to a read-only tool whose result was identical
                     (the re-check taught nothing), with its tool result and turn
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from omrl.annotate.inputs import parse_json
from omrl.errors import OmrlError, UsageError
from omrl.schema import TRAJECTORY_SCHEMA
from omrl.schema.payloads import metadata_of
from omrl.store import Store

Row = dict[str, Any]

# ---------------------------------------------------------------- paraphrase

_PREFIXES = ["Please ", "Your task: ", "Task: ", "Here is what to do: ", "I need your help. "]
_SYNONYMS = {"find": "locate", "compute": "calculate", "calculate": "compute", "show": "display",
             "determine": "work out", "list": "enumerate", "get": "obtain", "use": "make use of",
             "return": "give back", "check": "verify", "create": "make", "remove": "delete"}


def rule_paraphrase(text: str, rng: random.Random) -> str:
    """A template paraphrase: a framing prefix and some verb synonyms; numbers and names untouched."""

    def swap(m: re.Match) -> str:
        word = m.group(0)
        rep = _SYNONYMS.get(word.lower())
        if rep is None or rng.random() >= 0.7:
            return word
        return rep.capitalize() if word[0].isupper() else rep

    body = re.sub(r"[A-Za-z]+", swap, text)
    if body[:1].isupper() and not body[1:2].isupper():  # "Find x" -> "Task: find x", but keep "NASA"
        body = body[0].lower() + body[1:]
    return rng.choice(_PREFIXES) + body


def numbers_kept(original: str, paraphrase: str) -> bool:
    """Every number of the original is still in the paraphrase (an LLM paraphrase must not change facts)."""
    return Counter(re.findall(r"\d+(?:\.\d+)?", original)) <= Counter(re.findall(r"\d+(?:\.\d+)?", paraphrase))


def op_paraphrase(row: Row, rng: random.Random, k: int, paraphraser: Callable[[str, int], str] | None = None) -> Row | None:
    instruction = row.get("instruction") or ""
    if not instruction:
        return None
    new = paraphraser(instruction, k) if paraphraser else rule_paraphrase(instruction, rng)
    if not new or new == instruction or not numbers_kept(instruction, new):
        return None
    out = copy.deepcopy(row)
    out["instruction"] = new
    replaced = False
    for msg in out["messages"]:
        if msg["role"] == "user" and instruction in (msg.get("content") or ""):
            msg["content"] = msg["content"].replace(instruction, new)
            replaced = True
            break
    return out if replaced else None


# ---------------------------------------------------------------- observation noise

_NOISE_LINES = ["[info] cache refreshed", "note: output may be partial on slow disks", "(debug) request id 7f3a",
                "warning: locale not set, using C", "-- end of listing --"]
_BULLET = re.compile(r"^\s*(?:[-*]|\d+[.)])\s+")
LONG_OUTPUT = 800


def _noisy(text: str, rng: random.Random) -> str | None:
    if parse_json(text, None) is not None:
        return None  # structured output: a stray line would break it
    lines = text.split("\n")
    bullets = [i for i, line in enumerate(lines) if _BULLET.match(line)]
    choices = ["line"]
    if len(bullets) >= 3 and bullets == list(range(bullets[0], bullets[0] + len(bullets))):
        choices.append("reorder")
    if len(text) > LONG_OUTPUT:
        choices.append("truncate")
    how = rng.choice(choices)
    if how == "reorder":
        block = [lines[i] for i in bullets]
        shuffled = block[:]
        while shuffled == block:
            rng.shuffle(shuffled)
        lines[bullets[0]: bullets[-1] + 1] = shuffled
        return "\n".join(lines)
    if how == "truncate":
        keep = LONG_OUTPUT // 2
        return f"{text[:keep]}\n[... {len(text) - 2 * keep} characters truncated ...]\n{text[-keep:]}"
    lines.insert(rng.randrange(len(lines) + 1), rng.choice(_NOISE_LINES))
    return "\n".join(lines)


def op_observation_noise(row: Row, rng: random.Random, k: int) -> Row | None:
    out = copy.deepcopy(row)
    changed = 0
    for msg in out["messages"]:
        if msg["role"] == "tool" and msg.get("content") and rng.random() < 0.7:
            new = _noisy(msg["content"], rng)
            if new is not None:
                msg["content"] = new
                changed += 1
    return out if changed else None


# ---------------------------------------------------------------- tool rename

_STYLES = [lambda n: f"{n}_tool", lambda n: f"do_{n}", lambda n: f"{n}_v2",
           lambda n: "".join(p.capitalize() if i else p for i, p in enumerate(n.split("_"))) + "Fn"]


def op_tool_rename(row: Row, rng: random.Random, k: int) -> Row | None:
    tools = parse_json(row.get("tools"), [])
    names = [t.get("function", t).get("name") for t in tools if isinstance(t, dict)]
    used = {c["name"] for m in row["messages"] for c in m.get("tool_calls") or []}
    names = [n for n in dict.fromkeys(names + sorted(used)) if n]
    if not names:
        return None
    style = _STYLES[(k + rng.randrange(len(_STYLES))) % len(_STYLES)]
    mapping = {n: style(n) for n in names}
    out = copy.deepcopy(row)
    for t in tools:
        fn = t.get("function", t)
        if fn.get("name") in mapping:
            fn["name"] = mapping[fn["name"]]
    rng.shuffle(tools)
    out["tools"] = json.dumps(tools, ensure_ascii=False)
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b")
    for msg in out["messages"]:
        for call in msg.get("tool_calls") or []:
            call["name"] = mapping.get(call["name"], call["name"])
        if msg["role"] == "tool" and msg.get("name") in mapping:
            msg["name"] = mapping[msg["name"]]
        if msg["role"] == "system" and msg.get("content"):
            msg["content"] = pattern.sub(lambda m: mapping[m.group(1)], msg["content"])
    meta = metadata_of(out)
    meta["tool_rename"] = mapping  # lets answer extraction and envs map names back
    out["metadata"] = json.dumps(meta, ensure_ascii=False)
    return out


# ---------------------------------------------------------------- error recovery


def _faulty_call(call: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], str]:
    args = parse_json(call.get("arguments"), None)
    if isinstance(args, dict) and args and rng.random() < 0.5:
        missing = rng.choice(sorted(args))
        bad = {k: v for k, v in args.items() if k != missing}
        return ({"id": None, "name": call["name"], "arguments": json.dumps(bad)},
                f"Error: missing required argument '{missing}' for tool '{call['name']}'")
    name = call["name"]
    typo = name[:-1] if len(name) > 3 else name + "x"
    return ({"id": None, "name": typo, "arguments": call.get("arguments") or "{}"},
            f"Error: unknown tool '{typo}'. Did you mean '{name}'?")


def op_error_recovery(row: Row, rng: random.Random, k: int) -> Row | None:
    msgs = row["messages"]
    spots = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and m.get("tool_calls")]
    if not spots:
        return None
    at = rng.choice(spots)
    out = copy.deepcopy(row)
    call, error = _faulty_call(msgs[at]["tool_calls"][0], rng)
    call_id = f"aug-err-{k}"
    call["id"] = call_id
    failed = {"role": "assistant", "content": None, "reasoning": None, "tool_calls": [call],
              "tool_call_id": None, "name": None, "trainable": False}  # never teach the mistake itself
    observation = {"role": "tool", "content": error, "reasoning": None, "tool_calls": [], "tool_call_id": call_id,
                   "name": call["name"], "trainable": False}
    out["messages"][at:at] = [failed, observation]
    # Keep one turn per assistant message: insert the failed turn where its message went.
    assistant_pos = sum(1 for m in msgs[:at] if m["role"] == "assistant")
    turns = out.get("turns") or []
    if turns:
        turn = {"index": 0, "reward": 0.0, "done": False, "latency_s": None, "prompt_tokens": None,
                "completion_tokens": None, "info": json.dumps({"invalid_action": True, "augmented": "error_recovery"}),
                "completion_ids": [], "logprobs": []}
        turns.insert(min(assistant_pos, len(turns)), turn)
        for i, t in enumerate(turns):
            t["index"] = i
    out["num_turns"] = (row.get("num_turns") or 0) + 1
    return out


# ---------------------------------------------------------------- drop redundant

READ_ONLY = re.compile(r"^(get|read|list|search|view|look|check|status|find|cat|ls|show|fetch|open|inspect)",
                       re.IGNORECASE)


def _key(call: dict[str, Any]) -> str:
    args = parse_json(call.get("arguments"), call.get("arguments"))
    return json.dumps([call["name"], args], sort_keys=True)


def op_drop_redundant(row: Row, rng: random.Random, k: int) -> Row | None:
    msgs = row["messages"]
    results = {m.get("tool_call_id"): m.get("content") for m in msgs if m["role"] == "tool"}
    seen: dict[str, Any] = {}
    drop: set[int] = set()
    drop_turns: set[int] = set()
    assistant_index = -1
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        assistant_index += 1
        calls = m.get("tool_calls") or []
        if not calls or (m.get("content") or "").strip():
            for c in calls:
                seen.setdefault(_key(c), results.get(c.get("id")))
            continue
        redundant = all(READ_ONLY.match(c["name"]) and _key(c) in seen and seen[_key(c)] == results.get(c.get("id"))
                        for c in calls)
        if redundant:
            ids = {c.get("id") for c in calls}
            drop.add(i)
            drop.update(j for j, t in enumerate(msgs) if t["role"] == "tool" and t.get("tool_call_id") in ids)
            drop_turns.add(assistant_index)
        else:
            for c in calls:
                seen.setdefault(_key(c), results.get(c.get("id")))
    if not drop:
        return None
    out = copy.deepcopy(row)
    out["messages"] = [m for i, m in enumerate(out["messages"]) if i not in drop]
    if out.get("turns"):
        out["turns"] = [t for i, t in enumerate(out["turns"]) if i not in drop_turns]
        for i, t in enumerate(out["turns"]):
            t["index"] = i
    out["num_turns"] = sum(1 for m in out["messages"] if m["role"] == "assistant")
    return out


OPS: dict[str, Callable[..., Row | None]] = {
    "paraphrase": op_paraphrase, "observation_noise": op_observation_noise, "tool_rename": op_tool_rename,
    "error_recovery": op_error_recovery, "drop_redundant": op_drop_redundant}


# ---------------------------------------------------------------- running ops over a store


def augmented_id(parent: str, op: str, k: int, seed: int) -> str:
    return hashlib.sha256(json.dumps([parent, op, k, seed]).encode()).hexdigest()[:24]


class AugmentError(OmrlError, RuntimeError):
    """One variant could not be made (e.g. the paraphrasing endpoint failed); counted and reported."""


def llm_paraphraser(base_url: str, model: str, api_key: str = "EMPTY", temperature: float = 0.9,
                    timeout: float = 60.0, max_retries: int = 2) -> Callable[[str, int], str]:
    """A paraphraser asking an OpenAI-compatible endpoint through the one LLM client (omrl/llm/client.py: its
    retries, backoff and timeout); raises AugmentError when the call fails for good."""
    from omrl.llm.client import LLMClient, LLMError

    client = LLMClient(base_url, api_key, timeout=timeout, max_retries=max_retries, max_connections=1)

    def paraphrase(text: str, k: int) -> str:
        try:
            resp = client.chat_sync(model=model, temperature=temperature, messages=[
                {"role": "system", "content": "Paraphrase the user's task instruction. Keep every fact, number, "
                                              "name and constraint. Reply with the paraphrase only."},
                {"role": "user", "content": f"(variant {k + 1})\n{text}"}])
        except LLMError as exc:  # counted by augment_store, which carries on
            raise AugmentError(f"paraphrase endpoint failed after {exc.attempts} attempts: "
                               f"{type(exc).__name__}: {exc}") from exc
        text = (resp.choices[0].message.content or "").strip()
        if not text:  # a failed reply, not "nothing to paraphrase": counted as failed with its reason
            raise AugmentError("paraphrase endpoint returned an empty reply")
        return text

    return paraphrase


@dataclass
class AugmentResult:
    source_rows: int
    written: Counter = field(default_factory=Counter)  # op -> new rows
    not_applicable: Counter = field(default_factory=Counter)  # op -> (trajectory, k) with nothing to do
    failed: Counter = field(default_factory=Counter)  # op -> variants that could not be made
    errors: list[str] = field(default_factory=list)  # the first few failure messages
    originals: int = 0
    store: Path | None = None


def augment_store(source: Store | str | Path, out: str | Path, ops: list[str], n: int = 1, seed: int = 0,
                  keep_originals: bool = True, paraphraser: Callable[[str, int], str] | None = None,
                  where: str | None = None) -> AugmentResult:
    """Write `n` variants per trajectory per op to a new store at `out` (plus the originals, by default)."""
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        raise UsageError(f"unknown op(s) {unknown}; ops are {', '.join(OPS)}" if unknown else "give at least one op")
    store = source if isinstance(source, Store) else Store(source)
    rows = store.select(where).to_pylist()  # `where`: one checked condition, never pasted into SQL
    result = AugmentResult(source_rows=len(rows))
    new_rows = []
    for row in rows:
        for op in ops:
            for k in range(n):
                rng = random.Random(augmented_id(row["id"], op, k, seed))  # per-output stream: order-independent
                kwargs = {"paraphraser": paraphraser} if op == "paraphrase" else {}
                try:
                    variant = OPS[op](row, rng, k, **kwargs)
                except AugmentError as exc:
                    result.failed[op] += 1
                    if len(result.errors) < 5:
                        result.errors.append(f"{row['id']} {op}: {exc}")
                    continue
                if variant is None:
                    result.not_applicable[op] += 1
                    continue
                meta = metadata_of(variant)
                meta["augment"] = {"op": op, "k": k, "seed": seed, "parent_id": row["id"]}
                variant.update(id=augmented_id(row["id"], op, k, seed), parent_id=row["id"],
                               source=f"augmented:{op}", metadata=json.dumps(meta, ensure_ascii=False),
                               reward=row.get("reward"), success=row.get("success"))
                new_rows.append(variant)
                result.written[op] += 1
    lineage = {"command": "augment", "source": str(store.path.resolve()), "options": {
        "ops": ops, "n": n, "seed": seed, "keep_originals": keep_originals, "where": where,
        "paraphrase": "llm" if paraphraser else "rules"}, "counts": {
        "written": dict(result.written), "not_applicable": dict(result.not_applicable),
        "failed": dict(result.failed)}}
    # Built in a staging folder, renamed into place whole: a killed augment leaves no half store.
    with Store.staged(out, description=f"Augmented from {store.path}.", lineage=lineage) as dst:
        if keep_originals:
            dst.append(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA))
            result.originals = len(rows)
            annotations = store.read("annotations")
            keep = pa.array([r["id"] for r in rows], pa.string())
            dst.append(annotations.filter(pc.is_in(annotations.column("trajectory_id"), value_set=keep)),
                       table="annotations")
        if new_rows:
            dst.append(pa.Table.from_pylist(new_rows, schema=TRAJECTORY_SCHEMA))
    result.store = dst.path
    return result
