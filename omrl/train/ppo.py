"""PPO for multi-turn agents: omrl's episode runner plays, a critic values, GAE skips the environment's tokens.

    result = train_ppo(PPORecipe(model="runs/sft", tasks="datasets/tasks/grid_train.jsonl",
                                 output_dir="runs/ppo", store="runs/ppo-store", level="turn"))

Each step:
1. Rollouts: `tasks_per_step` tasks x `samples_per_task` episodes played by omrl.rollout.play_episodes
   (the one episode runner) with an HFPolicy wrapping the live model; their rows are appended to the
   store (run `<run_name>/round-<round>/step-<step>`, source `collected:ppo`), as GRPO's are.
2. Token traces (omrl.policies.hf.token_trace): the model's tokens (env_mask 1) and the environment's
   and template's tokens between turns (0). Each turn's reward goes on the turn's last trainable token;
   a reward the turns do not carry (the episode's reward minus theirs) on the last trainable token.
3. One no-grad pass gives the old logprobs (at the rollout temperature, as sampled), the old values
   and, with beta > 0, the reference model's logprobs: the KL penalty beta * (logp - ref_logp) is
   taken from each trainable token's reward (TRL's PPO does the same).
4. GAE (omrl/train/gae.py) at `token` or `turn` level; environment tokens get no advantage, no value
   loss and do not break the recursion. Advantages are whitened over trainable tokens.
5. `ppo_epochs` passes over the batch in `minibatches`: clipped surrogate, clipped value loss,
   optional entropy bonus; token-mean losses; one AdamW over policy and critic, grad-norm clipped.
   Steps 2-5 are omrl/train/ppo_update.py; this module plays the rollouts and runs the steps.

The critic is a linear value head on the policy's last hidden state (`critic: head`, shares the trunk)
or a separate model (`critic: separate`, from `critic_model`, default the starting checkpoint) with its
own head. A token's value is read from the hidden state before it (the state it was sampled in).
Saved: the policy (model + tokenizer) in output_dir, the critic in output_dir/critic, the per-step log
in output_dir/omrl_ppo.json.

Several processes (`accelerate launch` or `torchrun`; gloo on a CPU): every process draws the same tasks
and plays its contiguous share of the step's (task, sample) episodes (a task's samples stay together; each
episode's seed depends on (seed, task, sample) only, so the episodes are those of one process) and stores
only its own rows; GAE is per episode, on the process that played it; whitening, explained variance and
the token means of the losses are over the whole batch (sums all-reduced), and the policy and critic are
one DDP module (accelerate's prepare), so every process applies the same averaged gradient. Logged metrics
are over all processes' samples; the main process prints, saves the checkpoint and writes omrl_ppo.json
(with each process's parameter digest: equal digests show the copies stayed identical).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.rollout import RolloutSettings
from omrl.train import ppo_update

CRITICS = ("head", "separate")


def _ppo_rollout():
    return RolloutSettings(env="grid", max_turns=14, max_new_tokens=8, concurrency=64)


@dataclass
class PPORecipe:
    """Settings of one PPO run (multi-turn, on a tasks file; rollouts by omrl's episode runner)."""

    model: str = field(metadata={"help": "starting checkpoint folder (model + tokenizer)"})
    tasks: str = field(metadata={"help": "tasks file (Parquet or JSONL task rows)"})
    output_dir: str = field(metadata={"help": "where the trained policy (and critic/) is saved"})
    rollout: RolloutSettings = field(default_factory=_ppo_rollout, metadata={
        "help": "how rollouts are played (omrl.rollout.RolloutSettings); a step plays all its episodes at once"})
    split: str | None = field(default=None, metadata={"help": "keep only this split of the tasks file"})
    store: str | None = field(default=None, metadata={"help": "store that receives every step's rollouts"})
    run_name: str = field(default="ppo", metadata={"help": "run id prefix of the stored rollouts"})
    round: int = field(default=1, metadata={"help": "iteration round, stored with every rollout"})
    max_steps: int = field(default=50, metadata={"help": "PPO steps (one rollout batch each)"})
    tasks_per_step: int = field(default=8, metadata={"help": "distinct tasks per step, drawn without replacement"})
    samples_per_task: int = field(default=4, metadata={"help": "episodes per task and step"})
    level: str = field(default="token", metadata={
        "help": "GAE level: token (every model token a step) or turn (one value and advantage per assistant turn)"})
    gamma: float = field(default=1.0, metadata={"help": "discount per trainable step (token or turn)"})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda"})
    critic: str = field(default="head", metadata={
        "help": "head: a linear value head on the policy's last hidden state; separate: its own model + head"})
    critic_model: str | None = field(default=None, metadata={
        "help": "checkpoint of the separate critic (default: the starting model)"})
    ppo_epochs: int = field(default=4, metadata={"help": "passes over each rollout batch"})
    minibatches: int = field(default=2, metadata={"help": "minibatches per pass (episodes split evenly)"})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate (policy and critic)"})
    warmup_steps: int = field(default=0, metadata={"help": "linear warmup, in PPO steps"})
    critic_warmup_steps: int = field(default=0, metadata={
        "help": "first PPO steps that train only the critic (the policy is left unchanged), so the policy's "
                "first updates see a fitted baseline instead of a zero-initialised one"})
    clip_range: float = field(default=0.2, metadata={"help": "ratio clipping of the surrogate"})
    clip_range_value: float = field(default=0.2, metadata={"help": "value clipping around the old values"})
    vf_coef: float = field(default=0.5, metadata={"help": "weight of the value loss"})
    entropy_coef: float = field(default=0.0, metadata={"help": "weight of the entropy bonus"})
    beta: float = field(default=0.0, metadata={"help": "KL-to-reference penalty in the reward; 0 loads no reference"})
    whiten_advantages: bool = field(default=True, metadata={"help": "whiten advantages over trainable tokens"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient-norm clipping"})
    seed: int = field(default=0, metadata={"help": "seeds torch, the task draw and minibatches (rollout.seed: episodes)"})
    logging_steps: int = field(default=1, metadata={"help": "print every N steps (everything is logged to JSON)"})
    use_cpu: bool | None = field(default=None, metadata={"help": "force CPU; default: CPU when no GPU"})
    quiet: bool = field(default=False, metadata={"help": "no progress lines"})

    def __post_init__(self) -> None:
        from omrl.train.gae import LEVELS

        if self.level not in LEVELS:
            raise UsageError(f"level must be one of {', '.join(LEVELS)}, got {self.level!r}")
        if self.critic not in CRITICS:
            raise UsageError(f"critic must be one of {', '.join(CRITICS)}, got {self.critic!r}")
        if self.ppo_epochs < 1 or self.minibatches < 1 or self.tasks_per_step < 1 or self.samples_per_task < 1:
            raise UsageError("ppo_epochs, minibatches, tasks_per_step and samples_per_task must be at least 1")
        if self.critic_warmup_steps < 0:
            raise UsageError(f"critic_warmup_steps must be 0 or more, got {self.critic_warmup_steps}")


@dataclass
class PPOResult:
    checkpoint: Path
    log: list[dict[str, Any]]  # one entry per step (see `LOGGED`)
    stored: int = 0  # rollout rows appended to the store
    main: bool = True  # this is the main process (the one that reports, when several run)


LOGGED = ("policy_loss", "value_loss", "explained_variance", "clip_fraction", "value_clip_fraction", "approx_kl",
          "entropy", "reward", "success", "kl_ref")


# ---------------------------------------------------------------- rollouts

def _play(recipe: PPORecipe, model: Any, tokenizer: Any, tasks: list[Any], pool: Any, step: int,
          run_id: str, rng: random.Random, procs: Any) -> list[Any]:
    import asyncio

    from omrl.policies.hf import HFPolicy
    from omrl.rollout import episode_seed, play_episodes

    chosen = rng.sample(tasks, recipe.tasks_per_step)
    # Every process draws the same tasks (same rng) and plays its share: the batch is played once.
    jobs = procs.share([(task, sample) for task in chosen for sample in range(recipe.samples_per_task)])
    base = recipe.rollout
    settings = replace(base, seed=episode_seed(base.seed, f"ppo/round-{recipe.round}", step),
                       concurrency=max(base.concurrency, len(jobs)))
    options = {"max_new_tokens": settings.max_new_tokens} if settings.max_new_tokens else {}
    policy = HFPolicy(model, tokenizer, name=f"{recipe.run_name}@round{recipe.round}", **options)
    metadata = {"ppo_step": step, "ppo_round": recipe.round, "ppo_process": procs.rank}
    return asyncio.run(play_episodes(jobs, pool.make, policy, settings, run_id=run_id, round=recipe.round,
                                     source="collected:ppo", metadata=metadata, pool=pool))


# ---------------------------------------------------------------- the run

def train_ppo(recipe: PPORecipe | dict[str, Any]) -> PPOResult:
    """Run PPO as the recipe says (one process, or each process of `accelerate launch`/`torchrun` its share);
    return the checkpoint folder and the per-step log (the same on every process)."""
    import asyncio
    import copy

    import torch
    from accelerate import Accelerator
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omrl.rollout import EnvPool, env_factory, env_pool
    from omrl.tasks import load_tasks
    from omrl.train.rollout_func import free_run_prefix

    if isinstance(recipe, dict):
        from omrl.recipes import from_dict

        recipe = from_dict(PPORecipe, recipe, where="ppo")
    tasks = load_tasks(recipe.tasks, split=recipe.split)
    if len(tasks) < recipe.tasks_per_step:
        raise UsageError(f"{recipe.tasks}: {len(tasks)} tasks"
                         + (f" in split {recipe.split!r}" if recipe.split else "")
                         + f", fewer than tasks_per_step={recipe.tasks_per_step}")
    torch.manual_seed(recipe.seed)
    device = "cpu" if (recipe.use_cpu if recipe.use_cpu is not None else not torch.cuda.is_available()) else "cuda"
    if device != "cpu":
        raise UsageError("train_ppo runs on the CPU only in this build (use_cpu=true); GPU placement is not wired")
    accelerator = Accelerator(cpu=True)
    procs = ppo_update.Processes(accelerator)
    episodes_per_step = recipe.tasks_per_step * recipe.samples_per_task
    if episodes_per_step < procs.count:
        raise UsageError(f"{episodes_per_step} episodes per step (tasks_per_step x samples_per_task) for "
                         f"{procs.count} processes: every process needs at least one")
    tokenizer = AutoTokenizer.from_pretrained(recipe.model)
    policy = AutoModelForCausalLM.from_pretrained(recipe.model)
    critic = ppo_update.make_critic(recipe, policy)
    # eval: no dropout, so the old and new logprobs of one batch agree before the first update
    model = accelerator.prepare(ppo_update.actor_critic(policy, critic).eval())
    reference = None
    if recipe.beta > 0:
        reference = copy.deepcopy(policy).requires_grad_(False)
    params = [p for p in accelerator.unwrap_model(model).parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.learning_rate)
    warmup = max(recipe.warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warmup + 1)))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    store = None
    prefix = f"{recipe.run_name}/round-{recipe.round}"
    if recipe.store:
        from omrl.store import Store

        if procs.main:
            store = Store.create(recipe.store, exist_ok=True)
            prefix = free_run_prefix(store, prefix)
        # One prefix for all, chosen before any process stores this run's rows (they would look like an earlier run's).
        prefix = procs.from_main(prefix)
        if store is None:
            store = Store.create(recipe.store, exist_ok=True)
    # Reusable engines (JVMs, game interpreters) are kept across steps: started once, not every step
    # (inside omrl.rollout.shared_engines(), the block's pool, kept for the calls after this run too).
    pool, owned = env_pool(recipe.rollout.env, recipe.rollout.env_options)
    pool = pool or EnvPool(env_factory(recipe.rollout.env, recipe.rollout.env_options))
    try:
        log, stored, statuses = _steps(recipe, model, reference, optimizer, scheduler, policy, tokenizer, tasks, pool,
                                       store, prefix, pad_id, procs)
    finally:
        if owned:
            asyncio.run(pool.close())
    digests = procs.gather(ppo_update.digest(accelerator.unwrap_model(model)))
    shares = procs.gather({"stored": stored, "statuses": statuses})
    stored = sum(s["stored"] for s in shares)
    totals: dict[str, int] = {}
    for share in shares:
        for status, n in share["statuses"].items():
            totals[status] = totals.get(status, 0) + n
    out = Path(recipe.output_dir)
    if procs.main:
        out.mkdir(parents=True, exist_ok=True)
        policy.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        critic_dir = out / "critic"
        critic_dir.mkdir(exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in critic.head.state_dict().items()},
                  str(critic_dir / "value_head.safetensors"))
        if critic.trunk is not None:
            critic.trunk.save_pretrained(str(critic_dir))
        (out / "omrl_ppo.json").write_text(json.dumps({
            "recipe": asdict(recipe), "log": log,
            "rollouts": {"stored": stored, "statuses": totals, "run_prefix": prefix},
            "processes": {"count": procs.count, "parameter_sha256": digests}}, indent=1, default=str))
    accelerator.wait_for_everyone()  # no process returns before the checkpoint is on disk
    return PPOResult(checkpoint=out, log=log, stored=stored, main=procs.main)


def _steps(recipe: PPORecipe, model: Any, reference: Any, optimizer: Any, scheduler: Any, policy: Any, tokenizer: Any,
           tasks: list[Any], pool: Any, store: Any, prefix: str, pad_id: int, procs: Any
           ) -> tuple[list[dict[str, Any]], int, dict[str, int]]:
    """The PPO steps: play, store, update; returns the per-step log, rows stored and episode statuses."""
    import torch

    rng = random.Random(f"ppo-{recipe.seed}")
    generator = torch.Generator().manual_seed(recipe.seed)
    log: list[dict[str, Any]] = []
    stored = 0
    statuses: dict[str, int] = {}
    for step in range(recipe.max_steps):
        started = time.monotonic()
        episodes = _play(recipe, policy, tokenizer, tasks, pool, step, f"{prefix}/step-{step:05d}", rng, procs)
        played = time.monotonic() - started
        if store is not None and episodes:
            store.append([e.row for e in episodes])  # this process's own episodes (the store's lock orders appends)
            stored += len(episodes)
        for episode in episodes:
            statuses[episode.status] = statuses.get(episode.status, 0) + 1
        batch, failed = ppo_update.episodes_to_batch(episodes, pad_id)
        trainable = int(procs.sum(torch.tensor(0 if batch is None else batch.mask.shape[0])))
        if trainable == 0:
            first = episodes[0].row if episodes else {"status": "none", "error": "no episodes"}
            raise RuntimeError(f"PPO step {step}: all {len(episodes)} rollouts failed; first error "
                               f"({first['status']}): {first['error']}")
        stats = ppo_update.update(recipe, model, reference, optimizer,
                                  batch if batch is not None else ppo_update.empty_batch(pad_id), generator, procs,
                                  train_policy=step >= recipe.critic_warmup_steps)
        counts = procs.sum(torch.tensor([len(episodes), failed]))
        stats = {"step": step, **stats, "policy_trained": step >= recipe.critic_warmup_steps,
                 "episodes": int(counts[0]), "failed": int(counts[1]),
                 "learning_rate": optimizer.param_groups[0]["lr"], "rollout_s": round(float(procs.max(
                     torch.tensor(played))), 3), "step_s": round(time.monotonic() - started, 3)}
        scheduler.step()
        log.append(stats)
        if procs.main and not recipe.quiet and (step % max(recipe.logging_steps, 1) == 0
                                                or step == recipe.max_steps - 1):
            print(f"ppo step {step}: " + ", ".join(f"{k} {_fmt(stats.get(k))}" for k in LOGGED
                                                   if k != "kl_ref" or recipe.beta > 0), flush=True)

    return log, stored, statuses


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)
