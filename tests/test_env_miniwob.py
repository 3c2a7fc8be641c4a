"""`miniwob`: MiniWoB++ pages in a real headless Chromium (Debian's chromium + chromedriver).

What the agent sees matches the page (hidden elements are not offered, what is offered exists and can be
used), MiniWoB's own rewards, the scripted expert, tasks by seed, no network, screenshots, a crashed
browser stored as env_error and replaced, and no browser or driver process left after collect ends or is
killed with SIGKILL. A few tasks and seeds only: the 50-seed figures are benchmarks/expert_success.py and collect_leftovers.py.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import os
import socket
import struct
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from omrl.envs.base import Action
from tests.engine_helpers import KillingPolicy, kill_collect_mid_run, marked_processes, require_env

require_env("miniwob")

from omrl.envs.miniwob import MiniWoBEnv  # noqa: E402
from omrl.envs.miniwob.page import read_page  # noqa: E402
from omrl.envs.toolenv import play_episode  # noqa: E402
from omrl.tasks import load_tasks  # noqa: E402

pytestmark = pytest.mark.slow  # a real browser per environment

ROOT = Path(__file__).resolve().parents[1]
SOLVED = ["click-button", "enter-text", "click-checkboxes", "choose-list"]


@pytest.fixture(scope="module")
def tasks():
    """Two test-split seeds of each of a few tasks (one browser reads their utterances)."""
    return MiniWoBEnv.generate_tasks(2 * len(SOLVED), seed=7, split="test", tasks=",".join(SOLVED))


@pytest.fixture(scope="module")
def env():
    environment = MiniWoBEnv()
    yield environment
    environment.close()


def task_of(tasks, name: str, k: int = 0):
    return [t for t in tasks if t.payload["task"] == name][k]


HIDDEN = """
const area = document.getElementById('area');
area.insertAdjacentHTML('beforeend',
  '<button style="display:none">hidden-display</button>' +
  '<button style="visibility:hidden">hidden-visibility</button>' +
  '<div style="opacity:0"><button>hidden-opacity</button></div>' +
  '<div style="display:none"><span>hidden-parent</span><input value="hidden-input"></div>' +
  '<button style="width:0;height:0;padding:0;border:0;overflow:hidden">hidden-size</button>' +
  '<div style="visibility:hidden"><span style="visibility:visible">shown-again</span></div>' +
  '<button id="extra">shown-extra</button>');
"""


def test_the_agent_sees_what_the_page_shows(env, tasks):
    from selenium.webdriver.common.by import By

    first = env.reset(task_of(tasks, "click-checkboxes"))
    assert first.observation.startswith(f"Task: {task_of(tasks, 'click-checkboxes').instruction}\n")
    driver = env.engine.driver
    driver.execute_script(HIDDEN)
    page = read_page(driver)
    text = page.render()
    assert "hidden" not in text and "shown-extra" in text and "shown-again" in text

    # Every element offered exists, is displayed, and shows the text, value and state the agent reads.
    for element in page.elements:
        found = driver.find_elements(By.CSS_SELECTOR, f'[data-omrl-ref="{element.ref}"]')
        assert len(found) == 1, element
        node = found[0]
        assert node.is_displayed(), element
        assert node.tag_name.lower() == element.tag
        if element.text:
            assert element.text in " ".join(node.text.split()), (element, node.text)
        if element.value is not None and element.tag != "select":
            assert node.get_property("value") == element.value
        if element.checked is not None:
            assert node.is_selected() == element.checked
    # ... and every displayed control of the page is offered.
    controls = [n for n in driver.find_elements(By.CSS_SELECTOR, "#area input, #area button, #area label")
                if n.is_displayed()]
    assert {n.get_attribute("data-omrl-ref") for n in controls} <= {str(e.ref) for e in page.elements}
    assert len(controls) == sum(e.tag in ("input", "button", "label") for e in page.elements)

    # Refs stay put while the episode lasts: checking a box keeps every ref and flips only its state.
    box = next(e for e in page.elements if e.tag == "input")
    after = env.step(Action(tool="click", arguments={"ref": box.ref}))
    assert not after.done and f"[{box.ref}] input checkbox checked" in after.observation
    assert [e.ref for e in env.page.elements] == [e.ref for e in page.elements]


def test_the_same_seed_gives_the_same_page_and_refs(env, tasks):
    task = task_of(tasks, "click-checkboxes", 1)
    first = env.reset(task).observation
    env.step(Action(tool="click", arguments={"ref": env.page.elements[-1].ref}))  # a move, then again
    assert env.reset(task).observation == first
    assert "(The task file's instruction was" not in first  # the utterance generation read is the page's


def test_the_scripted_expert_solves_its_tasks_and_random_does_worse(env, tasks):
    import random

    expert = [play_episode(env, task, max_steps=12)[1] for task in tasks]
    assert all(last.done and last.info["success"] for last in expert), [last.observation for last in expert]
    assert all(0 < last.reward <= 1 and last.info["raw_reward"] == 1.0 for last in expert)
    rng = random.Random(0)
    randoms = [play_episode(env, task, max_steps=12, rng=rng)[1] for task in tasks[: len(SOLVED)]]
    assert sum(bool(last.info.get("success")) for last in randoms) < len(SOLVED)


def test_a_wrong_answer_and_a_timeout_are_minus_one(env, tasks):
    env.reset(task_of(tasks, "click-button"))
    target = task_of(tasks, "click-button").instruction.split('"')[1]
    wrong = next(e for e in env.page.elements if e.tag == "button" and e.text != target)
    result = env.step(Action(tool="click", arguments={"ref": wrong.ref}))
    assert result.done and result.reward == -1.0 and result.info == {
        "success": False, "raw_reward": -1.0, "reason": None, "note": "MiniWoB reward -1.00 (raw -1, failed)"}
    assert "episode is over" in env.step(Action(tool="click", arguments={"ref": wrong.ref})).observation

    env.time_limit_s = 0.3  # MiniWoB's own timer, shortened
    try:
        env.reset(task_of(tasks, "enter-text"))
        time.sleep(0.8)
        box = next(e for e in env.page.elements if e.tag == "input")
        late = env.step(Action(tool="type", arguments={"ref": box.ref, "text": "x"}))
    finally:
        env.time_limit_s = None
    assert late.done and late.reward == -1.0 and late.info["reason"] == "timed out"
    assert "already ended before this action" in late.observation


COVER = """
const target = document.querySelector('[data-omrl-ref="' + arguments[0] + '"]'), r = target.getBoundingClientRect();
let cover = document.getElementById('cover');
if (!cover) { cover = document.createElement('div'); cover.id = 'cover'; document.body.appendChild(cover); }
cover.setAttribute('style', 'position:fixed; z-index:9; background:red; left:' + r.left + 'px; top:' + r.top +
                   'px; height:' + r.height + 'px; width:' + (r.width * arguments[1]) + 'px');
"""


def test_a_covered_element_is_clicked_where_it_shows(env, tasks):
    task = task_of(tasks, "click-button")
    env.reset(task)
    target = next(e for e in env.page.elements if e.tag == "button" and e.text == task.instruction.split('"')[1])
    env.engine.driver.execute_script(COVER, target.ref, 1.0)  # all of it hidden behind another element
    covered = env.step(Action(tool="click", arguments={"ref": target.ref}))
    assert covered.info.get("invalid_action") and "covered by another element" in covered.observation
    env.engine.driver.execute_script(COVER, target.ref, 0.6)  # its centre hidden, its right part shows
    clicked = env.step(Action(tool="click", arguments={"ref": target.ref}))
    assert clicked.done and clicked.info["success"], clicked.observation


def test_invalid_actions_are_observations(env, tasks):
    env.reset(task_of(tasks, "choose-list"))
    menu = next(e for e in env.page.elements if e.tag == "select")
    button = next(e for e in env.page.elements if e.tag == "button")
    cases = [
        (Action(tool="click", arguments={"ref": 999}), "no element [999]"),
        (Action(tool="click", arguments={"ref": "the button"}), "ref must be the number"),
        (Action(tool="press", arguments={"key": "Hyper+x"}), "not a modifier"),
        (Action(tool="press", arguments={"key": "Launch"}), "unknown key"),
        (Action(tool="select", arguments={"ref": button.ref, "option": "x"}), "not a select"),
        (Action(tool="select", arguments={"ref": menu.ref, "option": "Nowhere"}), "has no option"),
        (Action(tool="scroll", arguments={"direction": "sideways"}), "up' or 'down"),
        (Action(tool="hover", arguments={"ref": 1}), "Unknown tool"),
        (Action(text="click[abc]"), "ref must be the number"),
    ]
    for action, message in cases:
        result = env.step(action)
        assert result.info.get("invalid_action") and message in result.observation, (action, result.observation)
        assert not result.done
    assert env.step(Action(text=f"click[{menu.ref}]")).info.get("invalid_action") is None  # text form works


def test_no_network_beyond_the_task_pages(env, tasks):
    requests: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"reached")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        env.reset(task_of(tasks, "click-button"))
        outcomes = env.engine.driver.execute_async_script("""
            const done = arguments[arguments.length - 1], port = arguments[0], out = {};
            const tries = [
              ['loopback', 'http://127.0.0.1:' + port + '/fetch'],
              ['localhost', 'http://localhost:' + port + '/fetch'],
              ['internet', 'https://example.com/'],
            ].map(([name, url]) => fetch(url, {mode: 'no-cors'}).then(r => { out[name] = 'reached'; },
                                                                   e => { out[name] = 'failed'; }));
            const img = new Image(); img.src = 'http://127.0.0.1:' + port + '/img';
            try { new WebSocket('ws://127.0.0.1:' + port + '/ws'); } catch (e) {}
            Promise.all(tries).then(() => setTimeout(() => done(out), 1000));
        """, port)
    finally:
        server.shutdown()
        server.server_close()
    assert outcomes == {"loopback": "failed", "localhost": "failed", "internet": "failed"}
    assert requests == []  # nothing reached the local server either (image, WebSocket); without the
    # browser's proxy flags the loopback fetch and the image do arrive (checked by hand)


WEBRTC_STUN = """
const done = arguments[arguments.length - 1], port = arguments[0], candidates = [];
const peer = new RTCPeerConnection({iceServers: [{urls: 'stun:127.0.0.1:' + port}]});
peer.onicecandidate = event => { if (event.candidate) candidates.push(event.candidate.candidate); };
peer.createDataChannel('probe');  // something to negotiate: ICE gathering (and the STUN request) starts
peer.createOffer().then(offer => peer.setLocalDescription(offer))
  .then(() => setTimeout(() => { peer.close(); done(candidates); }, 3000), error => done(['failed: ' + error]));
"""


def test_webrtc_sends_no_udp_past_the_network_cut(env, tasks):
    """A page's RTCPeerConnection asks a STUN server at a UDP port on 127.0.0.1 where the test listens."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(3.0)
    try:
        env.reset(task_of(tasks, "click-button"))
        candidates = env.engine.driver.execute_async_script(WEBRTC_STUN, listener.getsockname()[1])
        try:
            datagram, sender = listener.recvfrom(2048)  # 3 s more, after the page's own 3 s
        except TimeoutError:
            datagram, sender = b"", None
    finally:
        listener.close()
    assert datagram == b"", f"a {len(datagram)}-byte datagram from {sender} reached the listener"
    # Without CHROMIUM_PREFS the page gathers udp host candidates and its STUN request arrives (checked by
    # reverting it: 20 bytes from the candidate's port).
    assert not any(" udp " in c for c in candidates), candidates


def test_screenshots_are_stored_beside_the_turn(env, tasks):
    env.screenshots = True
    try:
        env.reset(task_of(tasks, "enter-text"))
        box = next(e for e in env.page.elements if e.tag == "input")
        result = env.step(Action(tool="type", arguments={"ref": box.ref, "text": "abc"}))
    finally:
        env.screenshots = False
    png = base64.b64decode(result.info["screenshot"].removeprefix("data:image/png;base64,"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (160, 210)  # MiniWoB's task area


def test_tasks_generate_by_seed_with_disjoint_splits(tasks, tmp_path):
    from click.testing import CliRunner

    from omrl.cli.main import cli

    out = tmp_path / "web.jsonl"
    result = CliRunner().invoke(cli, ["tasks", "generate", "miniwob", "--n", "4", "--split", "train", "--seed", "7",
                                      "--option", "tasks=click-test-2,focus-text-2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    train = load_tasks(out)
    assert [t.payload["task"] for t in train] == ["click-test-2", "focus-text-2"] * 2
    assert [t.payload["seed"] for t in train] == ["train:7:0", "train:7:0", "train:7:1", "train:7:1"]
    assert all(t.split == "train" and t.instruction.startswith(("Click button", "Focus into")) for t in train)
    assert [t.payload["seed"] for t in tasks][:4] == ["test:7:0"] * 4  # the fixture: the same seed, test split
    assert not {t.payload["seed"] for t in train} & {t.payload["seed"] for t in tasks}
    with pytest.raises(ValueError, match="unknown MiniWoB task"):
        MiniWoBEnv.generate_tasks(2, tasks="click-nothing")


def test_tasks_generate_leaves_no_file_unclosed(tmp_path):
    """The browser that reads the utterances closes its driver's output pipe (it warned of an unclosed file)."""
    import subprocess

    done = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-m", "omrl", "tasks", "generate",
                           "miniwob", "--n", "1", "--option", "tasks=click-test-2", "--out", str(tmp_path / "w.jsonl")],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "unclosed" not in done.stderr and "ResourceWarning" not in done.stderr, done.stderr[-2000:]


def test_a_crashed_browser_is_an_env_error_and_is_replaced(tasks):
    from omrl.rollout import EnvPool, RolloutSettings, play_episodes

    pool = EnvPool(MiniWoBEnv)
    policy = KillingPolicy(at=1, which="child")  # kills Chromium (chromedriver's children) in episode 1
    jobs = [(task_of(tasks, name), 0) for name in ("enter-text", "click-button", "choose-list")]
    settings = RolloutSettings(env="miniwob", max_turns=6, concurrency=1)

    async def run():
        try:
            return await play_episodes(jobs, MiniWoBEnv, policy, settings, run_id="crash", pool=pool)
        finally:
            await pool.close()

    episodes = asyncio.run(run())
    assert policy.killed
    assert episodes[0].status == "env_error" and "env.step" in episodes[0].row["error"]
    assert [e.status for e in episodes[1:]] == ["ok", "ok"] and all(e.success for e in episodes[1:])
    assert pool.made == 2  # the broken browser was closed, a new one played the rest


def _collect_args(tasks_file: Path, store: Path, concurrency: int) -> list[str]:
    return ["collect", "--env", "miniwob", "--tasks", str(tasks_file), "--policy", "scripted", "--store", str(store),
            "--concurrency", str(concurrency), "--max-turns", "8", "--no-progress"]


def test_collect_leaves_no_browser_behind_when_it_ends_or_is_killed(tasks, tmp_path):
    import subprocess

    tasks_file = tmp_path / "web.jsonl"
    tasks_file.write_text("".join(json.dumps(t.to_row()) + "\n" for t in tasks))
    marker = uuid.uuid4().hex
    env = {**os.environ, "OMRL_TEST_MARKER": marker, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "omrl", *_collect_args(tasks_file, tmp_path / "store", 3)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{len(tasks)} written" in done.stdout and "success 100.0%" in done.stdout, done.stdout
    assert marked_processes(marker) == []  # checked at once: close() waits for each browser's group

    engines, left = kill_collect_mid_run(_collect_args(tasks_file, tmp_path / "killed", 3), tmp_path, "chromium")
    assert engines and left == []


def test_many_drivers_start_at_once():
    """chromedriver's own --port=0 failed to bind when eight started together (env_bench at 8 in flight)."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from omrl.envs.miniwob.browser import chromedriver_path, start_chromedriver

    with ThreadPoolExecutor(8) as pool:
        started = list(pool.map(lambda _: start_chromedriver(chromedriver_path(), 60), range(8)))
    try:
        ports = [port for _, port in started]
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy from the environment
        assert len(set(ports)) == 8
        for port in ports:
            with direct.open(f"http://127.0.0.1:{port}/status", timeout=10) as reply:
                assert json.load(reply)["value"]["ready"] is True
    finally:
        for process, _ in started:
            process.close()
    assert all(not process.alive() for process, _ in started)
