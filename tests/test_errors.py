"""User errors are one line, bugs show their traceback (always with --debug), piped output is not wrapped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omrl.errors import OmrlError, UsageError

ROOT = Path(__file__).resolve().parents[1]


def omrl(args: list[str], cwd: Path, patch: str = "", **env: str) -> subprocess.CompletedProcess:
    """Run the real entry point in a fresh interpreter (stdout and stderr piped, not terminals)."""
    code = f"import sys\n{patch}\nfrom omrl.cli.main import cli\ncli(sys.argv[1:], prog_name='omrl')\n"
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "OMRL_DEBUG")}
    environ["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True,
                          env={**environ, **env}, timeout=120)


@pytest.fixture
def broken_tasks(tmp_path: Path) -> Path:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"id": "a", "instruction": "x"}\nnot json\n')
    return path


def test_user_errors_derive_from_one_base_and_keep_their_builtin_base():
    import omrl
    from omrl.config import RecipeError
    from omrl.envs import EnvSpecError
    from omrl.formats.records import FormatError
    from omrl.policies.base import PolicyError
    from omrl.sandbox import SandboxUnavailable
    from omrl.schema import SchemaError
    from omrl.store import StoreError
    from omrl.store.query import QueryError
    from omrl.store.readers import ReadError
    from omrl.tasks import TaskError

    for cls in (SchemaError, FormatError, QueryError, TaskError, RecipeError, EnvSpecError, SandboxUnavailable,
                ReadError, UsageError):
        assert issubclass(cls, OmrlError) and issubclass(cls, ValueError), cls
    for cls in (StoreError, PolicyError):
        assert issubclass(cls, OmrlError) and issubclass(cls, RuntimeError), cls
    assert omrl.OmrlError is OmrlError


def test_a_user_error_is_one_line(tmp_path, broken_tasks):
    result = omrl(["tasks", "show", str(broken_tasks)], tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {broken_tasks.name} line 2 is not valid JSON"), lines
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback_of_a_user_error(tmp_path, broken_tasks):
    result = omrl(["--debug", "tasks", "show", str(broken_tasks)], tmp_path)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "TaskError" in result.stderr
    assert omrl(["tasks", "show", str(broken_tasks)], tmp_path, OMRL_DEBUG="1").stderr.count("Traceback") == 1


@pytest.mark.parametrize("error", ["ValueError('a bug, not bad input')", "KeyError('payload')"])
def test_a_bug_shows_its_traceback(tmp_path, broken_tasks, error):
    # A plain ValueError is a bug (omrl refuses bad input with UsageError and its kin): here a library function fails.
    patch = f"import omrl.tasks\ndef boom(*a, **k):\n    raise {error}\nomrl.tasks.load_tasks = boom"
    result = omrl(["tasks", "show", str(broken_tasks)], tmp_path, patch)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "in boom" in result.stderr, result.stderr
    assert "Error: " not in result.stderr.splitlines()[0]


def test_a_missing_file_is_one_line(tmp_path):
    from omrl.tasks import load_tasks

    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "nope.jsonl")
    result = omrl(["tasks", "import", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o.parquet")], tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "nope.jsonl" in result.stderr, result.stderr


def test_an_unloadable_model_is_one_line(tmp_path):
    pytest.importorskip("transformers")
    tasks = ROOT / "datasets" / "tasks" / "math_arith.jsonl"
    result = omrl(["collect", "--env", "math", "--tasks", str(tasks), "--policy", "hf:/no/such/model",
                   "--store", str(tmp_path / "s")], tmp_path, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "/no/such/model" in errors[0]


def test_piped_output_is_not_wrapped(tmp_path):
    # `omrl store check STORE | grep part-...` finds the whole path: rich wraps at 80 columns only on a terminal.
    deep = tmp_path.joinpath(*["a-rather-long-folder-name"] * 6, "store")
    assert len(str(deep)) > 160
    result = omrl(["store", "init", str(deep)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"store ready at {deep}" in result.stdout.splitlines()
    broken = deep / "data" / "trajectories" / "part-broken.parquet"
    broken.parent.mkdir(parents=True, exist_ok=True)
    broken.write_bytes(b"PAR1 nonsense")
    check = omrl(["store", "check", str(deep)], tmp_path)
    assert check.returncode == 1
    assert [line for line in check.stdout.splitlines() if "part-broken" in line][0].startswith(f"problem {broken}:")


def test_a_piped_table_is_not_folded(tmp_path):
    assert omrl(["store", "init", str(tmp_path / "s")], tmp_path).returncode == 0
    result = omrl(["query", str(tmp_path / "s"), "SELECT repeat('a', 50) AS first, repeat('b', 50) AS second"],
                  tmp_path)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if "aaa" in line] == [f"│ {'a' * 50} │ {'b' * 50} │"]
