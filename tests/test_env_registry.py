from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.envs import ENVIRONMENTS, EnvSpecError, describe, env_class, make_env, unavailable
from omrl.envs.base import Action, Environment, Task
from omrl.envs.swebench.env import SwebenchUnavailable
from omrl.tasks import load_tasks

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_envs.py").write_text(textwrap.dedent('''
        from omrl.envs.base import Reset, StepResult

        class EchoEnv:
            name = "echo"
            def __init__(self, suffix="!"):
                self.suffix = suffix
            def reset(self, task):
                return Reset(observation=task.instruction)
            def step(self, action):
                return StepResult(observation=action.text + self.suffix, reward=1.0, done=True)
            def close(self):
                pass

        class NotAnEnv:
            def reset(self, task):
                pass
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_envs", None)


@pytest.mark.slow
def test_every_builtin_env_loads_and_follows_the_protocol():
    for name in ENVIRONMENTS.builtins:
        assert describe(name) and not describe(name).startswith("(unavailable")
        if unavailable(env_class(name)):  # an extra not installed here (bfcl without bfcl-eval)
            continue
        options = {"base_url": "http://127.0.0.1:9"} if name == "http" else {}
        env = make_env(name, **options)
        try:
            assert isinstance(env, Environment) and env.name == name
        finally:
            env.close()  # engines (bfcl's process) go now, not at exit


def test_user_env_by_module_path(user_module):
    env = make_env("my_envs:EchoEnv", suffix="?")
    assert env.reset(Task(id="1", instruction="hi")).observation == "hi"
    assert env.step(Action(text="yo")).observation == "yo?"


def test_bad_specs_fail_clearly(user_module):
    with pytest.raises(EnvSpecError, match="lacks step, close"):
        make_env("my_envs:NotAnEnv")
    with pytest.raises(EnvSpecError, match="unknown environment 'nope'"):
        make_env("nope")
    with pytest.raises(EnvSpecError, match="has no .Missing."):
        make_env("my_envs:Missing")
    with pytest.raises(EnvSpecError, match="cannot import"):
        make_env("no_such_module_xyz:Env")
    with pytest.raises(EnvSpecError, match="options"):
        make_env("my_envs:EchoEnv", colour="red")


def test_swebench_without_docker_stops_clearly():
    task = Task(id="django__django-16255", instruction="fix it", env="swebench",
                payload={"repo": "django/django", "base_commit": "abc"})
    env = make_env("swebench", docker="/nonexistent/docker")
    with pytest.raises(SwebenchUnavailable, match="swebench tasks need Docker and its images; "):
        env.reset(task)
    assert env.image(task) == "swebench/sweb.eval.x86_64.django_1776_django-16255:latest"


@pytest.mark.skipif(not (REAL / "swe-bench-lite_5tasks.json").exists(), reason="shared real data absent")
def test_swebench_task_file_becomes_swebench_tasks():
    tasks = load_tasks(REAL / "swe-bench-lite_5tasks.json")
    assert len(tasks) == 5 and {t.env for t in tasks} == {"swebench"}
    assert tasks[0].id == "django__django-16255" and isinstance(tasks[0].payload["FAIL_TO_PASS"], list)
    assert tasks[0].answer.startswith("diff --git")


def test_envs_cli_lists_every_environment():
    result = CliRunner().invoke(cli, ["envs"])
    assert result.exit_code == 0, result.output
    for name in ENVIRONMENTS.builtins:
        assert name in result.output


def test_task_generation_is_part_of_the_environment_contract(tmp_path):
    from omrl.envs import generate_tasks, generator_names

    assert {"math", "shop", "code", "grid"} <= set(generator_names())
    train = generate_tasks("grid", n=20, seed=1, split="train")
    assert [t.to_row() for t in train] == [t.to_row() for t in generate_tasks("grid", n=20, seed=1, split="train")]
    held_out = generate_tasks("grid", n=20, seed=1, split="eval", walls=True)
    assert all(t.payload["walls"] for t in held_out)
    pairs = {(tuple(t.payload["start"]), tuple(t.payload["goal"])) for t in train}
    assert not pairs & {(tuple(t.payload["start"]), tuple(t.payload["goal"])) for t in held_out}
    with pytest.raises(EnvSpecError, match="splits train, eval, not 'test'"):
        generate_tasks("grid", n=2, split="test")
    with pytest.raises(EnvSpecError, match="no task generator"):
        generate_tasks("sql", n=2)
    with pytest.raises(EnvSpecError, match="options"):
        generate_tasks("grid", n=2, colour="red")


def test_tasks_generate_cli_takes_any_generating_env_and_its_options(tmp_path):
    out = tmp_path / "walls.jsonl"
    result = CliRunner().invoke(cli, ["tasks", "generate", "grid", "--n", "5", "--split", "eval",
                                      "--option", "walls=true", "--out", str(out)])
    assert result.exit_code == 0, result.output
    tasks = load_tasks(out)
    assert len(tasks) == 5 and all(t.split == "eval" and t.payload["walls"] for t in tasks)
    result = CliRunner().invoke(cli, ["tasks", "generate", "nosuch", "--out", str(out)])
    assert result.exit_code != 0 and "unknown environment 'nosuch'" in result.output


class UnavailableEnv:
    """Needs an engine this machine lacks."""

    @classmethod
    def unavailable(cls):
        return "needs the 'engine' extra: pip install 'omrl[engine]'"

    def reset(self, task): ...
    def step(self, action): ...
    def close(self): ...


def test_an_unavailable_environment_refuses_with_its_one_line_reason():
    with pytest.raises(EnvSpecError, match=r"cannot run here: needs the 'engine' extra"):
        make_env("tests.test_env_registry:UnavailableEnv")
