"""PPO for multi-turn agents: omrl's episode runner plays, a critic values, GAE skips the environment's tokens.

    result = train_ppo(PPORecipe(model="runs/sft", tasks="datasets/tasks/grid_train.jsonl",
                                 output_dir="runs/ppo", store="runs/ppo-store", level="turn"))
    result.checkpoint, result.history[-1]["reward"]           # an omrl.train.trainer.TrainResult

Each step:
1. Rollouts: `tasks_per_step` tasks x `samples_per_task` episodes played by the RL trainers' one rollout
   step (omrl/train/data/rollout_step.py: omrl.rollout.play_episodes, storing, the all-failed stop) with an
   HFPolicy wrapping the live model; their rows are appended to the store (run
   `<run_name>/round-<round>/step-<step>`, source `collected:ppo`), as GRPO's are.
2. Token traces (omrl.policies.hf.token_trace): the model's tokens (env_mask 1) and the environment's
   and template's tokens between turns (0). Each turn's reward goes on the turn's last trainable token;
   a reward the turns do not carry (the episode's reward minus theirs) on the last trainable token.
3. One no-grad pass gives the old logprobs (at the rollout temperature, as sampled), the old values
   and, with beta > 0, the reference model's logprobs: the KL penalty beta * (logp - ref_logp) is
   taken from each trainable token's reward (TRL's PPO does the same).
4. GAE (omrl/train/rl/gae.py) at `token` or `turn` level; environment tokens get no advantage, no value
   loss and do not break the recursion. Advantages are whitened over trainable tokens.
5. `ppo_epochs` passes over the batch in `minibatches`: clipped surrogate, clipped value loss,
   optional entropy bonus; token-mean losses; one AdamW over policy and critic, grad-norm clipped.
   Steps 2-5 are omrl/train/rl/ppo_update.py; this module plays the rollouts and runs the steps.

The critic is a linear value head on the policy's last hidden state (`critic: head`, shares the trunk)
or a separate model (`critic: separate`, from `critic_model`, default the starting checkpoint) with its
own head. A token's value is read from the hidden state before it (the state it was sampled in).
With `lora.enabled` the policy is wrapped in peft's LoRA: only its adapters (and the critic) train, the
adapter is saved in output_dir/adapter and, with `lora.merge`, merged into output_dir's checkpoint
(omrl.models.adapters); a separate critic's trunk still trains whole. Memory: `gradient_checkpointing`
recomputes the policy's layers in the backward pass; `logprob_chunk` scores the completion tokens in chunks
whose vocabulary logits are recomputed in the backward pass (ppo_update.chunked_logprobs).
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.progress import QUIET, Reporter
from omrl.train.config.ppo import PPORecipe
from omrl.train.rl import ppo_update
from omrl.train.trainer import Trainer, TrainResult

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
    from transformers import AutoTokenizer

    from omrl.models.adapters import save_checkpoint
    from omrl.models.load import load_model
    from omrl.models.real import resolve_model
    from omrl.rollout.checkpoint_settings import save_rollout_settings
    from omrl.tasks import load_tasks
    from omrl.train.data.rollout_step import RolloutStep

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
    policy = load_model(path)
    if recipe.lora.enabled:  # only the adapters (and the critic) train
        from peft import get_peft_model

        policy = get_peft_model(policy, recipe.lora.peft_config())
    critic = ppo_update.make_critic(recipe, policy)
    # eval: no dropout, so the old and new logprobs of one batch agree before the first update
    model = accelerator.prepare(ppo_update.actor_critic(policy, critic, recipe.logprob_chunk).eval())
    if recipe.gradient_checkpointing:
        ppo_update.checkpoint_layers(policy)
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
        # with LoRA: out/adapter, and the merged policy at out when lora.merge (merges `policy` in place)
        save_checkpoint(policy, tokenizer, out, merge=recipe.lora.merge)
        critic_dir = out / "critic"
        critic_dir.mkdir(exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in critic.head.state_dict().items()},
                  str(critic_dir / "value_head.safetensors"))
        if critic.trunk is not None:
            critic.trunk.save_pretrained(str(critic_dir))
        (out / "omrl_ppo.json").write_text(json.dumps({
            "recipe": asdict(recipe), "log": log, "rollouts": summary, "processes": processes},
            indent=1, default=str))
        save_rollout_settings(out, recipe.rollout, trainer="ppo")  # what `omrl eval --policy hf:OUT` plays with
    accelerator.wait_for_everyone()  # no process returns before the checkpoint is on disk
    last = log[-1] if log else {}
    return TrainResult("ppo", out, steps=len(log), wall_s=time.monotonic() - started, history=log,
                       rollouts=summary, details={"processes": processes}, main=procs.main,
                       summary=f"{len(log)} steps, {stored} rollouts stored; last reward {last.get('reward')}, "
                               f"success {last.get('success')}")


def _steps(recipe: PPORecipe, model: Any, reference: Any, optimizer: Any, scheduler: Any, policy: Any, tokenizer: Any,
           tasks: list[Any], rollouts: Any, pad_id: int, procs: Any, reporter: Reporter) -> list[dict[str, Any]]:
    """The PPO steps: play and store (`rollouts`, omrl.train.data.rollout_step), update; returns the per-step log."""
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

    Example:  omrl train ppo --recipe shipped:ppo_grid level=turn max_steps=20
    """)
