"""The trajectory page as a user reads it: the conversation first (metadata folded), each environment's own
view (omrl.view.env_views) on hand-made rows shaped like what the environments store, hostile text in every
field rendered as text; and the runs page keeping the expert's demonstrations apart from the policy's rounds."""

from __future__ import annotations

import json
import re

import pytest

try:
    from starlette.testclient import TestClient
except (ImportError, RuntimeError) as exc:
    pytest.skip(f"omrl view tests need starlette and httpx: {exc}", allow_module_level=True)

from omrl.store import Store  # noqa: E402
from omrl.testing.synthetic import synthetic_trajectories  # noqa: E402
from omrl.view.app import make_app  # noqa: E402
from omrl.view.env_views import RENDERERS, env_view  # noqa: E402

XSS = "<script>window.__omrl_xss = 1</script>"
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def _call(cid: str, name: str, arguments: dict) -> dict:
    return {"id": cid, "name": name, "arguments": json.dumps(arguments)}


def _turn(index: int, info: dict, reward: float = 0.0) -> dict:
    return {"index": index, "reward": reward, "done": False, "latency_s": 0.1, "prompt_tokens": 1,
            "completion_tokens": 1, "info": json.dumps(info)}


def _tool_episode(calls: list[tuple[str, dict, str, dict]], opening: str = "Task: " + XSS) -> tuple[list, list]:
    """(messages, turns) of an episode of one tool call per turn: (name, arguments, observation, info)."""
    messages = [{"role": "system", "content": "system " + XSS}, {"role": "user", "content": opening}]
    turns = []
    for k, (name, arguments, observation, info) in enumerate(calls):
        messages.append({"role": "assistant", "content": "", "tool_calls": [_call(f"c{k}", name, arguments)]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "name": name, "content": observation})
        turns.append(_turn(k, info, reward=1.0 if k == len(calls) - 1 else 0.0))
    return messages, turns


def hostile_rows() -> dict[str, dict]:
    """One row per environment with a renderer, `<script>` in every text its view shows."""
    game = _tool_episode([("act", {"command": "open " + XSS}, "The door opens. " + XSS,
                           {"command": "open " + XSS, "score": 3, "max_score": 8, "note": "score 3/8 " + XSS}),
                          ("act", {"command": "go north"}, "North. " + XSS, {"command": "go north", "score": 5,
                                                                             "max_score": 8})])
    sw = _tool_episode([("act", {"command": "look " + XSS}, "A room. " + XSS, {"command": "look " + XSS,
                                                                            "score": 10, "moves": 1})])
    bfcl_messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "make a file " + XSS},
                     {"role": "assistant", "content": "", "tool_calls": [_call("c0", "touch", {"file_name": XSS})]},
                     {"role": "tool", "tool_call_id": "c0", "name": "touch", "content": "None " + XSS},
                     {"role": "assistant", "content": "Done " + XSS},
                     {"role": "user", "content": "now list " + XSS},
                     {"role": "assistant", "content": "", "tool_calls": [_call("c1", "ls", {})]},
                     {"role": "tool", "tool_call_id": "c1", "name": "ls", "content": "{\"current_directory_content\": []}"},
                     {"role": "assistant", "content": "Listed."}]
    bfcl_turns = [_turn(0, {"bfcl_turn": 0}),
                  _turn(1, {"turn_valid": True, "bfcl_turn": 0, "note": "user turn 0: passed " + XSS}),
                  _turn(2, {"bfcl_turn": 1}),
                  _turn(3, {"turn_valid": False, "bfcl_turn": 1, "note": "user turn 1: failed",
                            "error_type": "multi_turn:instance_state_mismatch", "error_message": "state " + XSS})]
    web = _tool_episode([("click", {"ref": 1}, "Done: clicked " + XSS, {"screenshot": PNG, "note": "reward " + XSS}),
                         ("click", {"ref": 2}, "again", {"screenshot": 'data:image/png;base64,AA" onerror="alert(1)'}),
                         ("click", {"ref": 3}, "svg", {"screenshot": "data:image/svg+xml;base64,PHN2Zz4="})])
    patch = f"diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-old = 1\n+new = '{XSS}'\n"
    swe = _tool_episode([("str_replace", {"path": "x.py"}, "Edited " + XSS, {}),
                         ("submit", {}, "Submitted. " + XSS,
                          {"success": True, "resolved": True, "fail_to_pass": "1/1", "pass_to_pass": "3/3",
                           "patch_applied": True, "model_patch": patch, "report_error": XSS})])
    shell = _tool_episode([("bash", {"command": "echo " + XSS}, XSS + "\n", {"returncode": 0, "timed_out": False}),
                           ("bash", {"command": "false"}, "(exit status 1)", {"returncode": 1}),
                           ("answer", {"answer": XSS}, "Wrong.", {"success": False, "expected": "38 " + XSS,
                                                                  "checker": "integer-match.py"})])
    episodes = {"textworld": game, "twx": game, "scienceworld": sw, "bfcl": (bfcl_messages, bfcl_turns),
                "miniwob": web, "swe": swe, "os": shell}
    base = next(synthetic_trajectories(1, seed=5))
    rows = {}
    for env, (messages, turns) in episodes.items():
        rows[env] = dict(base, id=f"env-{env}", env=env, group_id=f"g-{env}", messages=messages, turns=turns,
                         num_turns=len(turns), task_id=f"{env} task {XSS}", metadata=json.dumps({"n": XSS}))
    return rows


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    store = Store.create(tmp_path_factory.mktemp("view-envs") / "store")
    rows = hostile_rows()
    plain = next(synthetic_trajectories(1, seed=6))
    store.append(list(rows.values()) + [dict(plain, id="plain", env="math")])
    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        yield c


def _no_markup_from_the_store(page: str) -> None:
    assert "<script>window" not in page and 'onerror="' not in page
    assert all(re.fullmatch(r'<script src="[^"]*view\.js" defer>', s) for s in re.findall(r"<script[^>]*>", page))


def test_every_renderer_is_tested_here():
    assert set(RENDERERS) == set(hostile_rows())


def test_the_page_opens_on_the_conversation_with_metadata_folded(client):
    page = client.get("/t/plain").text
    assert env_view({"env": "math"}) is None  # no renderer: the chat view alone
    assert 'id="env-view"' not in page
    folded = re.search(r'<details class="meta" id="metadata">(.*?)</details>', page, re.S)
    assert folded and 'class="fields"' in folded.group(1) and ">run_id<" in folded.group(1)
    assert page.index('id="thread"') < page.index('id="lineage"') < page.index('id="payload"')
    assert 'id="group-link"' in page[: page.index('id="metadata"')]  # the way to the group stays one click


@pytest.mark.parametrize("env", sorted(RENDERERS))
def test_each_renderer_shows_stored_text_as_text(client, env):
    page = client.get(f"/t/env-{env}").text
    _no_markup_from_the_store(page)
    view = re.search(r'<section class="env-view[^"]*" id="env-view">.*?(?=<section id="thread">)', page, re.S)
    assert view, "the environment's view is missing"
    assert "&lt;script&gt;window.__omrl_xss = 1&lt;/script&gt;" in view.group(0)
    assert page.index('id="env-view"') < page.index('id="thread"')


def test_text_games_show_a_transcript_with_the_score(client):
    page = client.get("/t/env-textworld").text
    table = re.search(r'<table class="list transcript" id="transcript">.*?</table>', page, re.S).group(0)
    assert '<th class="score">score</th>' in table
    scores = re.findall(r'<td class="num score">([^<]*)</td>', table)
    assert scores == ["3/8", "5/8"]
    assert "&gt; go north" in table and "North." in table
    assert re.findall(r'<td class="num score">([^<]*)</td>', client.get("/t/env-scienceworld").text) == ["10"]


def test_bfcl_shows_calls_results_and_the_verdict_per_user_turn(client):
    page = client.get("/t/env-bfcl").text
    turns = re.findall(r'<section class="user-turn">(.*?)</section>', page, re.S)
    assert len(turns) == 2
    assert 'class="verdict pass">passed' in turns[0] and "touch(" in turns[0] and "→ None" in turns[0]
    assert 'class="verdict fail">failed' in turns[1] and "multi_turn:instance_state_mismatch" in turns[1]
    assert "ls({})" in turns[1] and "current_directory_content" in turns[1]


def test_miniwob_shows_only_png_data_urls_as_images(client):
    page = client.get("/t/env-miniwob").text
    images = re.findall(r'<img class="screenshot" src="([^"]*)"', page)
    assert images == [PNG]  # the one that closes the attribute and the SVG are not shown
    assert len(re.findall(r'<li class="web-action">', page)) == 3


def test_swe_shows_the_diff_and_the_test_results(client):
    page = client.get("/t/env-swe").text
    assert 'id="swe-verdict">resolved' in page
    results = re.search(r'<table class="fields test-results" id="test-results">.*?</table>', page, re.S).group(0)
    assert "<th>fail_to_pass</th><td>1/1</td>" in results and "<th>pass_to_pass</th><td>3/3</td>" in results
    diff = re.search(r'<pre class="diff" id="diff-block">.*?</pre>', page, re.S).group(0)
    assert '<span class="d-del">-old = 1</span>' in diff and '<span class="d-add">+new = ' in diff


def test_os_shows_the_shell_session_as_a_terminal(client):
    page = client.get("/t/env-os").text
    terminal = re.search(r'<div class="terminal" id="terminal">.*?</div>\s*</section>', page, re.S).group(0)
    assert terminal.count('class="term-cmd"') == 2 and "root@sandbox:~#</span> false" in terminal
    assert "(exit status 1)" in terminal and "answer:</span>" in terminal and "checker integer-match.py" in terminal


def test_runs_page_keeps_expert_demos_out_of_round_zero(tmp_path):
    """The demos stage's rows (run 'demos', the scripted policy) are their own bar and rows, so round 0 is the
    policy's own: an untrained base at 0 %, not the expert's 100 % mixed in."""
    rows = list(synthetic_trajectories(12, seed=7))
    for i, row in enumerate(rows):
        if i < 4:
            row.update(run_id="demos", model="scripted", round=0, success=True, reward=1.0, status="ok")
        elif i < 8:
            row.update(run_id="eval-base", model="tiny", round=0, success=False, reward=0.0, status="ok")
        else:
            row.update(run_id="round-1", model="tiny", round=1, success=i % 2 == 0, reward=0.5, status="ok")
    store = Store.create(tmp_path / "store")
    store.append(rows)
    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        page = c.get("/runs").text
    svg = re.search(r'<svg class="chart" id="chart-success".*?</svg>', page, re.S).group(0)
    labels = re.findall(r'class="lbl">([^<]*)<', svg)
    values = re.findall(r'class="val">([^<]*)<', svg)
    assert labels == ["expert", "0", "1"] and values == ["1", "0", "0.5"]
    assert svg.count('class="bar expert"') == 1
    table = re.search(r'<table class="list" id="rounds">.*?</table>', page, re.S).group(0)
    assert re.search(r'<tr class="expert"><td>demos</td><td class="num">expert</td><td class="num">4</td>', table)
    assert 'id="expert-note"' in page


@pytest.mark.parametrize("env", sorted(RENDERERS))
def test_renderers_take_malformed_rows(env):
    """Invalid JSON in arguments and info, missing ids, a tool result without its call: a view, not a crash."""
    row = {"env": env, "messages": [
        {"role": "user", "content": None},
        {"role": "assistant", "content": None, "tool_calls": [{"name": "act", "arguments": "[1, 2"}, {"name": None}]},
        {"role": "tool", "content": None},
        {"role": "assistant", "content": "plain"},
        {"role": "tool", "tool_call_id": "nowhere", "content": "orphan"}],
        "turns": [{"index": 0, "info": "{not json"}, {"index": 1, "info": json.dumps({"steps": "x", "score": None,
                                                                                   "model_patch": None})}]}
    view = env_view(row)
    assert view is not None and view["kind"]
    assert env_view(dict(row, messages=None, turns=None))["kind"] == view["kind"]
