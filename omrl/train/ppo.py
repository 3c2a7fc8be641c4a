"""PPO for multi-turn agents: omrl's episode runner plays, a critic values, GAE skips the environment's tokens.

    result = train_ppo(PPORecipe(model="runs/sft", tasks="datasets/tasks/grid_train.jsonl",
                                 output_dir="runs/ppo", store="runs/ppo-store", level="turn"))
    result.checkpoint, result.history[-1]["reward"]           # an omrl.train.trainer.TrainResult

Each step:
1. Rollouts: `tasks_per_step` tasks x `samples_per_task` episodes played by the RL trainers' one rollout
   step (omrl/train/rollout_step.py: omrl.rollout.play_episodes, storing, the all-failed stop) with an
   HFPolicy wrapping the live model; their rows are appended to the store (run
   `<run_name>/round-<round>/step-<step>`, source `collected:ppo`), as GRPO's are.
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
are over all processes' samples; the main process reports, saves the checkpoint and writes omrl_ppo.json
(with each process's parameter digest: equal digests show the copies stayed identical). The TrainResult's
`history` is the per-step log (the same on every process), `details` the processes' count and digests.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.progress import QUIET, Reporter
from omrl.rollout import RolloutSettings
from omrl.train import ppo_update
from omrl.train.trainer import Trainer, TrainResult

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
    target_kl: float | None = field(default=None, metadata={
        "help": "stop a batch's remaining updates once a minibatch's approximate KL to the rollout policy exceeds "
                "1.5 x target_kl (null: every epoch and minibatch runs)"})
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
        if self.target_kl is not None and not self.target_kl > 0:
            raise UsageError(f"target_kl must be above 0 (or null), got {self.target_kl}")


LOGGED = ("policy_loss", "value_loss", "explained_variance", "clip_fraction", "value_clip_fraction", "approx_kl",
          "entropy", "reward", "success", "kl_ref")


# ---------------------------------------------------------------- rollouts

def _jobs(recipe: PPORecipe, tasks: list[Any], rng: random.Random, procs: Any) -> list[tuple[Any, int]]:
    """This process's share of the step's (task, sample) episodes: `tasks_per_step` tasks drawn by `rng`
    (every process draws the same: the batch is played once), `samples_per_task` each."""
    chosen = rng.sample(tasks, recipe.tasks_per_step)
    return procs.share([(task, sample) for task in chosen for sample in range(recipe.samples_per_task)])


# ---------------------------------------------------------------- the run

def train_ppo(recipe: PPORecipe | dict[str, Any], *, store: Any = None,
              reporter: Reporter | None = None) -> TrainResult:
    """Run PPO as the recipe says (one process, or each process of `accelerate launch`/`torchrun` its share),
    its rollouts into `store` (default the recipe's), its steps shown by `reporter` (the main process's);
    return the checkpoint and the per-step log (the same on every process): omrl.train.trainer's contract."""
    import copy

    import torch
    from accelerate import Accelerator
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omrl.models.real import resolve_model
    from omrl.tasks import load_tasks
    from omrl.train.rollout_step import RolloutStep

    if isinstance(recipe, dict):
        from omrl.config import from_dict

        recipe = from_dict(PPORecipe, recipe, where="ppo")
    started = time.monotonic()
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
    path = resolve_model(recipe.model)  # a known name (hf:NAME) -> its folder in omrl's model cache
    tokenizer = AutoTokenizer.from_pretrained(path)
    policy = AutoModelForCausalLM.from_pretrained(path)
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

    reporter = (reporter or QUIET) if procs.main else QUIET  # the main process reports for all
    rollouts = RolloutStep(recipe, "ppo", store=store, reporter=reporter, processes=procs)
    reporter.start("ppo", total=recipe.max_steps)
    try:
        log = _steps(recipe, model, reference, optimizer, scheduler, policy, tokenizer, tasks, rollouts, pad_id,
                     procs, reporter)
    finally:
        rollouts.close()
        reporter.finish()
    digests = procs.gather(ppo_update.digest(accelerator.unwrap_model(model)))
    shares = procs.gather({"stored": rollouts.stored, "statuses": rollouts.statuses})
    stored = sum(s["stored"] for s in shares)
    totals: dict[str, int] = {}
    for share in shares:
        for status, n in share["statuses"].items():
            totals[status] = totals.get(status, 0) + n
    out = Path(recipe.output_dir)
    summary = {"stored": stored, "statuses": totals, "run_prefix": rollouts.run_prefix}
    processes = {"count": procs.count, "parameter_sha256": digests}
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
            "recipe": asdict(recipe), "log": log, "rollouts": summary, "processes": processes},
            indent=1, default=str))
    accelerator.wait_for_everyone()  # no process returns before the checkpoint is on disk
    last = log[-1] if log else {}
    return TrainResult("ppo", out, steps=len(log), wall_s=time.monotonic() - started, history=log,
                       rollouts=summary, details={"processes": processes}, main=procs.main,
                       summary=f"{len(log)} steps, {stored} rollouts stored; last reward {last.get('reward')}, "
                               f"success {last.get('success')}")


def _steps(recipe: PPORecipe, model: Any, reference: Any, optimizer: Any, scheduler: Any, policy: Any, tokenizer: Any,
           tasks: list[Any], rollouts: Any, pad_id: int, procs: Any, reporter: Reporter) -> list[dict[str, Any]]:
    """The PPO steps: play and store (`rollouts`, omrl.train.rollout_step), update; returns the per-step log."""
    import torch

    from omrl.policies.hf import HFPolicy

    rng = random.Random(f"ppo-{recipe.seed}")
    generator = torch.Generator().manual_seed(recipe.seed)
    log: list[dict[str, Any]] = []
    for step in range(recipe.max_steps):
        started = time.monotonic()
        jobs = _jobs(recipe, tasks, rng, procs)
        settings = rollouts.settings(step, len(jobs))
        options = {"max_new_tokens": settings.max_new_tokens} if settings.max_new_tokens else {}
        episodes = rollouts.run(step, jobs, HFPolicy(policy, tokenizer, name=rollouts.policy_name, **options)).episodes
        played = time.monotonic() - started
        batch, failed = ppo_update.episodes_to_batch(episodes, pad_id)
        trainable = procs.total(0 if batch is None else batch.mask.shape[0])
        if trainable == 0:  # every rollout ended, none with a reward and a token to train on
            first = episodes[0].row if episodes else {"status": "none", "error": "no episodes"}
            raise RuntimeError(f"PPO step {step}: none of {len(episodes)} rollouts has a reward and a sampled "
                               f"token; first ({first['status']}): {first['error']}")
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
        reporter.advance(1, reward=stats.get("reward"), policy_loss=stats.get("policy_loss"))
        if not recipe.quiet and (step % max(recipe.logging_steps, 1) == 0 or step == recipe.max_steps - 1):
            reporter.log(f"ppo step {step}: " + ", ".join(f"{k} {_fmt(stats.get(k))}" for k in LOGGED
                                                          if k != "kl_ref" or recipe.beta > 0))
    return log


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


TRAINER = Trainer("ppo", PPORecipe, train_ppo, """PPO for multi-turn agents: a critic, GAE over tokens or turns (env tokens skipped), rollouts stored.

    Example:  omrl train ppo --recipe recipes/ppo_grid.yaml level=turn max_steps=20
    """)
