"""Collection on a real local Ray cluster: the same rows as in-process, a killed worker, the CLI through `ray start`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from test_agent import CountEnv, count_tasks  # noqa: E402

from omrl.policies.random_policy import RandomPolicy  # noqa: E402
from omrl.policies.scripted import ScriptedPolicy  # noqa: E402
from omrl.rollout import RolloutSettings, collect, placement  # noqa: E402
from omrl.rollout.ray_executor import RayExecutor, plan  # noqa: E402
from omrl.store import Store  # noqa: E402
from omrl.tasks import load_tasks  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GRID_TASKS = REPO / "datasets" / "tasks" / "grid_eval.jsonl"
TIMING = ("created_at", "duration_s")


def comparable(row: dict) -> dict:
    """A row without what depends on the clock (times, latencies)."""
    out = {k: v for k, v in row.items() if k not in TIMING}
    out["turns"] = [{k: v for k, v in t.items() if k != "latency_s"} for t in row["turns"]]
    return out


class Seen:
    """A reporter (omrl.progress) that records what an engine told it."""

    def __init__(self) -> None:
        self.labels, self.totals, self.steps, self.logs = [], [], [], []
        self.done = 0

    def start(self, label, total=None):
        self.labels.append(label)
        self.totals.append(total)

    def advance(self, n=1, **fields):
        self.done += n
        self.steps.append(self.done)

    def log(self, message):
        self.logs.append(message)

    def finish(self, summary=None):
        pass


def short_tmp() -> str:
    # Ray's socket paths must stay under 107 characters: pytest's tmp_path is too deep.
    return tempfile.mkdtemp(prefix="omrlray", dir="/tmp")


def kill_tree(match: str) -> None:
    """SIGKILL every process whose command line names `match` (this test's own cluster), and their children."""
    victims = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if match in " ".join(proc.info["cmdline"] or []):
                victims.extend([proc, *proc.children(recursive=True)])
        except psutil.Error:
            continue
    for proc in victims:
        with contextlib.suppress(psutil.Error):  # already gone with its parent: nothing left to stop
            proc.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the CLI against a cluster from `ray start`
# First in the file: it runs before the module's in-process cluster exists, so only one cluster is up at a time.


@pytest.mark.slow
def test_cli_collect_and_eval_on_a_cluster_from_ray_start(tmp_path: Path):
    port, temp_dir = free_port(), short_tmp()
    ray_bin = Path(sys.executable).parent / "ray"
    # Token auth off: ~/.ray/auth_token is shared by every cluster of this user (other sessions' too), and
    # this cluster listens on 127.0.0.1 only, for this test.
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_AUTH_MODE": "disabled"}
    subprocess.run([str(ray_bin), "start", "--head", "--port", str(port), "--num-cpus", "2", "--temp-dir", temp_dir,
                    "--node-ip-address", "127.0.0.1", "--include-dashboard", "false", "--disable-usage-stats"],
                   check=True, capture_output=True, env=env, timeout=180)
    try:
        store = tmp_path / "s"
        common = ["--env", "grid", "--tasks", str(GRID_TASKS), "--limit", "3", "--policy", "random",
                  "--ray", f"127.0.0.1:{port}", "--ray-num-cpus", "0.5", "-c", "2", "--no-progress"]
        out = subprocess.run([sys.executable, "-m", "omrl", "collect", *common, "--store", str(store), "-n", "2",
                              "--run", "r"], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "6 played" in out.stdout and "6 written" in out.stdout
        out = subprocess.run([sys.executable, "-m", "omrl", "eval", *common, "--store", str(store), "-k", "2",
                              "--run", "e"], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "grid" in out.stdout
    finally:
        kill_tree(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)  # the cluster's logs and sockets
    rows = Store(store).read().to_pylist()
    assert len(rows) == 12 and len({r["id"] for r in rows}) == 12
    assert sorted({r["run_id"] for r in rows}) == ["e", "r"]
    assert Store(store).check() == []


def test_cli_without_ray_says_how_to_get_it(tmp_path: Path, monkeypatch):
    from click.testing import CliRunner

    from omrl.cli.main import cli

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    out = CliRunner().invoke(cli, ["collect", "--env", "grid", "--tasks", str(GRID_TASKS), "--policy", "random",
                                   "--store", str(tmp_path / "s"), "--ray", "auto", "--no-progress"])
    assert out.exit_code != 0 and "pip install omrl[ray]" in out.output


# ---------------------------------------------------------------- one in-process cluster for the rest


@pytest.fixture(scope="module")
def cluster():
    temp_dir = short_tmp()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}})
    yield
    ray.shutdown()
    kill_tree(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_the_same_rows_as_in_process_collection(tmp_path: Path, cluster):
    tasks = load_tasks(str(GRID_TASKS))[:5]
    settings = RolloutSettings(env="grid", max_turns=8, seed=3, concurrency=2, ray_num_cpus=0.5, ray_workers=2)
    here, there = Store.create(tmp_path / "here"), Store.create(tmp_path / "there")
    local = asyncio.run(collect(None, tasks, RandomPolicy(seed=1), here, settings, samples=2, run_id="r"))
    remote = asyncio.run(collect(None, tasks, RandomPolicy(seed=1), there, settings, samples=2, run_id="r",
                                 executor=RayExecutor("auto")))
    assert (local.played, remote.played, remote.written) == (10, 10, 10)
    a = {r["id"]: comparable(r) for r in here.read().to_pylist()}
    b = {r["id"]: comparable(r) for r in there.read().to_pylist()}
    assert sorted(a) == sorted(b) and a == b
    assert len({str(r["messages"]) for r in a.values()}) > 1  # the random moves differ between episodes
    # Re-running resumes: nothing left to play, nothing written twice.
    again = asyncio.run(collect(None, tasks, RandomPolicy(seed=1), there, settings, samples=2, run_id="r",
                                executor=RayExecutor("auto")))
    assert (again.played, again.skipped, len(there.read())) == (0, 10, 10)


def ray_workers_of_this_process(actor: str = "EpisodeWorker") -> list:
    """The live Ray actor processes of this test's in-process cluster (descendants of this process)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if actor in " ".join(proc.cmdline() or []) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:  # exited (or a zombie) while we looked: not a worker to kill
            continue
    return found


@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_and_doubles_nothing(tmp_path: Path, cluster):
    tasks = count_tasks(10, target=3)  # 4 steps of 0.3 s: a shard takes a few seconds
    settings = RolloutSettings(concurrency=2, ray_num_cpus=0.5, ray_workers=2, max_turns=6)
    store = Store.create(tmp_path / "s")
    make = functools.partial(CountEnv, step_sleep=0.3)
    outcome: dict = {}
    seen = Seen()

    def run() -> None:
        try:
            outcome["result"] = asyncio.run(collect(make, tasks, ScriptedPolicy(), store, settings, samples=2,
                                                    run_id="k", batch_size=1, reporter=seen,
                                                    executor=RayExecutor("auto")))
        except BaseException as exc:  # reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)  # a hung run must not keep pytest from exiting
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (ray_workers_of_this_process() and store.ids()):
        time.sleep(0.2)
    victims = ray_workers_of_this_process()
    assert victims, "no Ray worker process found to kill"
    before = len(store.ids())
    os.kill(victims[0].pid, signal.SIGKILL)
    assert before < 20  # killed mid-run, with episodes still to play
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    rows = store.read().to_pylist()
    ids = [r["id"] for r in rows]
    assert len(rows) == 20 and len(set(ids)) == 20  # exactly tasks x samples, no duplicate
    assert all(r["status"] == "ok" and r["success"] for r in rows)
    assert store.check() == []
    # The progress shown: episodes finished cluster-wide, never past the total, never back (the killed
    # worker's shard is played again without counting twice), ending at every episode.
    assert seen.labels == ["collect k"] and seen.done == 20 and all(0 < d <= 20 for d in seen.steps)
    assert seen.steps == sorted(set(seen.steps))
    assert seen.logs and "Ray worker" in seen.logs[0]


def test_plan_fits_workers_to_the_cluster():
    s = RolloutSettings(concurrency=8, ray_num_cpus=1.0)
    two = [{"CPU": 2.0}]
    assert plan(placement(s), {"CPU": 2.0}, two, 100) == {"workers": 1, "in_flight": 2, "num_cpus": 2.0, "resources": {}}
    half = RolloutSettings(concurrency=2, ray_num_cpus=0.5)
    assert plan(placement(half), {"CPU": 4.0}, [{"CPU": 2.0}] * 2, 100)["workers"] == 4
    assert plan(placement(half), {"CPU": 4.0}, [{"CPU": 2.0}] * 2, 3)["workers"] == 2  # no idle workers for 3 jobs
    gpu = RolloutSettings(concurrency=4, ray_num_cpus=0.0, ray_resources={"sandbox": 1.0})
    assert plan(placement(gpu), {"CPU": 2.0, "sandbox": 3.0}, [{"CPU": 2.0, "sandbox": 3.0}], 100)["in_flight"] == 3
    free = RolloutSettings(concurrency=4, ray_num_cpus=0.0)
    assert plan(placement(free), {"CPU": 2.0}, two, 100)["workers"] == 2  # nothing reserved: a worker per CPU, not per job
    from omrl.errors import UsageError

    with pytest.raises(UsageError, match="no node of the Ray cluster"):
        plan(placement(RolloutSettings(ray_num_cpus=4.0)), {"CPU": 2.0}, two, 10)
    with pytest.raises(UsageError, match="lower --ray-workers"):
        plan(placement(RolloutSettings(concurrency=1, ray_workers=3)), {"CPU": 2.0}, two, 10)


@pytest.mark.slow
def test_a_policy_that_cannot_travel_is_a_usage_error(tmp_path: Path, cluster):
    from omrl.errors import UsageError

    policy = RandomPolicy(seed=1)
    policy.lock = threading.Lock()  # cannot be pickled
    settings = RolloutSettings(env="grid", max_turns=2, concurrency=1, ray_num_cpus=0.5)
    with pytest.raises(UsageError, match="cannot be sent to Ray workers"):
        asyncio.run(collect(None, load_tasks(str(GRID_TASKS))[:2], policy, Store.create(tmp_path / "s"), settings,
                            run_id="p", executor=RayExecutor("auto")))


# ---------------------------------------------------------------- annotate: judges on the cluster

GRID_RUBRIC = REPO / "recipes" / "judges" / "grid_goal.yaml"
JUDGED = ("trajectory_id", "annotator", "judge_model", "rubric", "kind", "score", "rationale", "status", "error",
          "prompt_hash", "prompt_tokens", "completion_tokens")


def grid_stores(tmp_path: Path, names: tuple[str, ...], tasks: int = 6, samples: int = 2) -> list[Store]:
    """Stores holding the same grid trajectories: the expert's (they reach the goal) on the first half of
    the tasks, random moves (which mostly do not) on the rest, so the judge's scores differ."""
    source = Store.create(tmp_path / "source")
    # The grid expert moves at random 30% of the time by default, from an environment RNG that
    # RolloutSettings.seed does not reach: about one run in nine, none of its episodes reached the goal
    # and every score was 0. Without noise it always takes a shortest path.
    settings = RolloutSettings(env="grid", max_turns=16, seed=5, concurrency=4)
    chosen = load_tasks(str(GRID_TASKS))[:tasks]
    for run_id, policy, part, options in (("e", ScriptedPolicy(), chosen[:tasks // 2], {"noise": 0.0}),
                                          ("g", RandomPolicy(seed=2), chosen[tasks // 2:], {})):
        asyncio.run(collect(None, part, policy, source, settings, samples=samples, run_id=run_id,
                            env_options=options))
    rows = source.read().to_pylist()
    assert all(r["success"] for r in rows if r["run_id"] == "e")  # the expert's rows reach the goal
    stores = []
    for name in names:
        store = Store.create(tmp_path / name)
        store.append(rows)
        stores.append(store)
    return stores


def judged(store: Store) -> dict:
    """(trajectory, annotator) -> what the judge said, without ids, times and run names."""
    rows = store.read("annotations").to_pylist()
    out = {(r["trajectory_id"], r["annotator"]): {k: r[k] for k in JUDGED} for r in rows}
    assert len(out) == len(rows)  # one annotation per (trajectory, judge)
    return out


@pytest.fixture
def judge_process():
    from omrl.testing.judge_server import JudgeProcess

    with JudgeProcess(rule="grid") as judge:
        yield judge


@pytest.mark.slow
def test_annotate_on_ray_gives_the_same_annotations_as_in_process(tmp_path: Path, cluster, judge_process):
    from click.testing import CliRunner

    from omrl.annotate.judge import JudgeConfig
    from omrl.annotate.rubric import load_rubric
    from omrl.annotate.runner import annotate
    from omrl.cli.main import cli

    here, there = grid_stores(tmp_path, ("here", "there"), tasks=4)  # 8 trajectories in 4 groups
    # Pointwise through the CLI with --ray local (the cluster this process holds), against in-process.
    common = ["--judge", str(GRID_RUBRIC), "--judge-model", "rule-judge", "--base-url", judge_process.base_url,
              "--concurrency", "2"]
    out = CliRunner().invoke(cli, ["annotate", str(here.path), *common])
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(cli, ["annotate", str(there.path), *common, "--ray", "local", "--ray-workers", "2"])
    assert out.exit_code == 0, out.output
    a, b = judged(here), judged(there)
    assert len(a) == 8 and a == b
    assert {v["status"] for v in a.values()} == {"ok"} and len({v["score"] for v in a.values()}) > 1
    # In-process commits the judge's rows in one part; on Ray, one part per shard.
    assert len(here.parts("annotations")) == 1 and len(there.parts("annotations")) > 1
    # Group mode: each group judged whole on one worker, scores relative within it, the same as in-process.
    config = JudgeConfig(rubric=load_rubric(GRID_RUBRIC), model="rule-judge", base_url=judge_process.base_url,
                         mode="group", concurrency=2)
    local = annotate(here, judge=config, cache_dir=tmp_path / "cache-here")
    seen = Seen()  # the progress the bar is given: rows judged cluster-wide, never past the total
    remote = annotate(there, judge=config, cache_dir=tmp_path / "cache-there", reporter=seen,
                      executor=RayExecutor("local", workers=2))
    assert seen.labels == ["judge judge:grid_goal:group"] and seen.totals == [8] and seen.done == 8
    assert all(0 < d <= 8 for d in seen.steps)
    assert local.written == remote.written and remote.written["judge:grid_goal:group"] == 8
    assert remote.judge.calls == local.judge.calls == 4  # one call per group, none twice
    a, b = judged(here), judged(there)
    assert len(a) == 16 and a == b
    # A re-run resumes on Ray too: everything is stored, nothing is asked or written again.
    again = annotate(there, judge=config, cache_dir=tmp_path / "cache-there", executor=RayExecutor("local"))
    assert again.already_done["judge:grid_goal:group"] == 8 and sum(again.written.values()) == 0
    # Redone on Ray: the workers' replies went into the driver's cache, which the workers start from.
    redo = annotate(there, judge=config, cache_dir=tmp_path / "cache-there", executor=RayExecutor("local"), redo=True)
    assert (redo.judge.calls, redo.judge.cache_hits, redo.written["judge:grid_goal:group"]) == (0, 4, 8)
    assert len(there.read("annotations")) == 24 and there.check() == []


@pytest.mark.slow
def test_a_judge_worker_killed_mid_run_annotates_each_trajectory_once(tmp_path: Path, cluster):
    from omrl.annotate.judge import JudgeConfig
    from omrl.annotate.rubric import load_rubric
    from omrl.annotate.runner import annotate
    from omrl.testing.judge_server import JudgeProcess

    (store,) = grid_stores(tmp_path, ("s",), tasks=8, samples=2)
    outcome: dict = {}
    with JudgeProcess(rule="grid", latency=0.3) as judge:  # 2 rows a shard, one at a time: ~0.6 s a shard
        config = JudgeConfig(rubric=load_rubric(GRID_RUBRIC), model="rule-judge", base_url=judge.base_url,
                             concurrency=1)

        def run() -> None:
            try:
                outcome["summary"] = annotate(store, judge=config, executor=RayExecutor("auto", workers=2))
            except BaseException as exc:  # reported by the assertion below
                outcome["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (ray_workers_of_this_process("JudgeWorker")
                                                   and store.count("annotations")):
            time.sleep(0.1)
        victims = ray_workers_of_this_process("JudgeWorker")
        assert victims, f"no Ray judge worker process found to kill (the run: {outcome!r})"
        before = store.count("annotations")
        os.kill(victims[0].pid, signal.SIGKILL)
        assert before < 16  # killed mid-run, with trajectories still to judge
        thread.join(timeout=300)
        stats = judge.stats()
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    rows = store.read("annotations").to_pylist()
    assert len(rows) == 16 and len({r["trajectory_id"] for r in rows}) == 16  # one per (trajectory, judge)
    assert all(r["status"] == "ok" and r["annotator"] == "judge:grid_goal" for r in rows)
    # The killed shard's prompts were asked again, nothing else. Two samples of a task that played alike
    # render the same prompt, which the judge then sees once (a cache hit), so count the stored prompts.
    assert stats["distinct_prompts"] == len({r["prompt_hash"] for r in rows})
    assert store.check() == []


def test_annotate_ray_flag_without_ray_says_how_to_get_it(tmp_path: Path, monkeypatch):
    from click.testing import CliRunner

    from omrl.cli.main import cli

    store = Store.create(tmp_path / "s")
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    out = CliRunner().invoke(cli, ["annotate", str(store.path), "--judge", str(GRID_RUBRIC), "--judge-model", "m",
                                   "--base-url", "http://127.0.0.1:9/v1", "--ray", "auto"])
    assert out.exit_code != 0 and "pip install omrl[ray]" in out.output


def test_judge_shards_keep_tasks_and_groups_whole():
    from types import SimpleNamespace

    from omrl.annotate.runner import JudgeWork
    from omrl.rollout import ray_executor

    def judge_shards(rows, mode, size):
        return ray_executor.shards(rows, size, JudgeWork(SimpleNamespace(mode=mode), "r").group)

    rows = [{"id": f"t{t}-{s}", "task_id": f"t{t}", "group_id": f"g{t}"} for t in range(5) for s in range(3)]
    assert [len(s) for s in judge_shards(rows, "pointwise", 4)] == [4, 4, 4, 3]
    for mode, key in (("pairwise", "task_id"), ("group", "group_id")):
        shards = judge_shards(rows, mode, 4)
        assert [len(s) for s in shards] == [3, 3, 3, 3, 3]  # 3 + 3 > 4: a set never shares a shard it overfills
        assert all(len({r[key] for r in s}) == 1 for s in shards)
        assert sorted(r["id"] for s in shards for r in s) == sorted(r["id"] for r in rows)
        assert [len(s) for s in judge_shards(rows, mode, 7)] == [6, 6, 3]


# ---------------------------------------------------------------- iterate: collect and eval stages on the cluster


@pytest.mark.slow
def test_an_iterate_round_on_ray_resumes_without_doubling_rows(tmp_path: Path, cluster, monkeypatch):
    from omrl.config import load_recipe
    from omrl.models.tiny import cached_tiny_model
    from omrl.train.algorithms import grpo as grpo_module
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.run import run_iterate

    config = load_recipe({
        "output_dir": str(tmp_path / "run"), "model": str(cached_tiny_model(hidden=32)), "rounds": 1,
        "train_tasks": str(REPO / "datasets" / "tasks" / "grid_train.jsonl"), "eval_tasks": str(GRID_TASKS),
        "ray": "auto",
        "rollout": {"env": "grid", "max_turns": 3, "max_new_tokens": 4, "concurrency": 4, "ray_num_cpus": 0.5},
        "demos": {"enabled": False}, "collect": {"tasks": 3, "samples": 2},
        "grpo": {"max_steps": 1, "tasks_per_step": 2, "samples_per_task": 2, "warmup_steps": 0, "quiet": True},
        "eval": {"tasks": 2, "samples": 2, "greedy": False},
    }, IterateRecipe)
    on_ray = []  # the address of every collect that went through Ray (the real RayExecutor.run runs)
    real = RayExecutor.run

    def spy(self, work, jobs, *args, **kwargs):
        jobs = list(jobs)
        if jobs:  # nothing to play: Ray not even started
            on_ray.append(self.address)
        return real(self, work, jobs, *args, **kwargs)

    monkeypatch.setattr(RayExecutor, "run", spy)

    class Killed(RuntimeError):
        pass

    def killed(*args, **kwargs):
        raise Killed("after the round's collection, before its update step")

    # training is not what is tested here (iterate's update step is the registered trainer's train)
    monkeypatch.setattr(grpo_module, "TRAINER", dataclasses.replace(grpo_module.TRAINER, train=killed))
    with pytest.raises(Killed):
        run_iterate(config)
    store = Store(tmp_path / "run" / "store")
    assert on_ray == ["auto", "auto"]  # the base evaluation and the round's collection
    with pytest.raises(Killed):  # resumed: base is done, the round's collection is stored, GRPO is next again
        run_iterate(config)
    assert on_ray == ["auto", "auto"]  # nothing left to play: Ray not even started
    runs = {r["run_id"]: r["n"] for r in store.sql(
        "SELECT run_id, count(*) AS n FROM trajectories GROUP BY run_id").to_pylist()}
    assert runs == {"eval-base-sampled_t1": 4, "round-1": 6}  # 2 tasks x 2 samples, 3 tasks x 2 samples
    ids = [r["id"] for r in store.read(columns=["id"]).to_pylist()]
    assert len(ids) == len(set(ids)) and store.check() == []
