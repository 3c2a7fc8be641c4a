"""Plugins: environments, import and export formats, metrics and policies that an installed package registers through
entry points (omrl/plugins.py). In process: a real .dist-info folder on sys.path. End to end: the example
package under examples/ installed with pip into a fresh virtual environment, then used through the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from omrl import plugins
from omrl.annotate.metrics import load_metric
from omrl.envs import EnvSpecError, env_class, make_env, registry
from omrl.errors import UsageError
from omrl.formats import format_module, format_names
from omrl.formats.detect import detect_record
from omrl.policies import make_policy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "omrl-plugin-example"


@pytest.fixture
def installed_dist(tmp_path, monkeypatch):
    """A distribution `fake-plugin` as pip leaves one: a module and a .dist-info with entry_points.txt."""
    (tmp_path / "fake_plugin.py").write_text(textwrap.dedent('''
        from omrl.envs.base import Reset, StepResult

        class OneStepEnv:
            name = "one-step"
            def reset(self, task):
                return Reset(observation="go")
            def step(self, action):
                return StepResult(observation="done", reward=1.0, done=True)
            def close(self):
                pass

        def loud(messages):
            return 1.0

        def convert(record, ctx):
            raise ValueError("not used")

        def detect(record):
            return isinstance(record, dict) and "fake_log" in record

        def policy(arg, **options):
            return ("policy", arg, options)

        def export_records(rows):
            return ({"task": row["task_id"], "won": row["success"]} for row in rows)
    '''))
    info = tmp_path / "fake_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent('''
        [omrl.envs]
        one-step = fake_plugin:OneStepEnv
        math = fake_plugin:OneStepEnv
        broken = fake_plugin_missing:Env
        [omrl.metrics]
        loud = fake_plugin:loud
        [omrl.formats]
        fake-log = fake_plugin
        [omrl.exporters]
        fake-export = fake_plugin:export_records
        openai = fake_plugin:export_records
        [omrl.policies]
        fake = fake_plugin:policy
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.entry_points.cache_clear()
    yield
    plugins.entry_points.cache_clear()
    sys.modules.pop("fake_plugin", None)


def test_each_kind_finds_what_an_installed_package_registers(installed_dist):
    entries = registry()
    assert entries["one-step"].provider == "fake-plugin" and entries["math"].provider == "omrl"  # no override
    assert env_class("math").__name__ == "MathEnv"
    assert make_env("one-step").reset(None).observation == "go"
    with pytest.raises(EnvSpecError, match=r"environment 'broken' \(from package fake-plugin\)"):
        make_env("broken")

    metric = load_metric("loud")
    assert metric.name == "loud" and metric.fn([]) == 1.0
    assert "fake-log" in format_names() and format_module("fake-log").detect({"fake_log": 1})
    assert detect_record({"fake_log": 1}) == "fake-log" and detect_record({"messages": []}) == "openai"
    assert make_policy("fake:abc", retries=2) == ("policy", "abc", {"retries": 2})
    with pytest.raises(UsageError, match="unknown policy 'nope'.*fake"):
        make_policy("nope")
    with pytest.raises(UsageError, match="unknown metric 'nope'.*loud"):
        load_metric("nope")



def test_every_named_kind_is_one_registry_and_the_unpluggable_ones_take_no_plugins(installed_dist):
    """Environments, formats, metrics, policies, judge modes and CLI verbs: one Registry shape each."""
    from omrl.annotate.judge import JUDGE_MODES, JudgeConfig, JudgeMode, judge_mode
    from omrl.annotate.metrics import METRICS
    from omrl.annotate.rubric import Rubric
    from omrl.cli.main import COMMANDS
    from omrl.envs import ENVIRONMENTS
    from omrl.formats import EXPORTERS, FORMATS
    from omrl.policies import POLICIES

    kinds = [ENVIRONMENTS, FORMATS, EXPORTERS, METRICS, POLICIES, JUDGE_MODES, COMMANDS]
    assert all(isinstance(kind, plugins.Registry) for kind in kinds)
    assert plugins.registries() == kinds[:5]  # the pluggable ones, as `omrl plugins` lists them
    assert FORMATS.plugin_names() == ["fake-log"] and METRICS.plugin_names() == ["loud"]
    for name in METRICS.builtins:  # a built-in is loaded from its target, as a plugin is
        assert load_metric(name).fn is getattr(sys.modules["omrl.annotate.metrics"], name)
    for name in JUDGE_MODES.builtins:
        mode = judge_mode(name)
        assert isinstance(mode, JudgeMode) and mode.name == name
    assert [judge_mode(m).together for m in JUDGE_MODES.builtins] == [None, "task_id", "group_id"]
    assert all(entry.summary for entry in COMMANDS.builtins.values())  # `omrl --help` imports no verb
    for kind in (JUDGE_MODES, COMMANDS):  # no entry-point group: only omrl provides them
        assert kind.group is None and kind.plugin_names() == []
    with pytest.raises(UsageError, match="judge mode must be one of pointwise, pairwise, group, got 'best'"):
        JudgeConfig(rubric=Rubric(name="r", criteria=["c"]), model="m", base_url="http://x", mode="best")
    with pytest.raises(UsageError, match="unknown judge mode 'best'"):
        judge_mode("best")


def test_omrl_export_writes_a_plugin_format_and_a_plugin_never_replaces_a_built_in(installed_dist, tmp_path):
    """An exporter registered under omrl.exporters is one of `omrl export`'s formats; the built-ins load from
    their targets the same way, and a plugin's `openai` stays behind the built-in one."""
    from click.testing import CliRunner
    from conftest import make_trajectory

    from omrl.cli.main import cli
    from omrl.formats import EXPORTERS
    from omrl.formats import exporters as builtin
    from omrl.store import Store

    assert EXPORTERS.plugin_names() == ["fake-export"] and EXPORTERS.get("openai").provider == "omrl"
    assert EXPORTERS.load("openai") is builtin.openai_records and "fake-export" in builtin.export_formats()
    store = Store.create(tmp_path / "s")
    store.append([make_trajectory(i, success=i == 0).to_row() for i in range(2)])
    for fmt, name in (("fake-export", "fake.jsonl"), ("openai", "openai.jsonl")):
        result = CliRunner().invoke(cli, ["export", str(store.path), "--out", str(tmp_path / name), "--format", fmt])
        assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (tmp_path / "fake.jsonl").read_text().splitlines()]
    assert sorted(lines, key=lambda r: r["task"]) == [{"task": "task-0", "won": True}, {"task": "task-1", "won": False}]
    assert all("messages" in json.loads(line) for line in (tmp_path / "openai.jsonl").read_text().splitlines())
    unknown = CliRunner().invoke(cli, ["export", str(store.path), "--out", str(tmp_path / "x.jsonl"), "--format", "nope"])
    assert unknown.exit_code != 0 and "unknown export format 'nope'" in unknown.output and "fake-export" in unknown.output


@pytest.fixture
def broken_plugins(tmp_path, monkeypatch):
    """Packages as pip leaves them: `mixed-plugin`, whose plugins fail in every way a package's code can (a
    module raising at import, an environment whose unavailable() raises, a detect() and a policy factory
    that raise) beside good ones; `malformed`, whose entry_points.txt cannot be parsed; and `undecodable`,
    whose METADATA is not UTF-8."""
    (tmp_path / "boom_module.py").write_text('raise RuntimeError("boom at import")\n')
    (tmp_path / "mixed_plugin.py").write_text(textwrap.dedent('''
        from omrl.envs.base import Reset, StepResult

        class GoodEnv:
            """A good plugin environment."""
            def reset(self, task):
                return Reset(observation="go")
            def step(self, action):
                return StepResult(observation="done", reward=1.0, done=True)
            def close(self):
                pass

        class BadCheckEnv(GoodEnv):
            """Its check fails."""
            @classmethod
            def unavailable(cls):
                raise KeyError("no config file")

        def convert(record, ctx):
            raise ValueError("not used")

        def detect(record):
            raise TypeError("detect broke")

        def policy(arg, **options):
            raise RuntimeError("factory broke")
    '''))
    (tmp_path / "good_format.py").write_text("def convert(record, ctx):\n    raise ValueError('not used')\n"
                                             "def detect(record):\n    return 'good_log' in record\n")
    for name, points in [("mixed_plugin", """
        [omrl.envs]
        boom = boom_module:Env
        bad-check = mixed_plugin:BadCheckEnv
        good = mixed_plugin:GoodEnv
        [omrl.formats]
        bad-detect = mixed_plugin
        boom-format = boom_module
        good-log = good_format
        [omrl.policies]
        bad-factory = mixed_plugin:policy
    """), ("malformed", "[omrl.envs]\nthis line has no equals sign\n")]:
        info = tmp_path / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(textwrap.dedent(points))
    undecodable = tmp_path / "undecodable-1.0.dist-info"
    undecodable.mkdir()
    (undecodable / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: caf\xe9\nVersion: 1.0\n")
    (undecodable / "entry_points.txt").write_text("[omrl.envs]\nz = mixed_plugin:GoodEnv\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.entry_points.cache_clear()
    yield tmp_path
    plugins.entry_points.cache_clear()
    for module in ("mixed_plugin", "good_format", "boom_module"):
        sys.modules.pop(module, None)


def test_omrl_envs_names_each_broken_plugin_in_one_line_and_lists_the_rest(broken_plugins):
    from click.testing import CliRunner

    from omrl.cli.main import cli
    from omrl.envs import ENVIRONMENTS

    result = CliRunner().invoke(cli, ["envs"], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "good" in result.stdout and "A good plugin environment" in result.stdout
    assert all(name in result.stdout for name in ENVIRONMENTS.builtins)
    lines = result.stderr.splitlines()
    assert len(lines) == 4, result.stderr  # one line for each broken package or plugin, nothing else
    packages = sorted(line for line in lines if line.startswith("warning: skipping the installed package"))
    unreadable = "warning: skipping the installed package at {}: its metadata or entry points cannot be read: {}"
    assert len(packages) == 2 and packages[0].startswith(unreadable.format(
        broken_plugins / "malformed-1.0.dist-info", "TypeError: ")) and packages[1].startswith(unreadable.format(
            broken_plugins / "undecodable-1.0.dist-info", "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9"))
    assert sorted(line for line in lines if line.startswith("warning: skipping plugin")) == [
        "warning: skipping plugin environment 'bad-check' (package mixed-plugin, entry point \"bad-check = "
        "mixed_plugin:BadCheckEnv\" in omrl.envs): KeyError: 'no config file'",
        "warning: skipping plugin environment 'boom' (package mixed-plugin, entry point \"boom = boom_module:Env\" "
        "in omrl.envs): RuntimeError: boom at import",
    ], result.stderr
    assert "boom" not in result.stdout and "bad-check" not in result.stdout


@pytest.mark.filterwarnings("ignore::omrl.plugins.PluginWarning")  # the unreadable packages: tested above
def test_a_broken_plugin_asked_for_by_name_is_one_error_line(broken_plugins):
    with pytest.raises(EnvSpecError, match=r"^cannot import 'boom_module' for environment 'boom' \(from package "
                                           r"mixed-plugin\): RuntimeError: boom at import$"):
        make_env("boom")
    assert make_env("good").reset(None).observation == "go"
    with pytest.raises(UsageError, match=r"^policy 'bad-factory' \(package mixed-plugin, entry point \"bad-factory = "
                                         r"mixed_plugin:policy\" in omrl.policies\) failed: RuntimeError: factory broke$"):
        make_policy("bad-factory:x")
    with pytest.raises(UsageError, match=r"cannot import 'boom_module' for format 'boom-format'.*RuntimeError"):
        format_module("boom-format")


def test_format_detection_skips_a_plugin_whose_import_or_detect_fails(broken_plugins):
    with pytest.warns(plugins.PluginWarning) as caught:
        assert detect_record({"good_log": 1}) == "good-log"
    assert sorted(str(w.message) for w in caught if "installed package at" not in str(w.message)) == [
        "skipping plugin format 'bad-detect' (package mixed-plugin, entry point \"bad-detect = mixed_plugin\" in "
        "omrl.formats): TypeError: detect broke",
        "skipping plugin format 'boom-format' (package mixed-plugin, entry point \"boom-format = boom_module\" in "
        "omrl.formats): RuntimeError: boom at import"]
    assert detect_record({"messages": []}) == "openai"  # built-ins never ask the plugins


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _run(args: list[str], cwd: Path, timeout: int = 180) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, args))}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.slow
def test_the_example_plugin_installs_into_a_fresh_venv_and_collects(tmp_path):
    pytest.importorskip("setuptools", minversion="77")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path)
                .strip())
    # omrl from this checkout, its dependencies from this environment (paths only: no network, no build).
    paths = [str(ROOT), *dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])]
    (site / "_omrl_checkout.pth").write_text("".join(f"{p}\n" for p in paths))
    source = tmp_path / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-build-isolation",
          "-q", str(source)], tmp_path, timeout=300)

    omrl = [str(python), "-m", "omrl"]
    listed = _run([*omrl, "plugins"], tmp_path)
    for group, name in [("omrl.envs", "echo-word"), ("omrl.formats", "qa-log"), ("omrl.exporters", "qa-log"),
                        ("omrl.metrics", "shouting"), ("omrl.policies", "parrot")]:
        assert any(group in line and name in line and "omrl-plugin-example" in line
                   for line in listed.splitlines()), listed
    assert "echo-word" in _run([*omrl, "envs", "list"], tmp_path)

    _run([*omrl, "tasks", "generate", "echo-word", "--n", "6", "--split", "test", "--out", "echo.jsonl"], tmp_path)
    out = _run([*omrl, "collect", "--env", "echo-word", "--tasks", "echo.jsonl", "--policy", "parrot",
                "--store", "store", "--no-progress"], tmp_path)
    assert "6 written to store" in out and "success 100.0%" in out, out
    out = _run([*omrl, "collect", "--env", "echo-word", "--tasks", "echo.jsonl", "--policy", "parrot:X",
                "--store", "store", "--no-progress"], tmp_path)
    assert "6 written to store" in out and "success 0.0%" in out, out
    _run([*omrl, "annotate", "store", "--metric", "shouting"], tmp_path)
    qa = [{"question": "2+2?", "answer": "FOUR", "correct": True}, {"question": "3+3?", "answer": "7", "correct": False}]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in qa))
    _run([*omrl, "import", "qa.jsonl", "--store", "store"], tmp_path)  # detected by the plugin's detect()
    _run([*omrl, "export", "store", "--out", "back.jsonl", "--format", "qa-log", "--where", "env = 'import:qa-log'"],
         tmp_path)  # the plugin's exporter
    assert sorted(_lines((tmp_path / "back.jsonl").read_text()), key=lambda r: r["question"]) == qa
    rows = _lines(_run([*omrl, "query", "store", "--format", "json",
                            "SELECT env, count(*) AS n, round(avg(reward), 2) AS reward FROM trajectories "
                            "GROUP BY env ORDER BY env"], tmp_path))
    assert rows == [{"env": "echo-word", "n": 12, "reward": 0.5}, {"env": "import:qa-log", "n": 2, "reward": 0.5}]
    scores = _lines(_run([*omrl, "query", "store", "--format", "json",
                          "SELECT t.success, min(a.score) AS low, max(a.score) AS high, count(*) AS n FROM annotations a "
                          "JOIN trajectories t ON t.id = a.trajectory_id WHERE a.annotator = 'shouting' GROUP BY 1 "
                          "ORDER BY 1"], tmp_path))
    # "Xapple": one capital in 6 letters (words have 5-7 letters); the plain words: none.
    assert [(s["success"], s["n"]) for s in scores] == [(False, 6), (True, 6)], scores
    assert 1 / 8 <= scores[0]["low"] <= scores[0]["high"] <= 1 / 6 and scores[1]["high"] == 0.0, scores
