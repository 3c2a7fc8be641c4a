"""Bad input files: every reader names the file and the line (or record, row, row group), never a traceback.

The corpus (tests.cases.fuzz) runs whole; the targeted tests pin each finding of the attacker probe.
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.formats.importer import FileReport, import_files, iter_trajectories
from omrl.formats.records import FormatError
from omrl.schema import SchemaError, normalize_annotation, normalize_trajectory
from omrl.store import Store
from omrl.store.record_files import append_file
from omrl.tasks import TaskError, import_tasks, load_tasks
from tests.cases.fuzz import TARGETS, FuzzCase, run_fuzz_case, summarize, write_fuzz_corpus
from tests.cases.fuzz import _parquet_body_cut as parquet_body_cut


def _row(i: int = 0, **change) -> dict:
    row = {"id": f"r-{i}", "task_id": "t", "messages": [{"role": "user", "content": "hi"},
                                                         {"role": "assistant", "content": "hello"}], "reward": 1.0}
    row.update(change)
    return row


def _jsonl(*rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _parts(store: Store) -> list[str]:
    return sorted(p.name for p in (store.path / "data").rglob("*") if p.is_file())


# ---------------------------------------------------------------- the whole corpus


def test_every_fuzz_case_is_refused_with_file_and_place_and_the_store_unchanged(tmp_path):
    cases = write_fuzz_corpus(tmp_path / "corpus")
    assert len(cases) >= 70 and len({c.name for c in cases}) == len(cases)
    assert {c.target for c in cases} == set(TARGETS)  # every reader and command is probed
    outcomes = [run_fuzz_case(case, tmp_path / "work") for case in cases]
    bad = [f"{o.case.name} ({o.case.target}): {o.outcome} {o.message[:200]} {o.problems}" for o in outcomes if not o.ok]
    assert not bad, "\n".join(bad)
    counts = summarize(outcomes)
    assert counts["unlocated"] == 0 and counts["traceback"] == 0 and counts["not ok"] == 0
    assert counts["accepted"] == sum(1 for c in cases if c.expect == "accepted") >= 5
    assert all(o.unchanged for o in outcomes if o.outcome != "accepted")


def test_the_runner_tells_tracebacks_and_unlocated_errors_apart(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text("{}\n")
    case = FuzzCase("x", path, "store append")
    from tests.cases import fuzz

    assert fuzz._classify(case, RecursionError("deep"), "deep") == "traceback"
    assert fuzz._classify(case, UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), "bad") == "traceback"
    assert fuzz._classify(case, SchemaError("something is wrong"), "something is wrong") == "unlocated"
    assert fuzz._classify(case, SchemaError("x.jsonl line 1: bad"), "x.jsonl line 1: bad") == "located"
    outcome = run_fuzz_case(case, tmp_path / "work")  # {} has no id: refused naming line 1
    assert outcome.outcome == "located" and outcome.unchanged and "x.jsonl line 1" in outcome.message


# ---------------------------------------------------------------- the probe's findings, one by one


def test_invalid_utf8_names_the_line_in_every_reader(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(_jsonl(_row(0), _row(1)) + b'{"id": "caf\xe9"}\n')
    store = Store.create(tmp_path / "s")
    with pytest.raises(SchemaError, match=r"bad\.jsonl line 3 is not valid UTF-8 \(byte 0xe9"):
        append_file(store, path)
    with pytest.raises(FormatError, match=r"bad\.jsonl record 2: line 3 is not valid UTF-8"):
        import_files([path], store, fmt="openai")
    tasks = tmp_path / "tasks.csv"
    tasks.write_bytes(b"id,question\na,2+2?\nb,caf\xe9?\n")
    with pytest.raises(TaskError, match=r"tasks\.csv line 3 is not valid UTF-8"):
        import_tasks(tasks)
    assert _parts(store) == []


def test_skip_errors_counts_an_undecodable_line_and_goes_on(tmp_path):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(_jsonl(good) + b'{"messages": "\xff"}\n' + ("[" * 200_000 + "\n").encode() + _jsonl(good))
    report = FileReport(str(path), "openai")
    rows = list(iter_trajectories(path, "openai", skip_errors=True, report=report))
    assert len(rows) == 2 and report.skipped == {"bad encoding": 1, "too deep": 1}


def test_truncated_json_names_the_record(tmp_path):
    text = json.dumps([_row(0), _row(1), _row(2)], indent=1)
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) - 150])
    with pytest.raises(SchemaError, match=r"cut\.json item 2 is not valid JSON \(.*line \d+ column \d+\)"):
        append_file(Store.create(tmp_path / "s"), path)
    with pytest.raises(FormatError, match=r"cut\.json item 2 is not valid JSON"):
        import_files([path], Store.create(tmp_path / "s2"), fmt="openai")


def test_parquet_with_its_body_cut_is_a_clean_error_naming_file_and_row_group(tmp_path):
    path = tmp_path / "cut.parquet"
    path.write_bytes(parquet_body_cut([_row(0)]))
    store = Store.create(tmp_path / "s")
    with pytest.raises(SchemaError, match=r"cut\.parquet row group \d+ \(rows \d+-\d+\): cannot decode"):
        append_file(store, path)
    with pytest.raises(FormatError, match=r"cut\.parquet row group \d+"):
        import_files([path], store, fmt="openai")
    assert _parts(store) == []
    result = CliRunner().invoke(cli, ["store", "append", str(tmp_path / "s"), str(path)])
    assert result.exit_code == 1 and "cut.parquet row group" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_200000_nested_brackets_is_a_clean_error_naming_the_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_bytes(_jsonl(_row(0)) + ("[" * 200_000 + "]" * 200_000 + "\n").encode())
    with pytest.raises(SchemaError, match=r"deep\.jsonl line 2 is nested too deeply"):
        append_file(Store.create(tmp_path / "s"), path)
    tasks = tmp_path / "deep_tasks.json"
    tasks.write_text("[" + "[" * 200_000 + "]" * 200_000 + "]")
    with pytest.raises(TaskError, match=r"deep_tasks\.json item 0 \(line 1\) is nested too deeply"):
        import_tasks(tasks)
    result = CliRunner().invoke(cli, ["store", "append", str(tmp_path / "s"), str(path)])
    assert result.exit_code == 1 and "deep.jsonl line 2" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_non_finite_reward_is_refused(tmp_path, literal):
    path = tmp_path / "inf.jsonl"
    path.write_bytes(_jsonl(_row(0)) + f'{{"id": "x", "task_id": "t", "reward": {literal}}}\n'.encode())
    store = Store.create(tmp_path / "s")
    with pytest.raises(SchemaError, match=r"inf\.jsonl line 2: .*reward must be a finite number"):
        append_file(store, path)
    assert _parts(store) == []


def test_normalizers_refuse_non_finite_rewards_and_scores():
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(SchemaError, match="reward must be a finite number"):
            normalize_trajectory(_row(0, reward=bad))
        with pytest.raises(SchemaError, match=r"turns\[1\].reward': reward must be a finite number"):
            normalize_trajectory(_row(0, turns=[{"reward": 0.5}, {"reward": bad}]))
        with pytest.raises(SchemaError, match="score must be a finite number"):
            normalize_annotation({"trajectory_id": "r-0", "annotator": "judge", "score": bad})
    assert normalize_trajectory(_row(0, reward=None))["reward"] is None
    assert normalize_trajectory(_row(0, reward=2))["reward"] == 2.0


def test_non_string_ids_and_instructions_are_refused_by_the_trajectory_normalizer():
    with pytest.raises(SchemaError, match="field 'id' must be a non-empty string, got dict"):
        normalize_trajectory(_row(0, id={"a": 1}))
    with pytest.raises(SchemaError, match="field 'instruction' must be a string, got list"):
        normalize_trajectory(_row(0, instruction=["a", "b"]))
    with pytest.raises(SchemaError, match="field 'task_id' must be a string, got float"):
        normalize_trajectory(_row(0, task_id=1.5))
    assert normalize_trajectory(_row(0, task_id=7))["task_id"] == "7"  # integer ids stay accepted


def test_ragged_csv_is_refused_naming_the_line(tmp_path):
    more = tmp_path / "more.csv"
    more.write_text("id,question,answer\na,2+2?,4\nb,3+3?,6,oops\n")
    with pytest.raises(TaskError, match=r"more\.csv line 3: 4 fields, but the header \(line 1\) has 3"):
        import_tasks(more, tmp_path / "out.parquet")
    fewer = tmp_path / "fewer.csv"
    fewer.write_text("id,question,answer\na,2+2?,4\n\nb,3+3?\n")
    with pytest.raises(TaskError, match=r"fewer\.csv line 4: 2 fields"):
        import_tasks(fewer, tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


def test_csv_with_a_bom_quoted_commas_and_crlf_still_imports(tmp_path):
    path = tmp_path / "ok.csv"
    path.write_bytes(b'\xef\xbb\xbfid,question,answer\r\na,"2,2?",4\r\n')
    [task] = import_tasks(path).to_pylist()
    assert task["id"] == "a" and task["instruction"] == "2,2?" and task["answer"] == "4"


@pytest.mark.parametrize("change, message", [
    ({"id": {"nested": 1}}, r"row 2: id must be a string, got an object"),
    ({"id": ["a"]}, r"row 2: id must be a string, got a list"),
    ({"id": 1.5}, r"row 2: id must be a string, got a number \(1\.5\)"),
    ({"question": ["what", "is", "it"]}, r"row 2 \(id 'b'\): instruction must be text, got a list"),
    ({"question": {"text": "?"}}, r"row 2 \(id 'b'\): instruction must be text, got an object"),
])
def test_tasks_import_refuses_objects_as_ids_and_instructions(tmp_path, change, message):
    path = tmp_path / "typed.jsonl"
    path.write_bytes(_jsonl({"id": "a", "question": "q"}, {"id": "b", "question": "q2", **change}))
    with pytest.raises(TaskError, match=r"typed\.jsonl: " + message):
        import_tasks(path, tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


def test_tasks_load_refuses_objects_as_ids(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(_jsonl({"id": {"a": 1}, "instruction": "x", "payload": {}}))
    with pytest.raises(TaskError, match=r"rows\.jsonl: row 1: id must be a string, got an object"):
        load_tasks(path)
    path.write_bytes(_jsonl({"id": 3, "instruction": "x", "payload": {}}))
    assert [t.id for t in load_tasks(path)] == ["3"]


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_empty_file_names_the_file(tmp_path, suffix):
    path = tmp_path / f"nothing{suffix}"
    path.write_bytes(b"" if suffix == ".parquet" else b"\n  \n")
    store = Store.create(tmp_path / "s")
    with pytest.raises(SchemaError, match=rf"nothing\{suffix}: empty file, no records"):
        append_file(store, path)
    with pytest.raises(FormatError, match=rf"nothing\{suffix}: empty file, no records"):
        import_files([path], store)
    with pytest.raises(TaskError, match=rf"nothing\{suffix}: empty file, no records"):
        import_tasks(path)


def test_append_file_writes_one_part_however_many_rows(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_bytes(_jsonl(*(_row(i) for i in range(6001))))
    store = Store.create(tmp_path / "s")
    assert append_file(store, path) == 6001
    assert len(store.parts()) == 1 and store.count() == 6001


def test_a_lone_surrogate_is_refused_naming_file_line_and_field(tmp_path):
    """A JSON escape of half a surrogate pair parses but is not text: each reader says where it is."""
    lone = {"id": "r-9", "task_id": "t", "messages": [{"role": "user", "content": "hi \udc00"}]}
    path = tmp_path / "lone.jsonl"
    path.write_bytes(_jsonl(_row(0), lone))  # json.dumps writes "\udc00" as an escape
    store = Store.create(tmp_path / "s")
    with pytest.raises(SchemaError, match=r"lone\.jsonl line 2 holds a lone surrogate .* in messages\[0\]\.content"):
        append_file(store, path)
    with pytest.raises(FormatError, match=r"lone\.jsonl record 1: line 2 holds a lone surrogate"):
        import_files([path], store, fmt="openai")
    listed = tmp_path / "lone.json"
    listed.write_text(json.dumps([{"id": "a", "question": "2+2?"}, {"id": "b", "question": "x\ud800"}]))
    with pytest.raises(TaskError, match=r"lone\.json item 1 \(line 1\) holds a lone surrogate .* in question"):
        import_tasks(listed)
    assert _parts(store) == []
    # A whole pair written as two escapes is one character, and imports.
    pair = tmp_path / "pair.jsonl"
    pair.write_text('{"id": "p", "question": "smile \\ud83d\\ude00"}\n')
    assert import_tasks(pair, tmp_path / "pair.parquet") is not None
    result = CliRunner().invoke(cli, ["tasks", "import", str(path), "--out", str(tmp_path / "t.parquet")])
    assert result.exit_code != 0 and "lone.jsonl line 2" in result.output and "Traceback" not in result.output


def test_content_that_is_not_text_is_refused_not_coerced(tmp_path):
    """ShareGPT `value: 5` used to become "5", assistant content [1, 2] "12": refused, naming the message."""
    store = Store.create(tmp_path / "s")
    number = tmp_path / "number.jsonl"
    number.write_text(json.dumps({"conversations": [{"from": "human", "value": "2+3?"},
                                                    {"from": "gpt", "value": 5}]}) + "\n")
    with pytest.raises(FormatError, match=r"number\.jsonl record 0 conversations\[1\] value must be text, got an int"):
        import_files([number], store)
    parts = tmp_path / "parts.jsonl"
    parts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": [1, 2]}]}) + "\n")
    with pytest.raises(FormatError, match=r"parts\.jsonl record 0 messages\[1\] content\[0\]: a content part must"):
        import_files([parts], store)
    assert _parts(store) == []
    # Text parts and objects still import as before.
    fine = tmp_path / "fine.jsonl"
    fine.write_text(json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, " there"]},
                                             {"role": "assistant", "content": "ok"}]}) + "\n")
    import_files([fine], store)
    assert store.read().to_pylist()[0]["messages"][0]["content"] == "hi there"


def test_a_nan_answer_and_a_payload_that_is_not_an_object_are_refused(tmp_path):
    nan = tmp_path / "nan.jsonl"
    nan.write_text('{"id": "a", "question": "2+2?", "answer": "4"}\n{"id": "b", "question": "2+3?", "answer": NaN}\n')
    with pytest.raises(TaskError, match=r"nan\.jsonl: row 2 \(id 'b'\): the answer is nan"):
        import_tasks(nan)
    with pytest.raises(TaskError, match=r"nan\.jsonl: row 2 \(id 'b'\): the answer is nan"):
        load_tasks(nan)
    for payload, said in (("not json", "payload is not valid JSON"), ([1, 2], "payload must be a JSON object")):
        path = tmp_path / "payload.jsonl"
        path.write_text(json.dumps({"id": "a", "instruction": "2+2?", "answer": "4", "payload": payload}) + "\n")
        with pytest.raises(TaskError, match=rf"payload\.jsonl: row 1 \(id 'a'\): {said}"):
            import_tasks(path, env="math")
    # A task-row file's payload (an object, or JSON text of one) is the payload, not a field inside it.
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"id": "a", "instruction": "2+3?", "answer": "5", "payload": {"expression": "2+3"}})
                    + "\n" + json.dumps({"id": "b", "instruction": "2+4?", "payload": '{"expression": "2+4"}'}) + "\n")
    rows = import_tasks(path, env="math").to_pylist()
    assert [json.loads(r["payload"]) for r in rows] == [{"expression": "2+3"}, {"expression": "2+4"}]
