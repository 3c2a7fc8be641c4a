"""The command line: help everywhere, and the foundation verbs run through click's CliRunner."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import make_trajectory

from omrl.cli.main import COMMANDS, cli


def _all_commands():
    """(path, command) for every command and subcommand reachable from `omrl`."""
    ctx = click.Context(cli)
    out = []

    def walk(group, path):
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            out.append((path + [name], command))
            if isinstance(command, click.Group):
                walk(command, path + [name])

    walk(cli, [])
    return out


def test_every_command_has_help_and_an_example():
    runner = CliRunner()
    commands = _all_commands()
    assert {path[0] for path, _ in commands} == set(COMMANDS.names())
    for path, command in commands:
        result = runner.invoke(cli, path + ["--help"])
        assert result.exit_code == 0, (path, result.output)
        assert command.help and command.help.strip(), f"omrl {' '.join(path)} has no help"
        assert "Example" in command.help, f"omrl {' '.join(path)} has no example in its help"


# Paths into the shipped folders of the repository, as a help text's example names them.
_SHIPPED_PATH = re.compile(r"(?<![\w/.-])((?:datasets|recipes|benchmarks|scripts|schemas|omrl/data)/[\w./-]*\w)")


def _help_texts():
    """(command path, text) for the help of every command and of each of its options."""
    for path, command in _all_commands():
        yield path, command.help or ""
        for param in command.params:
            yield path, getattr(param, "help", None) or ""


def test_every_file_a_help_text_names_exists():
    from omrl.shipped import shipped_recipes, shipped_task_sets

    root = Path(__file__).resolve().parents[1]
    named = shipped = 0
    for path, text in _help_texts():
        where = f"omrl {' '.join(path)} --help"
        for name in _SHIPPED_PATH.findall(text):
            named += 1
            assert (root / name).exists(), f"{where} names {name}, which does not exist"
        for name in re.findall(r"shipped:([\w/]+)", text):
            if name != "NAME":  # a shipped task set or recipe
                shipped += 1
                assert name in shipped_task_sets() + shipped_recipes(), f"{where} names shipped:{name}"
    # The patterns find the examples: shipped:NAME ones (test_cli_help: no datasets/ or recipes/ path), benchmarks/...
    assert shipped >= 10 and named >= 1


def test_group_help_lists_every_subcommand():
    runner = CliRunner()
    top = runner.invoke(cli, ["--help"]).output
    for name in COMMANDS.names():
        assert re.search(rf"^  {name} ", top, re.M), f"omrl --help does not list {name}"
    ctx = click.Context(cli)
    train = cli.get_command(ctx, "train")
    trainers = train.list_commands(ctx)
    assert "ppo" in trainers
    for name in trainers:  # the one-line help in `omrl --help` and the group's own name every trainer
        assert name in COMMANDS.get("train").summary, f"omrl --help's line for train does not name {name}"
        assert name in (train.help or ""), f"omrl train --help does not name {name}"


def test_a_mistyped_command_gets_did_you_mean():
    runner = CliRunner()
    top = runner.invoke(cli, ["colect", "--env", "math"])
    assert top.exit_code == 2 and "No such command 'colect'. Did you mean 'collect'?" in top.output
    assert "Did you mean" not in runner.invoke(cli, ["zzzz"]).output
    assert "Did you mean 'check'" in runner.invoke(cli, ["store", "chek"]).output


def test_help_is_fast_and_imports_no_training_stack():
    code = "import sys; from omrl.cli.main import cli; sys.argv=['omrl','--help']\n" \
           "try:\n    cli()\nexcept SystemExit:\n    pass\n" \
           "heavy = [m for m in ('torch', 'transformers', 'trl', 'datasets') if m in sys.modules]\n" \
           "print('HEAVY', heavy)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out


def test_data_verbs_help_loads_no_query_engine():
    verbs = ["store", "query", "stats", "show", "import", "export"]
    code = "import sys; from click.testing import CliRunner; from omrl.cli.main import cli\n" \
           f"for verb in {verbs!r}:\n    assert CliRunner().invoke(cli, [verb, '--help']).exit_code == 0\n" \
           "print('HEAVY', [m for m in ('duckdb', 'polars', 'torch', 'datasets') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out


def test_schema_json_prints_both_schemas():
    result = CliRunner().invoke(cli, ["schema", "--json"])
    assert result.exit_code == 0
    schemas = json.loads(result.output)
    assert set(schemas) == {"trajectories", "annotations"}
    assert "messages" in schemas["trajectories"]["properties"]


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_query_formats(store, fmt):
    result = CliRunner().invoke(cli, ["query", str(store.path), "SELECT task_id, reward FROM trajectories "
                                      "ORDER BY id LIMIT 2", "--format", fmt])
    assert result.exit_code == 0, result.output
    if fmt == "json":
        assert [json.loads(line) for line in result.output.splitlines()] == [
            {"task_id": "task-0", "reward": 1.0}, {"task_id": "task-0", "reward": 0.0}]
    else:
        assert result.output.splitlines() == ['"task_id","reward"', '"task-0",1', '"task-0",0']


def test_query_csv_writes_nested_values_as_json(store, tmp_path):
    out = tmp_path / "q.csv"
    result = CliRunner().invoke(cli, ["query", str(store.path), "SELECT turns FROM trajectories LIMIT 1",
                                      "--format", "csv", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert '""index"": 0' in out.read_text()


def test_query_parquet_and_stdin(store, tmp_path):
    out = tmp_path / "q.parquet"
    result = CliRunner().invoke(cli, ["query", str(store.path), "-", "--format", "parquet", "--out", str(out)],
                                input="SELECT id FROM trajectories")
    assert result.exit_code == 0, result.output
    assert pq.read_table(out).num_rows == 6


def test_query_table_format(store):
    result = CliRunner().invoke(cli, ["query", str(store.path), "SELECT count(*) AS n FROM groups"])
    assert result.exit_code == 0 and "3" in result.output


@pytest.mark.parametrize("sql", ["DELETE FROM trajectories", "COPY trajectories TO 'x.csv'",
                                 "ATTACH 'x.db'", "INSTALL httpfs"])
def test_query_refuses_writes(store, sql):
    result = CliRunner().invoke(cli, ["query", str(store.path), sql])
    assert result.exit_code != 0
    assert "read-only" in result.output


def test_stats(store):
    result = CliRunner().invoke(cli, ["stats", str(store.path), "--json"])
    assert result.exit_code == 0, result.output
    tables = json.loads(result.output)
    assert tables["overview"][0]["trajectories"] == 6
    assert tables["overview"][0]["success_rate"] == 0.5
    assert tables["by env"] == [{"env": "math", "n": 6, "mean_reward": 0.5, "success_rate": 0.5, "failed": 0,
                                 "unknown_success": 0, "mean_turns": 2.0}]
    pretty = CliRunner().invoke(cli, ["stats", str(store.path)])
    assert pretty.exit_code == 0 and "by status" in pretty.output


def test_show_renders_roles_tool_calls_and_rewards(store):
    result = CliRunner().invoke(cli, ["show", str(store.path), "traj-2"], terminal_width=120)
    assert result.exit_code == 0, result.output
    for expected in ("assistant", "tool calculator", "calculator", "2+1", "reward 1", "task-1"):
        assert expected in result.output
    missing = CliRunner().invoke(cli, ["show", str(store.path), "nope"])
    assert missing.exit_code != 0 and "no trajectory" in missing.output


def test_store_append_check_compact(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps(make_trajectory(i).to_row(), default=str) for i in range(3)) + "\n")
    runner = CliRunner()
    target = str(tmp_path / "s")
    assert runner.invoke(cli, ["store", "append", target, str(source)]).exit_code == 0
    again = runner.invoke(cli, ["store", "append", target, str(source)])  # the same ids twice: refused whole
    assert again.exit_code == 1 and "3 of 3 trajectories rows have ids the store already holds" in again.output
    result = runner.invoke(cli, ["store", "append", target, str(source), "--skip-existing"])
    assert result.exit_code == 0 and "appended 0 trajectories rows" in result.output
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps(make_trajectory(7).to_row(), default=str) + "\n")
    assert runner.invoke(cli, ["store", "append", target, str(more)]).exit_code == 0
    result = runner.invoke(cli, ["store", "compact", target])
    assert result.exit_code == 0 and "2 parts -> 1" in result.output
    assert runner.invoke(cli, ["store", "check", target]).exit_code == 0
    (tmp_path / "s" / "data" / "trajectories" / "part-broken.parquet").write_bytes(b"PAR1 nonsense")
    result = runner.invoke(cli, ["store", "check", target])
    assert result.exit_code == 1 and "part-broken.parquet" in result.output


def test_store_append_names_the_bad_line(tmp_path):
    source = tmp_path / "in.jsonl"
    good = json.dumps(make_trajectory(0).to_row(), default=str)
    source.write_text(good + "\n" + json.dumps({"id": "x", "task_id": "t", "success": "yes"}) + "\n")
    result = CliRunner().invoke(cli, ["store", "append", str(tmp_path / "s"), str(source)])
    assert result.exit_code != 0
    assert "in.jsonl line 2" in result.output and "field 'success'" in result.output
    from omrl.store import Store

    assert Store(tmp_path / "s").count() == 0  # validated before anything was written


@pytest.mark.parametrize("command", [["models", "tiny", "--out", "{tmp}/m"], ["demo", "--out-dir", "{tmp}/d"]])
def test_a_missing_extra_is_one_line_naming_it(command, tmp_path, monkeypatch):
    """Without the train extra (torch and transformers cannot be imported), the command says which extra to
    install in one line, not a ModuleNotFoundError traceback."""
    for name in ("torch", "transformers", "trl", "tokenizers"):
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ModuleNotFoundError
    result = CliRunner().invoke(cli, [part.format(tmp=tmp_path) for part in command])
    assert result.exit_code == 1 and "pip install 'omrl[train]'" in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
