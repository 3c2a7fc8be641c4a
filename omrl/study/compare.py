"""Comparing learning methods fairly, from one SFT checkpoint per seed (omrl.study.run's runs): every RL method
plays the same rollouts, each run is recorded once and evaluated on the dev or test tasks.

    compare = Comparison(out, recipe_path, overrides, seeds=[0, 1], test=load_tasks("test.jsonl"))
    sft = compare.prepare(0)                                   # expert, base, SFT (omrl train iterate, rounds 0)
    record = compare.record("seed0/train/grpo-lr0.0001", lambda: train_method(...))
    test = compare.evaluate(0, "test", "grpo-lr0.0001", record["checkpoint"])

A seed's runs share its iterate folder (OUT/seed-S) and store; every trained or evaluated run is recorded in
OUT/benchmark_state.json as it finishes and skipped when asked again (a run cut off midway is redone).
`train_method` is the one way an RL method is trained from a checkpoint with an iterate recipe's sections:
GRPO (with step credit) from the `grpo` section, PPO from the `ppo` section with GRPO's rollouts per step.
omrl.study.run drives it; benchmarks/hard_task.py trains its extra methods with train_method.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omrl.store.durable import pid_alive
from omrl.store.study_folder import STATE_FILE, STATE_LOCK, claim_file, claim_holder, seed_folder

RL_METHODS = {  # method: (trainer, settings every run of it has)
    "grpo": ("grpo", {}),
    "grpo_step_credit": ("grpo", {"step_credit": {"weight": 1.0, "gamma": 0.95}}),
    "ppo_token": ("ppo", {"level": "token"}),
    "ppo_turn": ("ppo", {"level": "turn"}),
}


class LoadMeter:
    """The 1-minute load average, sampled every `every` seconds in a daemon thread while a run goes on."""

    def __init__(self, every: float = 15.0) -> None:
        self.samples: list[float] = []
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> LoadMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 1) if self.samples else None


def label(settings: dict[str, Any]) -> str:
    """A short run name for a grid point: lr3e-4, lr3e-4-ppo_epochs1, lr3e-4-weight2, lr3e-4-weight1-anchorvisited."""
    parts = []
    for key, value in settings.items():
        if key == "learning_rate":
            parts.append(f"lr{float(value):g}")  # YAML reads 1e-4 (no dot) as text
        elif key == "step_credit":
            parts.append(f"weight{value['weight']:g}")
            if value.get("anchor", "state") != "state":
                parts.append(f"anchor{value['anchor']}")
        elif key != "level":
            parts.append(f"{key}{str(value).lower()}")
    return "-".join(parts)


def train_method(recipe: Any, method: str, settings: dict[str, Any], model: str, store: str | Path,
                 output_dir: str | Path, run_name: str, round_: int = 1) -> dict[str, Any]:
    """Train RL method `method` (a key of RL_METHODS) from checkpoint `model` with the iterate recipe's section for
    it, the method's own settings and then `settings`; rollouts seeded for round `round_` as iterate seeds one, stored
    in `store` under `run_name`. PPO plays GRPO's rollouts: its steps, tasks and samples per step, warmup.
    Returns {checkpoint, train_s, run_prefix (of the stored rollouts), optimizer_steps, tokens (None when the
    trainer logs none), method, settings, rollouts}."""
    from omrl.train.config.iterate import update_recipe
    from omrl.train.trainer import TRAINERS

    trainer, fixed = RL_METHODS[method]
    out = Path(output_dir)
    run = {"model": model, "tasks": recipe.train_tasks, "output_dir": str(out), "store": str(store), "round": round_,
           "run_name": run_name, **fixed, **settings}
    grpo = recipe.grpo
    if trainer != "grpo":  # the other methods play GRPO's rollouts: its steps, tasks and samples per step, warmup
        run = {"max_steps": grpo.max_steps, "tasks_per_step": grpo.tasks_per_step,
               "samples_per_task": grpo.samples_per_task, "warmup_steps": grpo.warmup_steps, **run}
    started = time.monotonic()
    trained = TRAINERS.load(trainer).train(update_recipe(recipe, trainer, run, round=round_))
    return {"checkpoint": str(trained.checkpoint), "train_s": round(time.monotonic() - started, 1),
            "run_prefix": trained.rollouts["run_prefix"], "optimizer_steps": optimizer_steps(trained),
            "tokens": tokens_trained(trained),
            "method": method, "settings": {**fixed, **settings},
            "rollouts": run.get("max_steps", grpo.max_steps) * run.get("tasks_per_step", grpo.tasks_per_step)
            * run.get("samples_per_task", grpo.samples_per_task)}


def optimizer_steps(trained: Any) -> int:
    """The optimizer steps a run (a TrainResult) took: PPO's `steps` are rollout batches, each of the `updates`
    its log counts (ppo_epochs x minibatches, fewer when target_kl stops a batch early); the others' are steps."""
    if trained.trainer == "ppo":
        return int(sum(entry.get("updates", 0) for entry in trained.history))
    return int(trained.steps)


def tokens_trained(trained: Any) -> int | None:
    """The tokens a run (a TrainResult) trained on as its trainer counted them: TRL's cumulative `num_tokens`,
    in its final metrics or its step logs; None when it counts none (PPO)."""
    logs = [*trained.history, trained.metrics]
    counts = [entry["num_tokens"] for entry in logs if isinstance(entry.get("num_tokens"), (int, float))]
    return int(max(counts)) if counts else None


class Comparison:
    """The runs of one comparison folder: recorded in benchmark_state.json as they finish, skipped when done.

    Several processes may share a folder (a study resumed while another process runs it): a run is claimed
    by one process (claims/KEY holds its pid; the others wait for its record) and the state file is re-read
    under a lock before each record is added, so no process's records are lost."""

    def __init__(self, out: Path, recipe: str | Path, overrides: list[str], seeds: list[int], test: list[Any]) -> None:
        """`recipe`: an iterate recipe (its eval_tasks are the dev split); `test`: the held-out tasks."""
        from omrl.tasks import load_tasks
        from omrl.train.iterate.state import IterateState

        self.out, self.recipe_path, self.overrides, self.seeds = Path(out), recipe, overrides, seeds
        self.state = IterateState(self.out / STATE_FILE)
        self.recipes = {seed: self._recipe(seed) for seed in seeds}
        self._check_recipes()
        first = self.recipes[seeds[0]]
        self.dev = load_tasks(first.eval_tasks)[: first.eval.tasks or None]
        self.test = test
        self.stores: dict[int, Any] = {}
        self.demo_tasks = load_tasks(first.train_tasks)[: first.demos.tasks or None]
        self.prepared: dict[int, dict[str, Any]] = {}  # seed -> its SFT record, once prepared in this process

    def _recipe(self, seed: int):
        from omrl.config import load_recipe
        from omrl.train.config.iterate import IterateRecipe

        values = [f"output_dir={seed_folder(self.out, seed)}", "rounds=0", f"seed={seed}", f"tiny.seed={seed}",
                  f"rollout.seed={seed}", f"baseline.expert={str(seed == self.seeds[0]).lower()}",
                  "baseline.more_sft=false", "report=false"]
        return load_recipe(self.recipe_path, IterateRecipe, self.overrides + values)

    def _check_recipes(self) -> None:
        """Refuse to resume runs recorded with another recipe for a seed (IterateState.check_recipe); record this one."""
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / STATE_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be adding a record
            state = self._fresh()
            for seed, recipe in self.recipes.items():
                state.check_recipe(recipe, key=f"recipe-seed{seed}")

    # ------------------------------------------------------------ stages

    def prepare(self, seed: int) -> dict[str, Any]:
        """Expert, base and SFT of one seed (omrl train iterate, resumable); its SFT record (kept: asked again in
        this process, the iterate run is not resumed again)."""
        if seed in self.prepared:
            return self.prepared[seed]
        from omrl.store import Store
        from omrl.train.iterate.run import run_iterate
        from omrl.train.iterate.state import IterateState

        recipe = self.recipes[seed]
        state = Path(recipe.output_dir) / "state.json"
        with self._claim(f"seed{seed}/prepare", lambda: (IterateState(state).done("sft") if state.exists() else None)):
            run_iterate(recipe)  # resumes: what another process made is kept
        self.stores[seed] = Store(Path(recipe.output_dir) / "store")
        self.prepared[seed] = IterateState(state).done("sft")
        return self.prepared[seed]

    def base(self, seed: int) -> str:
        """The checkpoint seed `seed`'s runs started from (the iterate run's base stage: the recipe's model, or the
        tiny model built from its config), once prepare(seed) has run."""
        from omrl.train.iterate.state import IterateState

        self.prepare(seed)
        return IterateState(Path(self.recipes[seed].output_dir) / "state.json").done("base")["checkpoint"]

    def _fresh(self):
        """The state file as it is now (other processes may have added records)."""
        from omrl.train.iterate.state import IterateState

        self.state = IterateState(self.out / STATE_FILE)
        return self.state

    @contextlib.contextmanager
    def _claim(self, key: str, finished) -> Iterator[None]:
        """Hold run `key` for this process; while another live process holds it, wait until `finished()`
        says it is done (then the body runs and finds it done) or the holder is gone."""
        claim = claim_file(self.out, key)
        claim.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                holder = claim_holder(claim)
                if holder and holder != os.getpid() and pid_alive(holder) and finished() is None:
                    time.sleep(5)
                    continue
                if finished() is not None:
                    break  # done by the holder: the body finds the record
                claim.unlink(missing_ok=True)  # a dead holder's claim
                continue
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            try:
                yield
            finally:
                claim.unlink(missing_ok=True)
            return
        yield

    def record(self, key: str, work) -> dict[str, Any]:
        """Run `key`'s record: the one in the state file when done, else work()'s, recorded (with its seconds and
        the machine's mean load) as it finishes; a run another live process holds is waited for."""
        with self._claim(key, lambda: self._fresh().done(key)):
            done = self._fresh().done(key)
            if done is not None:
                return done
            started = time.monotonic()
            with LoadMeter() as load:
                record = work()
            with open(self.out / STATE_LOCK, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # re-read and write as one step
                self._fresh().finish(key, **record, seconds=round(time.monotonic() - started, 1), load=load.mean)
            return self.state.done(key)

    def evaluate(self, seed: int, split: str, name: str, checkpoint: str | None) -> dict[str, Any]:
        """Held-out success of a checkpoint (None: the scripted expert) on the dev or test games, sampled and
        greedy, with each game's success (for intervals paired per game)."""
        return self.record(f"seed{seed}/{split}/{name}", lambda: self._evaluate(seed, split, name, checkpoint))

    def _evaluate(self, seed: int, split: str, name: str, checkpoint: str | None) -> dict[str, Any]:
        from omrl.train.iterate.evaluation import (
            eval_run_ids,
            evaluate_checkpoint,
            evaluate_expert,
            task_success,
        )

        recipe, store = self.recipes[seed], self.stores[seed]
        tasks = self.dev if split == "dev" else self.test
        stage = f"{split}-{name}"
        if checkpoint is None:
            results = evaluate_expert(recipe, tasks, store, stage=stage)
        else:
            results = evaluate_checkpoint(recipe, checkpoint, tasks, store, stage, round=0)
        runs = eval_run_ids(recipe, stage)
        per_task = {mode: task_success(store, run_id, 0) for mode, run_id in runs.items()
                    if checkpoint is not None or mode == "sampled"}
        return {"results": results, "per_task": per_task}

# ---------------------------------------------------------------- the knobs a method is tuned on

TUNABLE = {"grpo": ("learning_rate", "step_credit"),
           "ppo": ("level", "learning_rate", "ppo_epochs", "minibatches", "whiten_advantages", "critic_warmup_steps",
                   "target_kl")}


def tuned_settings(recipe: Any, method: str, chosen: dict[str, Any]) -> dict[str, Any]:
    """The knobs a method is tuned on as its runs had them: the recipe's section, the method's own, `chosen`."""
    from omrl.config import to_dict

    trainer, fixed = RL_METHODS[method]
    section = to_dict(recipe.grpo if trainer == "grpo" else recipe.ppo)
    merged = {**section, **fixed, **chosen}
    return {k: merged[k] for k in TUNABLE[trainer] if merged.get(k) is not None}
