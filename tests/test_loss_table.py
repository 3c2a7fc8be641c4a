"""The table of what each export format keeps (docs/formats.md), measured: every store row below goes through
`omrl export --format F` and `omrl import`, and each aspect is compared, row by row, with the original.

The table in docs/formats.md (between the loss-table markers) must be exactly what this measures, with a note
for each loss (NOTES) and no note for what is kept; so it cannot drift from the code. After a change:

    OMRL_UPDATE_README=1 python -m pytest tests/test_loss_table.py     # rewrites the table in docs/formats.md
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from test_roundtrip import export_and_import, hand_made_rows, rl_row

from omrl.schema.messages import arguments_value
from omrl.store import Store

README = Path(__file__).resolve().parent.parent / "docs" / "formats.md"  # the page holding the table
START, END = "<!-- loss-table:start -->", "<!-- loss-table:end -->"
FORMATS = ("omrl", "openai", "sharegpt", "atif", "adp", "otel")


def _turn_info(turn: dict) -> dict:
    info = json.loads(turn["info"] or "{}")
    info.pop("prompt_token_ids", None)  # a token-id aspect of its own
    return info


# aspect -> what of a row it compares
ASPECTS = {
    "messages: roles, text, order": lambda r: [(m["role"], m["content"]) for m in r["messages"]],
    "reasoning": lambda r: [m["reasoning"] for m in r["messages"]],
    "tool calls (ids, names, arguments as JSON) and the results' links":
        lambda r: [([(c["id"], c["name"], arguments_value(c["arguments"])) for c in m["tool_calls"]], m["tool_call_id"])
                   for m in r["messages"]],
    "tool-call arguments exactly as written": lambda r: [[c["arguments"] for c in m["tool_calls"]] for m in r["messages"]],
    "trainable flags of assistant messages": lambda r: [m["trainable"] for m in r["messages"] if m["role"] == "assistant"],
    "trainable flags of other messages": lambda r: [m["trainable"] for m in r["messages"] if m["role"] != "assistant"],
    "names of user and system messages": lambda r: [m["name"] for m in r["messages"] if m["role"] in ("user", "system")],
    "completion token ids and logprobs": lambda r: [(t["completion_ids"], t["logprobs"]) for t in r["turns"]],
    "prompt token ids": lambda r: [json.loads(t["info"] or "{}").get("prompt_token_ids") for t in r["turns"]],
    "token counts (per turn and in all)": lambda r: ([(t["prompt_tokens"], t["completion_tokens"]) for t in r["turns"]],
                                                      r["prompt_tokens"], r["completion_tokens"]),
    "per-turn reward, done, latency and info": lambda r: [(t["reward"], t["done"], t["latency_s"], _turn_info(t))
                                                          for t in r["turns"]],
    "reward and success": lambda r: (r["reward"], r["success"]),
    "task id": lambda r: r["task_id"],
    "model and tool schemas": lambda r: (r["model"], json.loads(r["tools"] or "[]")),
    "instruction": lambda r: r["instruction"],
    "status and error": lambda r: (r["status"], r["error"]),
}

# Why a format loses an aspect. A loss without a note, or a note for what is kept, fails the test.
NOTES = {
    ("openai", "completion token ids and logprobs"): "no place for them",
    ("openai", "prompt token ids"): "no place for them",
    ("openai", "token counts (per turn and in all)"): "no place for them",
    ("openai", "per-turn reward, done, latency and info"): "no place for them",
    ("openai", "trainable flags of other messages"): "`weight` is for assistant messages only",
    ("openai", "status and error"): "no place for them",
    ("sharegpt", "messages: roles, text, order"): "a missing text (a result with no output, calls with reasoning) "
                                                  "reads back as empty text",
    ("sharegpt", "completion token ids and logprobs"): "no place for them",
    ("sharegpt", "prompt token ids"): "no place for them",
    ("sharegpt", "token counts (per turn and in all)"): "no place for them",
    ("sharegpt", "per-turn reward, done, latency and info"): "no place for them",
    ("sharegpt", "tool-call arguments exactly as written"): "written as objects (LLaMA-Factory's form): re-spaced",
    ("sharegpt", "status and error"): "no place for them",
    ("adp", "messages: roles, text, order"): "no system role (it goes to `details.system`); text and calls of one "
                                             "message come back as one message per action",
    ("adp", "reasoning"): "one description per action: it stays with the first",
    ("adp", "tool calls (ids, names, arguments as JSON) and the results' links"): "one call per action",
    ("adp", "tool-call arguments exactly as written"): "one call per action, `kwargs` an object",
    ("adp", "trainable flags of assistant messages"): "no place for them",
    ("adp", "trainable flags of other messages"): "no place for them",
    ("adp", "names of user and system messages"): "no system role",
    ("adp", "completion token ids and logprobs"): "no place for them",
    ("adp", "prompt token ids"): "no place for them",
    ("adp", "token counts (per turn and in all)"): "no place for them",
    ("adp", "per-turn reward, done, latency and info"): "no place for them",
    ("adp", "model and tool schemas"): "kept in `details`, which reads back as metadata",
    ("adp", "status and error"): "no place for them",
    ("otel", "trainable flags of other messages"): "GenAI messages have no place for them (a reply's flag is an "
                                                   "`omrl.trainable` attribute)",
}


def store_rows() -> list[dict]:
    """The rows measured: the round-trip tests' hand-made rows and a row with everything RL needs set."""
    return [*hand_made_rows(), rl_row()]


def measure(tmp_path: Path) -> dict[str, dict[str, bool]]:
    """format -> aspect -> kept by store -> format -> store, on every row."""
    store = Store.create(tmp_path / "src")
    store.append(store_rows())
    original = store.read().to_pylist()
    kept: dict[str, dict[str, bool]] = {}
    for fmt in FORMATS:
        back = export_and_import(store, tmp_path, fmt, f"table-{fmt}")
        assert len(back) == len(original), fmt
        kept[fmt] = {aspect: all(view(a) == view(b) for a, b in zip(original, back, strict=True))
                     for aspect, view in ASPECTS.items()}
    return kept


def table(kept: dict[str, dict[str, bool]]) -> str:
    lines = ["| what a round trip (store -> export -> import) keeps | " + " | ".join(f"`{f}`" for f in FORMATS) + " |",
             "|---|" + "---|" * len(FORMATS)]
    for aspect in ASPECTS:
        cells = ["yes" if kept[fmt][aspect] else f"no: {NOTES.get((fmt, aspect), '?')}" for fmt in FORMATS]
        lines.append(f"| {aspect} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_readme_table_is_what_the_round_trips_measure(tmp_path):
    kept = measure(tmp_path)
    unexplained = [(f, a) for f in FORMATS for a in ASPECTS if not kept[f][a] and (f, a) not in NOTES]
    stale = [key for key in NOTES if kept[key[0]][key[1]]]
    assert unexplained == [], "a loss without a note in NOTES"
    assert stale == [], "a note for what is kept"
    assert kept["omrl"] == dict.fromkeys(ASPECTS, True)  # the rows themselves
    for aspect in ("completion token ids and logprobs", "prompt token ids", "per-turn reward, done, latency and info"):
        assert kept["atif"][aspect] and kept["otel"][aspect], aspect  # the formats that carry what RL needs
    text = README.read_text(encoding="utf-8")
    block = re.compile(re.escape(START) + r"\n(?:.*?\n)?" + re.escape(END), re.S)
    assert block.search(text), f"docs/formats.md has no {START} ... {END} block"
    wanted = f"{START}\n{table(kept)}\n{END}"
    if os.environ.get("OMRL_UPDATE_README"):
        README.write_text(block.sub(lambda _: wanted, text), encoding="utf-8")
    assert block.search(README.read_text(encoding="utf-8")).group(0) == wanted, (
        "docs/formats.md's table differs from what the round trips measure; rerun with OMRL_UPDATE_README=1")

