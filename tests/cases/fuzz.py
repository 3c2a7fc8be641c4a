"""A corpus of bad input files for every omrl reader, and a runner that says how each one was handled.

`write_fuzz_corpus(folder)` writes the files and returns one FuzzCase per file: the command it targets
(`store append`, `import` with auto-detection or one format, `tasks import`, `tasks load`), a short label
and what a good answer looks like. `run_fuzz_case(case, workdir)` feeds one case through the real public
API (omrl.store.record_files.append_file, omrl.formats.importer.import_files, omrl.tasks.import_tasks / load_tasks) and
classifies what happened:

- "located":   a clean error (the ValueError family the CLI prints as one line) whose message names the
               file and a locator (line N, record N, row N, item N, row group N), or for a whole-file
               problem (empty, not decodable) the file and the reason;
- "unlocated": a clean error that does not say where;
- "traceback": any other exception (what the CLI would show as a traceback), raw library errors
               (UnicodeDecodeError, JSONDecodeError, pyarrow errors) included;
- "accepted":  no error; right only for cases marked as valid-but-odd.

It also checks that a rejected input left the store's part files (or the tasks output file) unchanged.
Used by tests/test_fuzz_inputs.py and the chaos benchmark.
"""

from __future__ import annotations

import io
import json
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.errors import UsageError

TARGETS = ("store append", "store append annotations", "import auto", "tasks import", "tasks load",
           *(f"import {fmt}" for fmt in ("sharegpt", "openai", "swe_agent", "openmanus", "toolbench", "atif", "otel")))
LOCATOR = re.compile(r"\b(line|record|row|item|row group) \d+", re.IGNORECASE)
MAX_MESSAGE = 2000  # an error message longer than this is a problem (a record's repr pasted in)


@dataclass(frozen=True)
class FuzzCase:
    """One bad (or valid-but-odd) input file and the command it is fed to."""

    name: str  # short label, unique in the corpus; also the file's stem
    path: Path
    target: str  # one of TARGETS
    expect: str = "error"  # "error": must be refused, located; "accepted": valid-but-odd, must go in
    whole_file: bool = False  # the problem is the whole file: name + reason is enough, no line needed
    reason: tuple[str, ...] = ()  # the message must hold one of these words (case-insensitive), when given
    note: str = ""


@dataclass
class FuzzOutcome:
    """What one case did: its class, the error text, whether the store/output stayed as it was."""

    case: FuzzCase
    outcome: str  # located, unlocated, traceback, accepted
    message: str = ""  # "<ExceptionType>: <message>", "" when accepted
    unchanged: bool | None = None  # store parts (or tasks output) unchanged; None when the input was accepted
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The case was handled as it should be: refused and located (or accepted when valid), nothing else wrong."""
        wanted = "accepted" if self.case.expect == "accepted" else "located"
        return self.outcome == wanted and not self.problems


# ------------------------------------------------------------------------------------------ valid records


def _traj(**change: Any) -> dict[str, Any]:
    row = {"id": "fz-1", "task_id": "t-1", "instruction": "say hi",
           "messages": [{"role": "user", "content": "say hi"}, {"role": "assistant", "content": "hi"}],
           "turns": [{"index": 0, "reward": 1.0, "done": True}], "reward": 1.0, "success": True}
    row.update(change)
    return row


def _conv() -> list[dict[str, Any]]:
    return [{"from": "human", "value": "say hi"}, {"from": "gpt", "value": "hi"}]


def _msgs() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "say hi"}, {"role": "assistant", "content": "hi"}]


def _sharegpt(**change: Any) -> dict[str, Any]:
    return {"id": "s-1", "conversations": _conv(), **change}


def _openai(**change: Any) -> dict[str, Any]:
    return {"id": "o-1", "messages": _msgs(), **change}


def _swe(**change: Any) -> dict[str, Any]:
    return {"history": [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"},
                        {"role": "assistant", "content": "done"}],
            "trajectory": [], "info": {"exit_status": "submitted"}, "replay_config": {}, **change}


def _openmanus(**change: Any) -> dict[str, Any]:
    return {"item_id": "m-1", "conversations": _conv(), "data_source": "webshop",
            "reward_model": {"ground_truth": "x"}, "extra_info": {"index": 0}, **change}


def _toolbench(gen: dict[str, Any] | None = None, **change: Any) -> dict[str, Any]:
    base = {"query": "say hi", "function": [], "train_messages": [_msgs()], "final_answer": "hi",
            "finish_type": "give_answer"}
    base.update(gen or {})
    return {"win": True, "answer_generation": base, **change}


def _atif(**change: Any) -> dict[str, Any]:
    return {"schema_version": "ATIF-v1.2", "session_id": "a-1", "agent": {"name": "fz", "model_name": "m"},
            "steps": [{"step_id": 1, "source": "user", "message": "say hi"},
                      {"step_id": 2, "source": "agent", "message": "hi"}], **change}


def _otel(span: dict[str, Any] | None = None, **change: Any) -> dict[str, Any]:
    """An OTLP JSON request holding one chat span (its fields changed by `span`)."""
    chat = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "2", "name": "chat m", "startTimeUnixNano": "1",
            "endTimeUnixNano": "2", "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                {"key": "gen_ai.input.messages", "value": {"stringValue": '[{"role": "user", "parts": '
                                                                          '[{"type": "text", "content": "hi"}]}]'}}]}
    return {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [{**chat, **(span or {})}]}]}], **change}


def _task(**change: Any) -> dict[str, Any]:
    return {"id": "q-1", "question": "What is 2+2?", "answer": "4", **change}


# ------------------------------------------------------------------------------------------ file bytes


def _jsonl(*records: Any) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _json(value: Any) -> bytes:
    return json.dumps(value, indent=1).encode()


def _parquet(rows: list[dict[str, Any]] | None = None, table: Any = None, row_group_size: int | None = None) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = table if table is not None else pa.Table.from_pylist(rows)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=row_group_size)
    return buf.getvalue()


def _parquet_body_cut(rows: list[dict[str, Any]]) -> bytes:
    """A Parquet file whose middle (data pages) is cut out while the footer is kept: the footer reads, the
    pages it points to do not decode."""
    data = _parquet(rows * 200, row_group_size=50)
    footer = int.from_bytes(data[-8:-4], "little") + 8
    body = data[: len(data) - footer]
    return body[: len(body) // 3] + data[len(data) - footer:]


def _nested(depth: int = 200_000) -> str:
    return "[" * depth + "]" * depth


def _invalid_utf8_at_line3(first: bytes, second: bytes) -> bytes:
    return first + second + b'{"id": "caf\xe9", "bad": "\xff\xfe"}\n'


# ------------------------------------------------------------------------------------------ the corpus


def write_fuzz_corpus(folder: str | Path) -> list[FuzzCase]:
    """Write the bad-input corpus into `folder` (created; files of an earlier corpus are replaced) and
    return its cases, one file each. Deterministic: the same files every time."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1234)
    cases: list[FuzzCase] = []

    def add(name: str, suffix: str, data: bytes | str | Callable[[], bytes], target: str, **kw: Any) -> None:
        assert target in TARGETS, target
        assert all(c.name != name for c in cases), name
        path = folder / f"{name}{suffix}"
        if callable(data):
            data = data()
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        cases.append(FuzzCase(name=name, path=path, target=target, **kw))

    garbage = bytes(rng.randrange(256) for _ in range(4096))
    empty = {"whole_file": True, "reason": ("empty",)}
    t1, t2 = _jsonl(_traj(id="fz-a")), _jsonl(_traj(id="fz-b"))

    # ---- whole-file problems, for each reader
    for target, tag, suffixes in (("store append", "append", (".jsonl", ".json", ".parquet")),
                                  ("import auto", "import", (".jsonl", ".json", ".parquet", ".traj")),
                                  ("tasks import", "tasks", (".jsonl", ".json", ".csv", ".parquet"))):
        for suffix in suffixes:
            kind = suffix.lstrip(".")
            add(f"{tag}_empty_{kind}", suffix, b"", target, note="zero bytes", **empty)
        for suffix in suffixes:
            if suffix != ".parquet":
                add(f"{tag}_whitespace_{suffix.lstrip('.')}", suffix, b" \n\t\n  \r\n\n", target,
                    note="whitespace only", **empty)
        add(f"{tag}_binary_jsonl", ".jsonl", garbage, target, whole_file=True, reason=("binary", "utf-8"),
            note="random bytes")
        add(f"{tag}_binary_parquet", ".parquet", garbage, target, whole_file=True, reason=("cannot decode",),
            note="random bytes named .parquet")
        add(f"{tag}_really_parquet_jsonl", ".jsonl", _parquet([_traj()]), target, whole_file=True,
            reason=("parquet",), note="a Parquet file named .jsonl")
        add(f"{tag}_parquet_truncated_footer", ".parquet", _parquet([_traj()])[:-20], target, whole_file=True,
            reason=("cannot decode",), note="the last 20 bytes (footer end, magic) cut")
        add(f"{tag}_parquet_is_json", ".parquet", _json([_traj()]), target, whole_file=True,
            reason=("cannot decode",), note="JSON text named .parquet")
        add(f"{tag}_deep_nesting_jsonl", ".jsonl", t1 + (_nested() + "\n").encode(), target,
            note="200,000 nested brackets on line 2")
        add(f"{tag}_deep_nesting_json", ".json", "[" + _nested() + "]", target,
            note="200,000 nested brackets as item 0")
        add(f"{tag}_gzip_jsonl", ".jsonl", b"\x1f\x8b\x08\x00" + garbage[:200], target, whole_file=True,
            reason=("gzip",), note="a gzip file named .jsonl")
        add(f"{tag}_utf16_jsonl", ".jsonl", json.dumps(_traj()).encode("utf-16"), target, whole_file=True,
            reason=("utf-16",), note="UTF-16 text with a BOM")
        add(f"{tag}_unsupported_txt", ".txt", t1, target, whole_file=True, reason=("unsupported",),
            note="an extension no reader takes")

    # ---- a lone surrogate (half a UTF-16 pair as a JSON escape): parses, but is not storable text
    lone = "say \udc00 hi"
    for target, tag, bad, good in (("store append", "append", _traj(id="fz-s", instruction=lone), _traj(id="fz-a")),
                                   ("import auto", "import", _openai(id="o-s", messages=[
                                       {"role": "user", "content": lone}, {"role": "assistant", "content": "hi"}]),
                                    _openai()),
                                   ("tasks import", "tasks", _task(id="q-s", question=lone), _task())):
        add(f"{tag}_lone_surrogate_line2", ".jsonl", _jsonl(good, bad), target, reason=("surrogate",))
        add(f"{tag}_lone_surrogate_item1", ".json", _json([good, bad]), target, reason=("surrogate",))

    # ---- store append: omrl-format trajectories
    A = "store append"
    add("append_invalid_utf8_line3", ".jsonl", _invalid_utf8_at_line3(t1, t2), A, reason=("utf-8",))
    add("append_truncated_line3", ".jsonl", t1 + t2 + json.dumps(_traj(id="fz-c")).encode()[:40], A,
        reason=("json",), note="the last record cut mid-object")
    add("append_json_list_cut", ".json", _json([_traj(id="fz-a"), _traj(id="fz-b"), _traj(id="fz-c")])[:-200], A,
        reason=("json",), note="a JSON list cut in the middle of item 2")
    add("append_json_scalar", ".json", b"42", A, whole_file=True, reason=("list",))
    add("append_json_object", ".json", _json(_traj()), A, whole_file=True, reason=("list",),
        note="one object where a list of records is expected")
    add("append_json_list_of_numbers", ".json", b"[1, 2, 3]", A, reason=("object",))
    add("append_json_trailing_garbage", ".json", _json([_traj()]) + b"\n]]", A, reason=("extra data",))
    add("append_jsonl_in_json", ".json", t1 + t2, A, reason=("extra data", "json"),
        note="JSON lines in a .json file")
    add("append_line_is_list", ".jsonl", t1 + b"[1, 2]\n", A, reason=("object",))
    add("append_nul_in_line", ".jsonl", t1 + t2 + b'{"id": "x\x00"}\n', A, whole_file=True,
        reason=("binary", "nul"))
    add("append_reward_infinity", ".jsonl", t1 + b'{"id": "x", "task_id": "t", "reward": Infinity}\n', A,
        reason=("finite",))
    add("append_reward_neg_infinity", ".jsonl", t1 + b'{"id": "x", "task_id": "t", "reward": -Infinity}\n', A,
        reason=("finite",))
    add("append_reward_nan", ".jsonl", t1 + b'{"id": "x", "task_id": "t", "reward": NaN}\n', A, reason=("finite",))
    add("append_reward_1e999", ".jsonl", t1 + b'{"id": "x", "task_id": "t", "reward": 1e999}\n', A,
        reason=("finite",), note="a literal that overflows to inf")
    add("append_reward_huge_int", ".jsonl", t1 + b'{"id": "x", "task_id": "t", "reward": 1' + b"0" * 400 + b"}\n",
        A, reason=("finite",), note="an integer too large for a float")
    add("append_turn_reward_nan", ".jsonl", _jsonl(_traj(turns=[{"index": 0, "reward": float("nan")}])), A,
        reason=("finite",))
    add("append_reward_string", ".jsonl", _jsonl(_traj(reward="high")), A, reason=("reward",))
    add("append_reward_huge_string", ".jsonl", _jsonl(_traj(reward="x" * 1_000_000)), A, reason=("reward",),
        note="the error must not paste a megabyte")
    add("append_digits_5000", ".jsonl", t1 + b'{"id": "x", "task_id": "t", "round": ' + b"7" * 5000 + b"}\n", A,
        reason=("json",), note="an integer beyond Python's 4300-digit limit")
    add("append_round_int32_overflow", ".jsonl", _jsonl(_traj(round=2**40)), A, reason=("32 bits",))
    add("append_id_dict", ".jsonl", _jsonl(_traj(id={"a": 1})), A, reason=("id",))
    add("append_id_list", ".jsonl", _jsonl(_traj(id=["a"])), A, reason=("id",))
    add("append_id_float", ".jsonl", _jsonl(_traj(id=1.5)), A, reason=("id",))
    add("append_id_missing", ".jsonl", _jsonl({k: v for k, v in _traj().items() if k != "id"}), A, reason=("id",))
    add("append_task_id_dict", ".jsonl", _jsonl(_traj(task_id={"a": 1})), A, reason=("task_id",))
    add("append_task_id_float", ".jsonl", _jsonl(_traj(task_id=2.5)), A, reason=("task_id",))
    add("append_instruction_list", ".jsonl", _jsonl(_traj(instruction=["say", "hi"])), A, reason=("instruction",))
    add("append_instruction_float", ".jsonl", _jsonl(_traj(instruction=3.5)), A, reason=("instruction",))
    add("append_messages_string", ".jsonl", _jsonl(_traj(messages="hello")), A, reason=("messages",))
    add("append_messages_of_strings", ".jsonl", _jsonl(_traj(messages=["hello"])), A, reason=("messages",))
    add("append_role_unknown", ".jsonl", _jsonl(_traj(messages=[{"role": "wizard", "content": "?"}])), A,
        reason=("role",))
    add("append_tool_calls_string", ".jsonl",
        _jsonl(_traj(messages=[{"role": "assistant", "content": None, "tool_calls": "f()"}])), A,
        reason=("tool_calls",))
    add("append_tool_call_no_name", ".jsonl",
        _jsonl(_traj(messages=[{"role": "assistant", "tool_calls": [{"arguments": "{}"}]}])), A, reason=("name",))
    add("append_tool_call_not_object", ".jsonl",
        _jsonl(_traj(messages=[{"role": "assistant", "tool_calls": [["f", "{}"]]}])), A, reason=("tool_calls",))
    add("append_turns_string", ".jsonl", _jsonl(_traj(turns="one")), A, reason=("turns",))
    add("append_success_string", ".jsonl", _jsonl(_traj(success="yes")), A, reason=("success",))
    add("append_created_at_bad", ".jsonl", _jsonl(_traj(created_at="yesterday")), A, reason=("created_at",))
    add("append_metadata_bad_json_text", ".jsonl", _jsonl(_traj(metadata="{not json")), A, reason=("metadata",))
    add("append_tools_not_list", ".jsonl", _jsonl(_traj(tools={"name": "f"})), A, reason=("tools",))
    add("append_unknown_field", ".jsonl", _jsonl(_traj(colour="blue")), A, reason=("unknown field",))
    add("append_status_unknown", ".jsonl", _jsonl(_traj(status="exploded")), A, reason=("status",))
    add("append_parquet_body_cut", ".parquet", lambda: _parquet_body_cut([_traj()]), A, reason=("row group",),
        note="data pages cut, footer kept")
    add("append_parquet_missing_id", ".parquet", lambda: _parquet([{"task_id": "t", "reward": 1.0}]), A,
        reason=("id",), note="wrong schema: no id column")
    add("append_parquet_inf_reward", ".parquet",
        lambda: _parquet([{"id": "p-1", "task_id": "t", "reward": 1.0}, {"id": "p-2", "task_id": "t",
                                                                       "reward": float("inf")}]), A,
        reason=("finite",))
    add("annotations_score_infinity", ".jsonl",
        b'{"trajectory_id": "fz-1", "annotator": "judge", "score": Infinity}\n', "store append annotations",
        reason=("finite",))
    add("annotations_annotator_missing", ".jsonl", _jsonl({"trajectory_id": "fz-1", "score": 0.5}),
        "store append annotations", reason=("annotator",))
    # valid but odd: must go in
    add("append_ok_huge_line", ".jsonl", lambda: _jsonl(_traj(id="huge-1", instruction="x" * 5_000_000)), A,
        expect="accepted", note="a 5 MB string on one line")
    add("append_ok_bom_crlf", ".jsonl", b"\xef\xbb\xbf" + _jsonl(_traj(id="bom-1")).replace(b"\n", b"\r\n")
        + b"\r\n" + _jsonl(_traj(id="bom-2")).replace(b"\n", b"\r\n"), A, expect="accepted",
        note="a UTF-8 BOM, CRLF line ends, a blank line")
    add("append_ok_empty_list", ".json", b"[]", A, expect="accepted", note="a JSON list with no records: 0 rows")
    add("append_ok_int_task_id", ".jsonl", _jsonl(_traj(id="int-1", task_id=7)), A, expect="accepted",
        note="an integer task id is taken as its digits")

    # ---- import with auto-detection
    IMP = "import auto"
    add("import_invalid_utf8_json", ".json",
        b'[\n' + json.dumps(_sharegpt()).encode() + b',\n{"id": "\xc3\x28", "conversations": []}\n]', IMP,
        reason=("utf-8",), note="invalid UTF-8 on line 3 of a JSON list")
    add("import_invalid_utf8_first_line", ".jsonl", b'{"id": "\xff", "messages": []}\n' + _jsonl(_openai()), IMP,
        reason=("utf-8",))
    add("import_truncated_first_line", ".jsonl", json.dumps(_openai()).encode()[:30] + b"\n", IMP, reason=("json",))
    add("import_json_list_cut", ".json", _json([_sharegpt(id="a"), _sharegpt(id="b")])[:-60], IMP, reason=("json",))
    add("import_json_scalar", ".json", b'"just a string"', IMP, whole_file=True, reason=("list", "object"))
    add("import_undetectable_keys", ".jsonl", _jsonl({"foo": 1, "bar": 2}), IMP, whole_file=True,
        reason=("cannot tell the format",))
    add("import_first_record_list", ".jsonl", _jsonl([1, 2], _openai()), IMP, whole_file=True, reason=("object",))
    add("import_parquet_body_cut", ".parquet", lambda: _parquet_body_cut([_openmanus()]), IMP, reason=("row group",),
        note="OpenManus-shaped Parquet, data pages cut, footer kept")
    add("import_traj_empty", ".traj", b"", IMP, **empty)
    add("import_traj_truncated", ".traj", _json(_swe())[:-30], IMP, reason=("json",))
    add("import_traj_scalar", ".traj", b"[1]", IMP, reason=("object",))
    add("import_reward_infinity", ".json", b'[{"id": "s", "conversations": [{"from": "human", "value": "q"}], '
        b'"reward": Infinity}]', IMP, reason=("finite",))
    add("import_ok_huge_line", ".jsonl", lambda: _jsonl(_openai(messages=[{"role": "user", "content": "x" * 5_000_000},
                                                                  {"role": "assistant", "content": "ok"}])),
        IMP, expect="accepted", note="a 5 MB message")

    # ---- import, one format at a time: key fields missing or of the wrong type
    def fmt_case(fmt: str, name: str, record: Any, reason: tuple[str, ...], suffix: str = ".jsonl") -> None:
        data = _json(record) if suffix in (".traj", ".json") else _jsonl(record)
        add(f"{fmt}_{name}", suffix, data, f"import {fmt}", reason=reason)

    fmt_case("sharegpt", "no_conversations", {"id": "s"}, ("conversations",))
    fmt_case("sharegpt", "conversations_string", _sharegpt(conversations="hi"), ("conversations",))
    fmt_case("sharegpt", "turn_not_object", _sharegpt(conversations=["hi"]), ("conversations",))
    fmt_case("sharegpt", "speaker_unknown", _sharegpt(conversations=[{"from": "wizard", "value": "?"}]), ("speaker",))
    fmt_case("sharegpt", "function_call_bad_json",
             _sharegpt(conversations=[*_conv(), {"from": "function_call", "value": "{oops"}]), ("json",))
    fmt_case("sharegpt", "function_call_no_name",
             _sharegpt(conversations=[*_conv(), {"from": "function_call", "value": '{"arguments": {}}'}]), ("name",))
    fmt_case("sharegpt", "id_dict", _sharegpt(id={"x": 1}), ("id",))
    fmt_case("sharegpt", "id_float", _sharegpt(id=3.5), ("id",))
    fmt_case("sharegpt", "reward_word", _sharegpt(reward="great"), ("reward",))
    fmt_case("sharegpt", "success_word", _sharegpt(success="maybe"), ("success",))
    fmt_case("sharegpt", "tools_bad_json", _sharegpt(tools="[not json"), ("json",))
    fmt_case("sharegpt", "value_number", _sharegpt(conversations=[{"from": "human", "value": "2+3?"},
                                                                  {"from": "gpt", "value": 5}]), ("must be text",))
    fmt_case("openai", "no_messages", {"id": "o"}, ("messages",))
    fmt_case("openai", "messages_string", _openai(messages="hi"), ("messages",))
    fmt_case("openai", "message_not_object", _openai(messages=[1, 2]), ("messages",))
    fmt_case("openai", "role_unknown", _openai(messages=[{"role": "wizard", "content": "?"}]), ("role",))
    fmt_case("openai", "tool_calls_string", _openai(messages=[{"role": "assistant", "tool_calls": "f()"}]),
             ("tool_calls",))
    fmt_case("openai", "tool_call_no_name",
             _openai(messages=[{"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}]),
             ("name",))
    fmt_case("openai", "tool_call_not_object", _openai(messages=[{"role": "assistant", "tool_calls": [["f"]]}]),
             ("tool_calls",))
    fmt_case("openai", "id_list", _openai(id=["o", 1]), ("id",))
    fmt_case("openai", "content_list_of_numbers", _openai(messages=[{"role": "user", "content": "hi"},
                                                                     {"role": "assistant", "content": [1, 2]}]),
             ("content part",))
    fmt_case("openai", "content_dict_role_list", _openai(messages=[{"role": ["user"], "content": {}}]), ("role",))
    fmt_case("swe_agent", "no_history", {"trajectory": [], "info": {}}, ("history",), ".traj")
    fmt_case("swe_agent", "history_string", _swe(history="all of it"), ("history",), ".traj")
    fmt_case("swe_agent", "history_bad_role", _swe(history=[{"role": "robot", "content": "?"}]), ("role",), ".traj")
    fmt_case("swe_agent", "info_list", _swe(info=["submitted"]), ("info",), ".traj")
    fmt_case("swe_agent", "replay_config_list", _swe(replay_config=[1, 2]), ("replay_config",), ".traj")
    fmt_case("swe_agent", "tool_calls_string",
             _swe(history=[{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": "ls"}]),
             ("tool_calls",), ".traj")
    fmt_case("openmanus", "no_conversations", {"item_id": "m", "data_source": "x", "extra_info": {}},
             ("conversations",))
    fmt_case("openmanus", "item_id_dict", _openmanus(item_id={"a": 1}), ("id",))
    add("openmanus_parquet_conversations_null", ".parquet",
        lambda: _parquet([{**_openmanus(), "conversations": None}]), "import openmanus", reason=("conversations",))
    add("openmanus_parquet_conversations_string", ".parquet",
        lambda: _parquet([{**_openmanus(), "conversations": "hi"}]), "import openmanus", reason=("conversations",))
    fmt_case("toolbench", "no_answer_generation", {"win": True}, ("answer_generation",), ".json")
    fmt_case("toolbench", "train_messages_empty", _toolbench({"train_messages": []}), ("train_messages",), ".json")
    fmt_case("toolbench", "train_messages_bad_role",
             _toolbench({"train_messages": [[{"role": "robot", "content": "?"}]]}), ("role",), ".json")
    fmt_case("toolbench", "function_not_list", _toolbench({"function": "search"}), ("tools", "json"), ".json")
    fmt_case("toolbench", "query_id_dict", _toolbench(query_id={"a": 1}), ("id",), ".json")
    fmt_case("atif", "no_steps", {"schema_version": "ATIF-v1.2", "session_id": "a"}, ("steps",), ".json")
    fmt_case("atif", "steps_string", _atif(steps="hi"), ("steps",), ".json")
    fmt_case("atif", "step_source_unknown", _atif(steps=[{"source": "robot", "message": "?"}]), ("source",), ".json")
    fmt_case("atif", "tool_calls_strings",
             _atif(steps=[{"source": "agent", "message": "x", "tool_calls": ["f()"]}]), ("tool_calls",), ".json")
    fmt_case("atif", "observation_list",
             _atif(steps=[{"source": "agent", "message": "x", "observation": ["out"]}]), ("observation",), ".json")
    fmt_case("atif", "agent_string", _atif(agent="claude"), ("agent",), ".json")
    fmt_case("atif", "metrics_list", _atif(steps=[{"source": "agent", "message": "x", "metrics": [1]}]),
             ("metrics",), ".json")
    fmt_case("atif", "reward_infinity", _atif(extra={"reward": "Infinity"}), ("finite",), ".json")
    fmt_case("otel", "resource_spans_string", {"resourceSpans": "all"}, ("resourceSpans",), ".json")
    fmt_case("otel", "trace_id_word", _otel({"traceId": "not-an-id"}), ("traceId",), ".json")
    fmt_case("otel", "time_word", _otel({"startTimeUnixNano": "noon"}), ("startTimeUnixNano",), ".json")
    fmt_case("otel", "messages_not_json", _otel({"attributes": [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
        {"key": "gen_ai.input.messages", "value": {"stringValue": "[{oops"}}]}), ("json",), ".json")
    fmt_case("otel", "message_role_unknown", _otel({"attributes": [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
        {"key": "gen_ai.output.messages", "value": {"stringValue": '[{"role": "wizard", "parts": []}]'}}]}),
        ("role",), ".json")
    fmt_case("otel", "no_content", _otel({"attributes": [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]}), ("content",), ".json")

    # ---- tasks import: JSONL / JSON / CSV / Parquet task files
    T = "tasks import"
    add("tasks_invalid_utf8_line3", ".jsonl", _invalid_utf8_at_line3(_jsonl(_task(id="a")), _jsonl(_task(id="b"))),
        T, reason=("utf-8",))
    add("tasks_truncated_line2", ".jsonl", _jsonl(_task()) + b'{"id": "q-2", "question": "cut', T, reason=("json",))
    add("tasks_json_list_cut", ".json", _json([_task(id="a"), _task(id="b")])[:-25], T, reason=("json",))
    add("tasks_json_scalar", ".json", b"3.14", T, whole_file=True, reason=("list",))
    add("tasks_line_is_list", ".jsonl", _jsonl(_task(), ["not", "an", "object"]), T, reason=("object",))
    add("tasks_json_item_not_object", ".json", _json([_task(), 7]), T, reason=("object",))
    add("tasks_id_dict", ".jsonl", _jsonl(_task(id="a"), _task(id={"nested": 1})), T, reason=("id",))
    add("tasks_id_list", ".jsonl", _jsonl(_task(id=["a", "b"])), T, reason=("id",))
    add("tasks_id_float", ".jsonl", _jsonl(_task(id=2.5)), T, reason=("id",))
    add("tasks_id_bool", ".jsonl", _jsonl(_task(id=True)), T, reason=("id",))
    add("tasks_id_null", ".jsonl", _jsonl(_task(id="a"), _task(id=None)), T, reason=("id",))
    add("tasks_instruction_list", ".jsonl", _jsonl(_task(question=["What", "is", "2+2?"])), T,
        reason=("instruction",))
    add("tasks_instruction_dict", ".jsonl", _jsonl(_task(question={"text": "2+2?"})), T, reason=("instruction",))
    add("tasks_instruction_number", ".jsonl", _jsonl(_task(question=4.0)), T, reason=("instruction",))
    add("tasks_env_dict", ".jsonl", _jsonl(_task(env={"name": "math"})), T, reason=("env",))
    add("tasks_answer_nan", ".jsonl", _jsonl(_task(id="a")) + b'{"id": "b", "question": "q", "answer": NaN}\n', T,
        reason=("nan",))
    add("tasks_payload_not_json", ".jsonl", _jsonl(_task(id="a", payload="not json")), T, reason=("payload",))
    add("tasks_payload_list", ".jsonl", _jsonl(_task(id="a", payload=[1, 2])), T, reason=("payload",))
    add("tasks_duplicate_ids", ".jsonl", _jsonl(_task(id="a"), _task(id="a")), T, reason=("duplicate",))
    add("tasks_no_instruction_column", ".jsonl", _jsonl({"id": "a", "text": "?"}), T, whole_file=True,
        reason=("instruction",))
    add("tasks_json_empty_list", ".json", b"[]", T, whole_file=True, reason=("no rows",))
    add("tasks_gsm8k_answer_list", ".jsonl", _jsonl({"question": "q", "answer": ["#### 3"]}), "tasks import",
        reason=("answer",))
    add("tasks_csv_ragged_more", ".csv", "id,question,answer\na,2+2?,4\nb,3+3?,6,extra\n", T, reason=("fields",),
        note="line 3 has 4 fields, the header 3")
    add("tasks_csv_ragged_fewer", ".csv", "id,question,answer\na,2+2?,4\nb,3+3?,6\nc,4+4?\n", T, reason=("fields",),
        note="line 4 has 2 fields")
    add("tasks_tsv_ragged", ".tsv", "id\tquestion\tanswer\na\t2+2?\n", T, reason=("fields",))
    add("tasks_csv_bad_encoding", ".csv", b"\xef\xbb\xbfid,question\na,2+2?\nb,caf\xe9 au lait?\n", T,
        reason=("utf-8",), note="a BOM, then Latin-1 bytes on line 3")
    add("tasks_csv_nul", ".csv", b"id,question\na,2+2\x00?\n", T, whole_file=True, reason=("binary", "nul"))
    add("tasks_csv_duplicate_header", ".csv", "id,question,question\na,b,c\n", T, reason=("twice",))
    add("tasks_csv_header_only", ".csv", "id,question,answer\n", T, whole_file=True, reason=("no rows",))
    add("tasks_csv_huge_field", ".csv", "id,question\na," + "x" * 200_000 + "\n", T, reason=("csv", "field"),
        note="a field past the csv module's 128 KiB limit")
    add("tasks_csv_unclosed_quote", ".csv", 'id,question\na,"never closed\nb,x\n', T, reason=("fields", "csv"))
    add("tasks_parquet_body_cut", ".parquet", lambda: _parquet_body_cut([_task()]), T, reason=("row group",))
    add("tasks_parquet_no_instruction", ".parquet", lambda: _parquet([{"id": "a", "text": "?"}]), T,
        whole_file=True, reason=("instruction",), note="wrong schema")
    add("tasks_parquet_float_id", ".parquet", lambda: _parquet([{"id": 1.5, "question": "q"}]), T, reason=("id",))
    add("tasks_ok_csv_bom", ".csv", b"\xef\xbb\xbfid,question,answer\r\na,2+2?,4\r\n\r\nb,\"3,3?\",6\r\n", T,
        expect="accepted", note="a BOM, CRLF, a blank line, a quoted comma")
    add("tasks_ok_huge_instruction", ".jsonl", lambda: _jsonl(_task(question="x" * 5_000_000)), T,
        expect="accepted", note="a 5 MB instruction")
    add("tasks_ok_int_ids", ".jsonl", _jsonl(_task(id=1), _task(id=2)), T, expect="accepted",
        note="integer ids are taken as their digits")

    # ---- tasks load: files in task-row form (id, instruction, payload)
    L = "tasks load"
    row = {"id": "a", "instruction": "do it", "answer": None, "env": "math", "split": "train", "payload": "{}"}
    add("load_id_dict", ".jsonl", _jsonl(row, {**row, "id": {"a": 1}}), L, reason=("id",))
    add("load_instruction_list", ".jsonl", _jsonl({**row, "instruction": ["do", "it"]}), L, reason=("instruction",))
    add("load_payload_not_object", ".jsonl", _jsonl({**row, "payload": "[1, 2]"}), L, reason=("payload",))
    add("load_payload_bad_json", ".jsonl", _jsonl({**row, "payload": "{oops"}), L, reason=("payload",))
    add("load_parquet_body_cut", ".parquet", lambda: _parquet_body_cut([row]), L, reason=("row group",))
    return cases


# ------------------------------------------------------------------------------------------ running a case


def _seed_row() -> dict[str, Any]:
    return _traj(id="seed-1", task_id="seed")


def _store_for(case: FuzzCase, workdir: Path):
    """The store a case writes into: one shared seeded store for cases that must be refused (it must stay
    unchanged), a fresh one for accepted cases."""
    from omrl.store import Store

    path = workdir / ("store" if case.expect == "error" else f"store-{case.name}")
    if case.expect != "error" and path.exists():
        shutil.rmtree(path)
    fresh = not (path / "omrl.json").exists()
    store = Store.create(path)
    if fresh:
        store.append([_seed_row()])
    return store


def _snapshot(root: Path) -> list[tuple[str, int]]:
    """Every file under a store's data/ (hidden temporary files too), with its size."""
    data = root / "data"
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in data.rglob("*") if p.is_file())


def _is_clean(exc: BaseException) -> bool:
    """An error the CLI prints as one line (omrl.cli.common.user_errors), and not a raw library error."""
    import pyarrow as pa

    from omrl.store import StoreError

    if isinstance(exc, (UnicodeError, json.JSONDecodeError, pa.ArrowException)):
        return False
    return isinstance(exc, (ValueError, FileNotFoundError, StoreError))


def run_fuzz_case(case: FuzzCase, workdir: str | Path) -> FuzzOutcome:
    """Run one case through the real public API and classify the outcome (see the module docstring).

    workdir: a folder for the stores and task outputs the cases write; cases may share it.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    store = out = None
    if case.target.startswith(("store append", "import")):
        store = _store_for(case, workdir)
        before = _snapshot(store.path)
    elif case.target == "tasks import":
        out = workdir / f"tasks-{case.name}.parquet"
        out.unlink(missing_ok=True)
    try:
        _run(case, store, out)
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        message = " ".join(str(exc).split()) if _is_clean(exc) else str(exc)
        text = f"{type(exc).__name__}: {message}"
        if store is not None:
            unchanged = _snapshot(store.path) == before
        else:
            unchanged = out is None or not out.exists()
        outcome = FuzzOutcome(case, _classify(case, exc, message), text, unchanged)
        if not unchanged:
            outcome.problems.append("the store's parts changed" if store is not None else "an output file was written")
        if len(message) > MAX_MESSAGE:
            outcome.problems.append(f"the error message is {len(message)} characters long")
        if case.reason and not any(word.lower() in message.lower() for word in case.reason):
            outcome.problems.append(f"the message gives none of the expected reasons {list(case.reason)}")
        return outcome
    return FuzzOutcome(case, "accepted")


def _classify(case: FuzzCase, exc: BaseException, message: str) -> str:
    if not _is_clean(exc):
        return "traceback"
    names_file = case.path.name in message
    if names_file and LOCATOR.search(message):
        return "located"
    if names_file and case.whole_file:
        return "located"
    return "unlocated"


def _run(case: FuzzCase, store: Any, out: Path | None) -> None:
    if case.target in ("store append", "store append annotations"):
        from omrl.store.record_files import append_file

        append_file(store, case.path, table="annotations" if case.target.endswith("annotations") else "trajectories")
    elif case.target.startswith("import "):
        from omrl.formats.importer import import_files

        import_files([case.path], store, fmt=case.target.split(" ", 1)[1])
    elif case.target == "tasks import":
        from omrl.tasks import import_tasks

        import_tasks(case.path, out)
    elif case.target == "tasks load":
        from omrl.tasks import load_tasks

        load_tasks(case.path)
    else:
        raise UsageError(f"unknown fuzz target {case.target!r}; targets are {', '.join(TARGETS)}")


def run_fuzz_corpus(folder: str | Path, workdir: str | Path) -> list[FuzzOutcome]:
    """Write the corpus into `folder` and run every case with stores and outputs in `workdir`."""
    return [run_fuzz_case(case, workdir) for case in write_fuzz_corpus(folder)]


def summarize(outcomes: list[FuzzOutcome]) -> dict[str, int]:
    """Counts per outcome class, plus how many cases were not handled as they should be ("not ok")."""
    counts = {name: 0 for name in ("located", "unlocated", "traceback", "accepted")}
    for outcome in outcomes:
        counts[outcome.outcome] += 1
    counts["not ok"] = sum(1 for o in outcomes if not o.ok)
    return counts
