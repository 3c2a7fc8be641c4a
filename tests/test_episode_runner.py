"""The one episode runner (omrl.rollout.play_episodes) under collect, GRPO and RFT: every environment it
opens is closed, each episode gets its own seed, a broken environment becomes env_error rows."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from test_agent import CountEnv, count_tasks

from omrl.envs.base import Reset, StepResult, Task
from omrl.envs.grid import GridEnv
from omrl.policies import make_policy
from omrl.rollout import RolloutSettings, collect, play_episodes
from omrl.store import Store


class Ledger:
    """What the counting environments wrote to their log file: made / closed / open-at-once."""

    def __init__(self, path: Path):
        self.path = path

    def events(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def count(self, event: str) -> int:
        return sum(e["event"] == event for e in self.events())

    def max_open(self) -> int:
        open_now = peak = 0
        for e in self.events():
            open_now += {"made": 1, "closed": -1}.get(e["event"], 0)
            peak = max(peak, open_now)
        return peak


_LOCK = threading.Lock()


def _log(path: str, **event) -> None:
    with _LOCK, open(path, "a") as f:
        f.write(json.dumps(event) + "\n")


class Counting:
    """Mixin: logs construction (and its thread) and close to `log`; optionally slow or failing to construct."""

    def _made(self, log: str, make_sleep: float = 0.0, fail: bool = False) -> None:
        if make_sleep:
            time.sleep(make_sleep)
        if fail:
            raise OSError("no server for this environment")
        self.log = log
        _log(log, event="made", main_thread=threading.current_thread() is threading.main_thread())

    def close(self) -> None:
        _log(self.log, event="closed")


class CountingCountEnv(Counting, CountEnv):
    def __init__(self, log: str, make_sleep: float = 0.0, fail: bool = False, **options):
        self._made(log, make_sleep, fail)
        CountEnv.__init__(self, **options)


class CountingLetterEnv(Counting):
    """One-turn text env whose reward varies across samples of an untrained model (as test_grpo's)."""

    name = "letter"

    def __init__(self, log: str):
        self._made(log)

    def reset(self, task):
        return Reset(observation="say something", system_prompt="Reply.")

    def step(self, action):
        reward = float(sum(map(ord, action.text)) % 2)
        return StepResult("ok", reward, True, {"success": reward >= 1})


class CountingGridEnv(Counting, GridEnv):
    def __init__(self, log: str, **options):
        self._made(log)
        GridEnv.__init__(self, **options)


def seeds(store: Store) -> list[int]:
    return [json.loads(r["metadata"])["seed"] for r in store.read(columns=["metadata"]).to_pylist()]


def test_play_episodes_closes_every_env_seeds_each_episode_and_limits_concurrency(tmp_path):
    ledger = Ledger(tmp_path / "log")
    tasks = count_tasks(5, target=2)
    jobs = [(t, s) for t in tasks for s in range(3)]
    settings = RolloutSettings(env="unused", max_turns=5, concurrency=4, seed=7)
    episodes = asyncio.run(play_episodes(jobs, lambda: CountingCountEnv(str(ledger.path), step_sleep=0.01),
                                         make_policy("scripted"), settings, run_id="r"))
    assert [(e.row["task_id"], e.row["sample"]) for e in episodes] == [(t.id, s) for t, s in jobs]  # job order
    assert all(e.status == "ok" and e.success for e in episodes)
    assert ledger.count("made") == ledger.count("closed") == 15
    assert not any(e["main_thread"] for e in ledger.events() if e["event"] == "made")  # made in worker threads
    assert 1 < ledger.max_open() <= 4
    episode_seeds = [json.loads(e.row["metadata"])["seed"] for e in episodes]
    assert len(set(episode_seeds)) == 15 and [e.context.seed for e in episodes] == episode_seeds


class TaskLoggingCountEnv(CountingCountEnv):
    """Also logs which task each environment plays, at reset and close (orders two calls' episodes)."""

    def reset(self, task):
        _log(self.log, event="reset", task=task.id)
        return super().reset(task)

    def close(self) -> None:
        _log(self.log, event="closed", task=self.task.id)


@pytest.mark.slow
def test_a_ray_worker_plays_its_queued_shards_through_shared_slots(tmp_path):
    # The Ray executor's ShardWorker without Ray: two shards of collect's EpisodeWork queued on one worker
    # share `concurrency` slots, so the second starts filling slots while the first still has episodes to
    # play (one after the other, slots sat idle at each shard's end), and together they never hold more
    # environments than the slots.
    from omrl.rollout import EpisodeWork
    from omrl.rollout.ray_executor import ShardWorker

    ledger = Ledger(tmp_path / "log")
    settings = RolloutSettings(env="unused", max_turns=5, concurrency=3, seed=7)
    work = EpisodeWork(lambda: TaskLoggingCountEnv(str(ledger.path), step_sleep=0.01), make_policy("scripted"),
                       settings, {"run_id": "r", "round": 0, "source": "collected"}).portable(3)
    worker = ShardWorker()
    first = [(t, 0) for t in count_tasks(4)]
    second = [(Task(id=f"b{i}", instruction="Count to 2.", answer="2", env="count", payload={"target": 2}), 0)
              for i in range(4)]

    async def both():
        shipped = asyncio.get_running_loop().create_future()  # stands in for the work's object-store ref
        shipped.set_result(work)
        return await asyncio.gather(worker.play(([shipped], first)), worker.play(([shipped], second)))

    done_first, done_second = asyncio.run(both())
    assert (done_first["jobs"], done_second["jobs"]) == (4, 4)
    rows_first, rows_second = done_first["items"], done_second["items"]
    assert sorted(r["task_id"] for r in rows_first) == ["t0", "t1", "t2", "t3"]
    assert sorted(r["task_id"] for r in rows_second) == ["b0", "b1", "b2", "b3"]
    assert all(r["status"] == "ok" for r in rows_first + rows_second)
    assert ledger.count("made") == ledger.count("closed") == 8 and ledger.max_open() == 3
    events = ledger.events()
    first_of_second = next(i for i, e in enumerate(events) if e["event"] == "reset" and e["task"].startswith("b"))
    last_of_first = max(i for i, e in enumerate(events) if e["event"] == "closed" and e["task"].startswith("t"))
    assert first_of_second < last_of_first
    assert worker.progress() == 0  # nothing running: the driver's live count holds only running shards


def test_an_env_whose_constructor_raises_becomes_env_error_rows(tmp_path):
    ledger = Ledger(tmp_path / "log")
    settings = RolloutSettings(env="unused", max_turns=3)
    episodes = asyncio.run(play_episodes([(t, 0) for t in count_tasks(3)],
                                         lambda: CountingCountEnv(str(ledger.path), fail=True),
                                         make_policy("scripted"), settings, run_id="r"))
    assert [e.status for e in episodes] == ["env_error"] * 3
    assert all("creating the environment failed: OSError: no server" in e.row["error"] for e in episodes)
    assert all(e.reward is None and e.success is None for e in episodes)

    # Under collect (whose first probe works), the episodes whose environment fails are stored as env_error.
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        return CountingCountEnv(str(ledger.path), fail=calls["n"] % 2 == 0)

    store = Store.create(tmp_path / "s")
    result = asyncio.run(collect(flaky, count_tasks(6, target=1), make_policy("scripted"), store, run_id="r",
                                 concurrency=1))
    assert result.statuses == {"ok": 3, "env_error": 3} and store.count() == 6
    assert ledger.count("made") == ledger.count("closed") == 4  # the probe and the 3 that worked


def test_cancelled_while_environments_are_being_made_leaks_none(tmp_path):
    ledger = Ledger(tmp_path / "log")

    async def cancel_early():
        job = asyncio.create_task(play_episodes(
            [(t, 0) for t in count_tasks(4)], lambda: CountingCountEnv(str(ledger.path), make_sleep=0.3),
            make_policy("scripted"), RolloutSettings(env="unused", concurrency=4), run_id="r"))
        await asyncio.sleep(0.1)  # every constructor is still running
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    asyncio.run(cancel_early())  # asyncio.run waits for the constructor threads
    assert ledger.count("made") == ledger.count("closed") == 4


def test_collect_resumes_after_a_cancel_and_closes_every_environment(tmp_path):
    ledger = Ledger(tmp_path / "log")
    store = Store.create(tmp_path / "s")
    tasks = count_tasks(12, target=2)

    def make():
        return CountingCountEnv(str(ledger.path), step_sleep=0.05)

    async def cancel_midway():
        job = asyncio.create_task(collect(make, tasks, make_policy("scripted"), store, concurrency=3, run_id="r",
                                          batch_size=100))
        await asyncio.sleep(0.5)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    asyncio.run(cancel_midway())
    kept = store.count()
    assert 0 < kept < 12
    assert ledger.count("made") == ledger.count("closed")  # also the episodes cut off by the cancel
    result = asyncio.run(collect(make, tasks, make_policy("scripted"), store, run_id="r"))
    assert result.played == 12 - kept and store.count() == 12 and store.check() == []
    assert ledger.count("made") == ledger.count("closed")
    assert len(set(seeds(store))) == 12


torch = pytest.importorskip("torch")
pytest.importorskip("trl")


@pytest.mark.slow
def test_a_grpo_step_closes_every_environment_and_seeds_each_episode(tmp_path):
    from omrl.models.tiny import build_tiny_model
    from omrl.tasks import write_tasks
    from omrl.train.algorithms.grpo import train_grpo
    from omrl.train.config.grpo import GRPORecipe
    from omrl.train.data.rollout_step import RolloutStep

    ledger = Ledger(tmp_path / "log")
    model = build_tiny_model(tmp_path / "tiny", hidden=32, layers=2)
    tasks = write_tasks([Task(id=f"t{i}", instruction="say", env="letter") for i in range(2)],
                        tmp_path / "tasks.jsonl")
    rollout = RolloutSettings(env="test_episode_runner:CountingLetterEnv", env_options={"log": str(ledger.path)},
                              max_turns=1, max_new_tokens=4, seed=5)
    recipe = GRPORecipe(model=str(model), tasks=str(tasks), output_dir=str(tmp_path / "out"), rollout=rollout,
                        store=str(tmp_path / "store"), max_steps=1, tasks_per_step=2, samples_per_task=4,
                        warmup_steps=0, quiet=True)
    train_grpo(recipe)
    assert ledger.count("made") == ledger.count("closed") == 8  # 2 tasks x 4 samples, all closed
    assert not any(e["main_thread"] for e in ledger.events() if e["event"] == "made")
    stored = seeds(Store(tmp_path / "store"))
    assert len(stored) == 8 and len(set(stored)) == 8 and 5 not in stored
    rollouts = RolloutStep(recipe, "grpo")  # the next step draws other seeds
    assert rollouts.settings(0, 8).seed != rollouts.settings(1, 8).seed


@pytest.mark.slow
def test_an_rft_round_closes_every_environment_and_seeds_each_episode(tmp_path):
    from omrl.envs.grid import grid_tasks
    from omrl.tasks import write_tasks
    from omrl.train.algorithms.rft import train_rft
    from tests.train_helpers import random_mover_model

    ledger = Ledger(tmp_path / "log")
    model = random_mover_model(tmp_path / "mover")
    tasks_file = write_tasks(grid_tasks(4, seed=2), tmp_path / "tasks.jsonl")
    result = train_rft({"model": str(model), "tasks": str(tasks_file), "output_dir": str(tmp_path / "rft"),
                        "rollout": {"env": "test_episode_runner:CountingGridEnv", "env_options": {"log": str(ledger.path)},
                                    "max_turns": 2, "max_new_tokens": 4, "seed": 1},
                        "samples": 3, "threshold": -100.0,
                        "sft": {"max_steps": 1, "batch_size": 4, "quiet": True}})
    assert result.rollouts["attempts"] == 12
    assert ledger.count("made") == ledger.count("closed") == 12 + 1  # the episodes and collect's probe
    stored = seeds(Store(tmp_path / "rft" / "store"))
    assert len(stored) == 12 and len(set(stored)) == 12


class ReusableCountEnv(CountingCountEnv):
    """A slow-to-start engine: reusable between episodes; `crash_on` task ids fail the episode at reset."""

    reusable = True

    def __init__(self, log: str, crash_on: tuple[str, ...] = (), **options):
        super().__init__(log, **options)
        self.crash_on = crash_on

    def reset(self, task):
        if task.id in self.crash_on:
            raise RuntimeError("engine died")
        return super().reset(task)


def test_reusable_environments_are_pooled_replaced_after_a_failure_and_all_closed(tmp_path):
    ledger = Ledger(tmp_path / "log")
    tasks = count_tasks(6, target=2)
    jobs = [(t, s) for t in tasks for s in range(2)]
    settings = RolloutSettings(env="unused", max_turns=5, concurrency=3, seed=1)
    crash = (tasks[2].id,)
    episodes = asyncio.run(play_episodes(
        jobs, lambda: ReusableCountEnv(str(ledger.path), crash_on=crash), make_policy("scripted"), settings,
        run_id="r"))
    statuses = [e.status for e in episodes]
    assert statuses.count("env_error") == 2 and statuses.count("ok") == 10
    made = ledger.count("made")
    # 3 slots plus one replacement per crashed engine: far fewer than one engine per episode.
    assert made <= 3 + 2 < len(jobs)
    assert ledger.count("closed") == made  # the crashed ones at once, the idle ones when the call ends


def test_a_pool_passed_in_outlives_the_call_and_its_owner_closes_it(tmp_path):
    from omrl.rollout import EnvPool

    ledger = Ledger(tmp_path / "log")
    settings = RolloutSettings(env="unused", max_turns=5, concurrency=2, seed=1)
    pool = EnvPool(lambda: ReusableCountEnv(str(ledger.path)))

    async def two_steps():
        for _ in range(2):
            jobs = [(t, 0) for t in count_tasks(4, target=2)]
            await play_episodes(jobs, None, make_policy("scripted"), settings, run_id="r", pool=pool)
        assert ledger.count("closed") == 0 and len(pool) == 2  # kept across both calls
        await pool.close()

    asyncio.run(two_steps())
    assert ledger.count("made") == ledger.count("closed") == 2


def test_collect_reuses_its_probe_of_a_reusable_environment(tmp_path):
    ledger = Ledger(tmp_path / "log")
    store = Store.create(tmp_path / "store")
    result = asyncio.run(collect(lambda: ReusableCountEnv(str(ledger.path)), count_tasks(4, target=2),
                                 make_policy("scripted"), store, RolloutSettings(max_turns=5, concurrency=1)))
    assert result.statuses["ok"] == 4
    assert ledger.count("made") == ledger.count("closed") == 1  # the probe played all four episodes


class LongGameEnv(CountEnv):
    """Needs more than the generic 16 turns, and says so."""

    default_max_turns = 30


def test_an_environment_declares_its_own_turn_budget_and_max_turns_overrides_it():
    tasks = count_tasks(1, target=20)
    policy = make_policy("scripted")

    def play(settings):
        return asyncio.run(play_episodes([(tasks[0], 0)], LongGameEnv, policy, settings, run_id="r"))[0]

    assert play(RolloutSettings()).status == "ok"  # 20 moves fit the env's 30
    assert play(RolloutSettings(max_turns=10)).status == "truncated"
    assert asyncio.run(play_episodes([(tasks[0], 0)], CountEnv, policy, RolloutSettings(), run_id="r"))[0].status \
        == "truncated"  # no declared budget: 16


class ReusableLetterEnv(CountingLetterEnv):
    """The one-turn letter env as a slow engine: reusable between episodes."""

    reusable = True


def _letter_setup(tmp_path, n_tasks: int = 2):
    from omrl.models.tiny import cached_tiny_model
    from omrl.tasks import write_tasks

    ledger = Ledger(tmp_path / "log")
    tasks = [Task(id=f"t{i}", instruction="say", env="letter") for i in range(n_tasks)]
    path = write_tasks(tasks, tmp_path / "tasks.jsonl")
    rollout = RolloutSettings(env="test_episode_runner:ReusableLetterEnv", env_options={"log": str(ledger.path)},
                              max_turns=1, max_new_tokens=4, seed=5)
    return ledger, cached_tiny_model(hidden=32), tasks, path, rollout


@pytest.mark.slow
def test_grpo_and_ppo_keep_their_reusable_engines_across_steps_and_close_them(tmp_path):
    from omrl.train.algorithms.grpo import train_grpo
    from omrl.train.algorithms.ppo import train_ppo
    from omrl.train.config.grpo import GRPORecipe
    from omrl.train.config.ppo import PPORecipe

    ledger, model, _, tasks_file, rollout = _letter_setup(tmp_path)
    common = {"model": str(model), "tasks": str(tasks_file), "rollout": rollout, "max_steps": 3, "tasks_per_step": 2,
              "samples_per_task": 4, "warmup_steps": 0, "quiet": True}
    train_grpo(GRPORecipe(output_dir=str(tmp_path / "grpo"), **common))
    # 8 episodes in flight per step, 3 steps: one engine per slot, not one per step (24)
    assert ledger.count("made") == ledger.count("closed") == 8
    train_ppo(PPORecipe(output_dir=str(tmp_path / "ppo"), **common))
    assert ledger.count("made") == ledger.count("closed") == 16


@pytest.mark.slow
def test_inside_shared_engines_collect_eval_and_training_draw_from_one_pool(tmp_path):
    from omrl.rollout import evaluate, shared_engines
    from omrl.train.algorithms.grpo import train_grpo
    from omrl.train.algorithms.ppo import train_ppo
    from omrl.train.config.grpo import GRPORecipe
    from omrl.train.config.ppo import PPORecipe

    ledger, model, tasks, tasks_file, rollout = _letter_setup(tmp_path)
    store = Store.create(tmp_path / "store")
    common = {"model": str(model), "tasks": str(tasks_file), "rollout": rollout, "max_steps": 2, "tasks_per_step": 2,
              "samples_per_task": 4, "warmup_steps": 0, "quiet": True}
    policy = make_policy(f"hf:{model}")
    with shared_engines() as pools:
        asyncio.run(collect(None, tasks, policy, store, rollout, samples=2, concurrency=4))
        train_grpo(GRPORecipe(output_dir=str(tmp_path / "grpo"), **common))
        train_ppo(PPORecipe(output_dir=str(tmp_path / "ppo"), **common))
        result = asyncio.run(evaluate(None, tasks, policy, store, samples=3, settings=rollout))
        assert result.collect.played == 6
        assert ledger.count("closed") == 0 and len(pools) == 1  # every engine kept for the next call
    # the largest call had 8 in flight: 8 engines served the collect, both trainers and the eval
    assert ledger.count("made") == ledger.count("closed") == 8
    # outside the block a call owns its engines again
    asyncio.run(collect(None, tasks, policy, store, rollout, samples=1, run_id="after",
                        concurrency=1))
    assert ledger.count("made") == ledger.count("closed") == 8 + 1
