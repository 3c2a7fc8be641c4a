from __future__ import annotations

import pytest

from omrl.envs import make_env
from omrl.envs.base import Action, Task
from omrl.envs.http.env import EnvServerError
from omrl.envs.http.server import start_server
from omrl.envs.math import generate_tasks
from omrl.envs.toolenv import play_episode


@pytest.fixture
def math_server():
    tasks = generate_tasks(6, seed=11)
    httpd, url = start_server("math", tasks)
    yield url, tasks
    httpd.shutdown()
    httpd.server_close()


def test_expert_solves_math_through_the_agentgym_protocol(math_server):
    url, tasks = math_server
    env = make_env("http", base_url=url)
    for index, task in enumerate(tasks):
        first = env.reset(Task(id=str(index), instruction="", payload={"data_idx": index}))
        assert first.observation == task.instruction
        assert {t["function"]["name"] for t in first.tools} == {"calculator", "answer"}
        total, last, steps = play_episode(env, Task(id=str(index), instruction="", payload={"data_idx": index}))
        assert total == 1.0 and last.done and last.info["success"] and steps == 2
    env.close()


def test_tool_calls_and_invalid_text_travel_as_text(math_server):
    url, tasks = math_server
    env = make_env("http", base_url=url)
    env.reset(Task(id="0", instruction=""))  # numeric id = data_idx
    assert env.step(Action(tool="calculator", arguments={"expression": "6 * 7"})).observation == "42"
    bad = env.step(Action(text="no idea"))
    assert bad.info["invalid_action"] and not bad.done
    answer = env.step(Action(tool="answer", arguments={"value": tasks[0].answer}))
    assert answer.reward == 1.0 and answer.done
    env.close()


def test_server_errors_are_env_errors(math_server):
    url, _ = math_server
    env = make_env("http", base_url=url)
    with pytest.raises(EnvServerError, match="out of range"):
        env.reset(Task(id="99", instruction=""))
    with pytest.raises(ValueError, match="data_idx"):
        env.reset(Task(id="abc", instruction=""))
    env.close()


def test_unreachable_server_is_a_clear_error():
    httpd, url = start_server("math", generate_tasks(1))
    httpd.shutdown()
    httpd.server_close()
    with pytest.raises(EnvServerError, match="create failed"):
        make_env("http", base_url=url, timeout_s=2).reset(Task(id="0", instruction=""))


def test_server_close_closes_environments_left_open(tmp_path, monkeypatch):
    from omrl.tasks import generate_tasks as generate

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    httpd, url = start_server("code", generate("code")[:1])
    env = make_env("http", base_url=url)
    env.reset(Task(id="0", instruction=""))
    assert len(list(tmp_path.iterdir())) == 1  # the code env's project folder, on the server side
    httpd.shutdown()
    httpd.server_close()  # the client never sent /close
    assert list(tmp_path.iterdir()) == []


def test_unknown_environment_id_is_a_clear_404(math_server):
    import json
    import urllib.error
    import urllib.request

    url, _ = math_server
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{url}/observation?id=42", timeout=5)
    assert caught.value.code == 404 and "no environment with id 42" in json.loads(caught.value.read())["error"]
