from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.config import RecipeError
from omrl.tasks import (
    TASK_SCHEMA,
    TaskError,
    TaskMapping,
    extract_gsm8k_answer,
    import_tasks,
    load_task_mapping,
    load_tasks,
)

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
needs_real = pytest.mark.skipif(not REAL.exists(), reason="shared real data absent")


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"question": "What is 2+2?", "solution": "4", "topic": "add"},
        {"question": "What is 3*3?", "solution": "9", "topic": "mul"}]


@needs_real
def test_cli_imports_gsm8k_with_numeric_answers(tmp_path):
    out = tmp_path / "gsm8k.parquet"
    result = CliRunner().invoke(cli, ["tasks", "import", str(REAL / "gsm8k_test.jsonl"), "--out", str(out),
                                      "--split", "test"])
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert table.schema.equals(TASK_SCHEMA) and table.num_rows == 1319
    rows = table.to_pylist()
    assert all(float(r["answer"]) == float(r["answer"]) for r in rows)  # every answer parses as a number
    assert rows[0]["answer"] == "18" and rows[0]["env"] == "math" and rows[0]["split"] == "test"
    assert "#### 18" in json.loads(rows[0]["payload"])["solution"]
    assert len({r["id"] for r in rows}) == 1319 and rows[5]["id"] == "gsm8k-5"
    shown = CliRunner().invoke(cli, ["tasks", "show", str(out)])
    assert shown.exit_code == 0 and "1319" in shown.output and "math" in shown.output


@needs_real
def test_cli_imports_dbbench_as_sql_tasks(tmp_path):
    out = tmp_path / "db.parquet"
    result = CliRunner().invoke(cli, ["tasks", "import", str(REAL / "agentbench_dbbench_dev.jsonl"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    tasks = load_tasks(out)
    assert len(tasks) == 60 and {t.env for t in tasks} == {"sql"}
    first = tasks[0]
    assert json.loads(first.answer) == ["March 19, 1998"]
    assert first.payload["table"]["table_name"].startswith("US Ambassadors") and "headers" in first.instruction


@needs_real
def test_cli_imports_agentbench_os_tasks_whole_with_their_evaluation(tmp_path):
    from omrl.envs.os_interaction.tasks import task_from_record

    out = tmp_path / "os.parquet"
    source = REAL / "agentbench_os_dev.json"
    result = CliRunner().invoke(cli, ["tasks", "import", str(source), "--env", "os", "--out", str(out)])
    assert result.exit_code == 0, result.output
    tasks = load_tasks(out)
    records = json.loads(source.read_text())
    assert len(tasks) == 26 and {t.env for t in tasks} == {"os"}
    assert all(t.payload.get("match") is not None or t.payload.get("check") for t in tasks)
    # The same payload `omrl tasks generate os --option source=FILE` plays: one reader of AgentBench OS records.
    assert [t.payload for t in tasks] == [task_from_record(r, i, "train", "x").payload for i, r in enumerate(records)]
    assert tasks[0].answer == tasks[0].payload["match"] == "1" and tasks[3].payload["check"] == {"file": "check/0.sh"}


def test_an_import_that_drops_a_field_the_environment_needs_is_refused_there(tmp_path):
    src = tmp_path / "os.json"
    src.write_text(json.dumps([{"description": "How many files are in /etc?", "evaluation": {"match": "3"}},
                               {"description": "Which user runs cron?", "evaluation": {}}]))
    with pytest.raises(TaskError, match=r"^os.json: row 2 \(id 'agentbench_os-1'\): environment 'os' needs the "
                                        r"payload field 'match' or 'check', which this row lacks; AgentBench OS "
                                        r"files are read whole by `omrl tasks import FILE"):
        import_tasks(src)
    plain = CliRunner().invoke(cli, ["tasks", "import", str(src), "--format", "plain", "--env", "os",
                                     "--out", str(tmp_path / "t.parquet")])
    assert plain.exit_code != 0 and "row 1 (id 'os-0'): environment 'os' needs the payload field 'match' or " \
        "'check'" in plain.output and "omrl tasks generate os --option source=FILE" in plain.output
    assert not (tmp_path / "t.parquet").exists()
    assert import_tasks(src, format="plain", env="math").num_rows == 2  # math declares no such need


def test_gsm8k_extractor():
    assert extract_gsm8k_answer("so 3+4=7\n#### 7") == "7"
    assert extract_gsm8k_answer("#### 1,000") == "1000"
    assert extract_gsm8k_answer("no final line") is None


def test_flags_map_columns_and_keep_the_rest_in_payload(tmp_path):
    src = write_jsonl(tmp_path / "mine.jsonl", ROWS)
    table = import_tasks(src, tmp_path / "t.parquet", instruction="question", answer="solution", env="math")
    rows = table.to_pylist()
    assert [r["id"] for r in rows] == ["mine-0", "mine-1"]  # generated from the row index, stable
    assert rows[1]["answer"] == "9" and rows[1]["env"] == "math" and rows[1]["split"] == "train"
    assert json.loads(rows[1]["payload"]) == {"topic": "mul"}
    assert [t.id for t in load_tasks(tmp_path / "t.parquet")] == ["mine-0", "mine-1"]


def test_yaml_mapping_file(tmp_path):
    src = write_jsonl(tmp_path / "m.jsonl", [{**r, "key": f"k{i}"} for i, r in enumerate(ROWS)])
    mapping = tmp_path / "map.yaml"
    mapping.write_text("id: key\ninstruction: question\nanswer: solution\nenv: math\nsplit: eval\n")
    result = CliRunner().invoke(cli, ["tasks", "import", str(src), "--out", str(tmp_path / "o.parquet"),
                                      "--mapping", str(mapping)])
    assert result.exit_code == 0, result.output
    tasks = load_tasks(tmp_path / "o.parquet")
    assert [t.id for t in tasks] == ["k0", "k1"] and {t.split for t in tasks} == {"eval"}
    mapping.write_text("identifier: key\n")
    with pytest.raises(RecipeError, match="map.yaml: unknown key identifier"):
        load_task_mapping(mapping)


@pytest.mark.parametrize("kind", ["json", "csv", "parquet", "saved"])
def test_other_source_formats(tmp_path, kind):
    if kind == "json":
        src = tmp_path / "d.json"
        src.write_text(json.dumps({"data": ROWS}))
    elif kind == "csv":
        src = tmp_path / "d.csv"
        with src.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(ROWS[0]))
            writer.writeheader()
            writer.writerows(ROWS)
    elif kind == "parquet":
        src = tmp_path / "d.parquet"
        pq.write_table(pa.Table.from_pylist(ROWS), src)
    else:
        import datasets

        src = tmp_path / "saved"
        datasets.DatasetDict({"test": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(src))
    tasks = import_tasks(src, instruction="question", answer="solution").to_pylist()
    assert [t["instruction"] for t in tasks] == ["What is 2+2?", "What is 3*3?"]
    assert [t["answer"] for t in tasks] == ["4", "9"]
    if kind == "saved":
        assert {t["split"] for t in tasks} == {"test"}


@pytest.mark.parametrize("rows, flags, message", [
    ([{"id": "a", "question": "x"}, {"id": "b", "question": "y"}, {"id": "a", "question": "z"}], {},
     r"row 3 \(id 'a'\): duplicate id 'a' \(first seen at row 1\)"),
    ([{"question": "x"}, {"question": "   "}], {}, r"row 2 \(id 'bad-1'\): empty instruction"),
    ([{"question": "x"}], {"answer": "gold"}, r"column 'gold' \(given for answer\) is not in the data"),
    ([{"text": "x"}], {}, r"no instruction column found"),
    ([{"question": "q", "answer": "#### 3"}, {"question": "q2", "answer": "no final"}], {"format": "gsm8k"},
     r"row 2: answer has no '#### <number>'"),
    ([{"description": "d", "label": ["x"]}], {"format": "dbbench"}, r"row 1: missing column 'table'"),
])
def test_malformed_rows_fail_with_the_row_named(tmp_path, rows, flags, message):
    src = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TaskError, match=message):
        import_tasks(src, tmp_path / "out.parquet", **flags)
    assert not (tmp_path / "out.parquet").exists()


def test_bad_json_line_is_named_and_cli_reports_cleanly(tmp_path):
    src = tmp_path / "broken.jsonl"
    src.write_text('{"question": "ok"}\n{"question": \n')
    result = CliRunner().invoke(cli, ["tasks", "import", str(src), "--out", str(tmp_path / "o.parquet")])
    assert result.exit_code != 0 and "line 2 is not valid JSON" in result.output
    assert "Traceback" not in result.output


def test_generate_writes_reproducible_files(tmp_path):
    for kind in ("math", "shop"):
        a, b = tmp_path / f"{kind}-a.jsonl", tmp_path / f"{kind}-b.parquet"
        for out in (a, b):
            result = CliRunner().invoke(cli, ["tasks", "generate", kind, "--n", "7", "--seed", "2", "--out", str(out)])
            assert result.exit_code == 0, result.output
        assert [t.to_row() for t in load_tasks(a)] == [t.to_row() for t in load_tasks(b)]
        assert len(load_tasks(a)) == 7 and {t.env for t in load_tasks(a)} == {kind}


def test_shipped_task_files_load():
    root = Path(__file__).resolve().parents[1] / "datasets"
    assert not (root / "__init__.py").exists()
    counts = {name: len(load_tasks(root / "tasks" / name)) for name in ("math_arith.jsonl", "shop.jsonl", "code.jsonl")}
    assert counts == {"math_arith.jsonl": 50, "shop.jsonl": 30, "code.jsonl": 13}


def test_shipped_task_sets_are_named_without_a_path(tmp_path):
    root = Path(__file__).resolve().parents[1] / "datasets" / "tasks"
    assert [t.to_row() for t in load_tasks("shipped:math_arith")] == [t.to_row() for t in load_tasks(root / "math_arith.jsonl")]
    assert load_tasks("shipped:grid_eval.jsonl", split="eval")
    assert import_tasks("shipped:shop", tmp_path / "shop.parquet").num_rows == 30
    with pytest.raises(FileNotFoundError, match="no such shipped task set; shipped: shipped:code, "):
        load_tasks("shipped:nope")


def test_benchmark_converters_live_in_their_own_module():
    from omrl.tasks import benchmarks, detect_benchmark

    assert detect_benchmark is benchmarks.detect_benchmark and set(benchmarks.CONVERTERS) == {"gsm8k", "dbbench", "agentbench_os",
                                                                                   "swebench"}
    assert benchmarks.extract_gsm8k_answer("so\n#### 1,000") == "1000"


def test_parquet_task_files_are_validated_like_jsonl(tmp_path):
    rows = [{"id": "a", "instruction": "x", "answer": None, "env": None, "split": None, "payload": "{}"},
            {"id": "a", "instruction": "y", "answer": None, "env": None, "split": None, "payload": "{}"}]
    pq.write_table(pa.Table.from_pylist(rows, schema=TASK_SCHEMA), tmp_path / "dup.parquet")
    with pytest.raises(TaskError, match="row 2 .*duplicate id 'a'"):
        load_tasks(tmp_path / "dup.parquet")
    rows[1].update(id="b", payload="{not json")
    pq.write_table(pa.Table.from_pylist(rows, schema=TASK_SCHEMA), tmp_path / "bad.parquet")
    with pytest.raises(TaskError, match="row 2 \\(id 'b'\\): payload is not valid JSON"):
        load_tasks(tmp_path / "bad.parquet")


def test_import_flags_do_not_change_the_callers_mapping(tmp_path):
    src = write_jsonl(tmp_path / "src.jsonl", ROWS)
    mapping = TaskMapping(env="math")
    table = import_tasks(src, mapping=mapping, instruction="question", answer="solution")
    assert table.column("answer").to_pylist() == ["4", "9"]
    assert mapping == TaskMapping(env="math")


def test_dotted_paths_reach_nested_fields_and_query_id_is_guessed(tmp_path):
    src = tmp_path / "nested.jsonl"
    src.write_text("\n".join(json.dumps({"query_id": f"q{i}", "question": f"What is {i}+1?",
                                         "eval": {"reference_answers": [str(i + 1)]}}) for i in range(3)) + "\n")
    rows = import_tasks(src, answer="eval.reference_answers.0", env="math").to_pylist()
    assert [r["id"] for r in rows] == ["q0", "q1", "q2"]
    assert [r["answer"] for r in rows] == ["1", "2", "3"]
    with pytest.raises(TaskError, match="'eval.nope' .* is not in the data"):
        import_tasks(src, answer="eval.nope")


def test_an_unknown_env_is_refused_at_import(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"id": "a", "question": "q"}) + "\n")
    with pytest.raises(TaskError, match="unknown environment 'maht'; known: .*math"):
        import_tasks(src, env="maht")
    assert import_tasks(src, env="my_pkg.envs:MyEnv").to_pylist()[0]["env"] == "my_pkg.envs:MyEnv"
