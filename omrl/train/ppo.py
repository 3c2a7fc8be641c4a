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

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "ppo") -> PPORecipe:
        from omrl.recipes import from_dict

        return from_dict(cls, values, where=where)

    def __post_init__(self) -> None:
        from omrl.train.gae import LEVELS

        if self.level not in LEVELS:
            raise UsageError(f"level must be one of {', '.join(LEVELS)}, got {self.level!r}")
        if self.critic not in CRITICS:
            raise UsageError(f"critic must be one of {', '.join(CRITICS)}, got {self.critic!r}")
        if self.ppo_epochs < 1 or self.minibatches < 1 or self.tasks_per_step < 1 or self.samples_per_task < 1:
            raise UsageError("ppo_epochs, minibatches, tasks_per_step and samples_per_task must be at least 1")


@dataclass
class PPOResult:
    checkpoint: Path
    log: list[dict[str, Any]]  # one entry per step (see `LOGGED`)
    stored: int = 0  # rollout rows appended to the store
    main: bool = True  # this is the main process (the one that reports, when several run)


LOGGED = ("policy_loss", "value_loss", "explained_variance", "clip_fraction", "value_clip_fraction", "approx_kl",
          "entropy", "reward", "success", "kl_ref")


# ---------------------------------------------------------------- the critic and the forward pass

def _make_critic(recipe: PPORecipe, policy: Any):
    import torch
    from transformers import AutoModel

    class Critic(torch.nn.Module):
        """A value head, on the policy's hidden state (trunk None) or on a trunk of its own."""

        def __init__(self, hidden: int, trunk: Any = None) -> None:
            super().__init__()
            self.trunk = trunk
            self.head = torch.nn.Linear(hidden, 1)
            torch.nn.init.zeros_(self.head.weight)  # values start at 0: no made-up baseline at step 0
            torch.nn.init.zeros_(self.head.bias)

    if recipe.critic == "head":
        return Critic(policy.config.hidden_size)
    trunk = AutoModel.from_pretrained(recipe.critic_model or recipe.model)
    return Critic(trunk.config.hidden_size, trunk)


@dataclass
class _Batch:
    input_ids: Any  # [B, P + C]: prompts left-padded to P, completions right-padded to C
    attention: Any
    positions: Any
    completion: Any  # [B, C]
    mask: Any  # [B, C] float: 1 on the model's tokens
    rewards: Any  # [B, C] placed turn rewards
    sampled_logprobs: Any  # [B, C] the logprobs the policy reported while sampling (0 on env tokens)
    prompt_width: int
    episode_reward: list[float]
    success: list[bool | None]


def _collate(traces: list[dict[str, list]], rewards: list[list[float]], terminal: list[float], pad_id: int,
             episode_reward: list[float], success: list[bool | None]) -> _Batch:
    import torch

    from omrl.train.gae import place_turn_rewards

    width = max(len(t["prompt_ids"]) for t in traces)
    length = max(len(t["completion_ids"]) for t in traces)
    n = len(traces)
    input_ids = torch.full((n, width + length), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width + length), dtype=torch.long)
    completion = torch.full((n, length), pad_id, dtype=torch.long)
    mask = torch.zeros((n, length))
    sampled = torch.zeros((n, length))
    for row, trace in enumerate(traces):
        prompt, done = trace["prompt_ids"], trace["completion_ids"]
        input_ids[row, width - len(prompt): width] = torch.tensor(prompt)
        input_ids[row, width: width + len(done)] = torch.tensor(done)
        attention[row, width - len(prompt): width + len(done)] = 1
        completion[row, : len(done)] = torch.tensor(done)
        mask[row, : len(done)] = torch.tensor(trace["env_mask"], dtype=torch.float32)
        sampled[row, : len(done)] = torch.tensor(trace["logprobs"], dtype=torch.float32)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    placed = place_turn_rewards(mask, rewards, terminal)
    return _Batch(input_ids, attention, positions, completion, mask, placed, sampled, width, episode_reward, success)


def _inputs(batch: _Batch, rows: Any) -> tuple[Any, ...]:
    """The model inputs of `rows` of the batch: ids, attention, positions, completion ids and prompt width."""
    return (batch.input_ids[rows], batch.attention[rows], batch.positions[rows], batch.completion[rows],
            batch.prompt_width)


def _forward(policy: Any, critic: Any, ids: Any, att: Any, pos: Any, completion: Any, width: int,
             temperature: float, with_values: bool = True):
    """Logprobs and entropies of the completion tokens under `policy`, and the critic's values: [b, C] each."""
    import torch

    shared = critic is not None and critic.trunk is None and with_values
    out = policy(input_ids=ids, attention_mask=att, position_ids=pos, output_hidden_states=shared, use_cache=False)
    start, length = width - 1, completion.shape[1]
    logits = out.logits[:, start: start + length].float() / temperature  # position i predicts token i + 1
    logp_all = torch.log_softmax(logits, dim=-1)
    logprobs = logp_all.gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    values = None
    if with_values and critic is not None:
        if shared:
            hidden = out.hidden_states[-1]
        else:
            hidden = critic.trunk(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=False).last_hidden_state
        values = critic.head(hidden[:, start: start + length].float()).squeeze(-1)
    return logprobs, entropy, values


def _actor_critic(policy: Any, critic: Any):
    """The policy and its critic as one module: one DDP wrapper then averages the gradients of both."""
    import torch

    class ActorCritic(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.policy, self.critic = policy, critic

        def forward(self, ids, att, pos, completion, width, temperature):
            return _forward(self.policy, self.critic, ids, att, pos, completion, width, temperature)

    return ActorCritic()


class _Processes:
    """The run's processes (accelerate): this one's rank, their number, and sums/maxima over all of them."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self.rank, self.count = accelerator.process_index, accelerator.num_processes
        self.main = accelerator.is_main_process

    def sum(self, tensor: Any) -> Any:
        """`tensor` summed over the processes (a new tensor; no gradient)."""
        return self._reduce(tensor, "SUM")

    def max(self, tensor: Any) -> Any:
        return self._reduce(tensor, "MAX")

    def _reduce(self, tensor: Any, op: str) -> Any:
        out = tensor.detach().clone()
        if self.count > 1:
            import torch.distributed as dist

            dist.all_reduce(out, op=getattr(dist.ReduceOp, op))
        return out

    def share(self, jobs: list[Any]) -> list[Any]:
        """This process's contiguous share of `jobs` (shares differ in size by at most one)."""
        n = len(jobs)
        return jobs[self.rank * n // self.count: (self.rank + 1) * n // self.count]

    def gather(self, value: Any) -> list[Any]:
        """Every process's `value`, in rank order."""
        if self.count == 1:
            return [value]
        from accelerate.utils import gather_object

        return gather_object([value])

    def from_main(self, value: Any) -> Any:
        """The main process's `value`, on every process."""
        if self.count == 1:
            return value
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([value])[0]


# ---------------------------------------------------------------- rollouts

def _play(recipe: PPORecipe, model: Any, tokenizer: Any, tasks: list[Any], make_env: Any, step: int,
          run_id: str, rng: random.Random, procs: _Processes) -> list[Any]:
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
    return asyncio.run(play_episodes(jobs, make_env, policy, settings, run_id=run_id, round=recipe.round,
                                     source="collected:ppo", metadata=metadata))


def _episodes_to_batch(episodes: list[Any], pad_id: int) -> tuple[_Batch | None, int]:
    """The trainable episodes as a batch (None if there is none) and how many were left out (failed)."""
    from omrl.policies.hf import token_trace
    from omrl.schema import is_failed

    traces, rewards, terminal, totals, success = [], [], [], [], []
    for episode in episodes:
        row = episode.row
        trace = token_trace(episode.context)
        if is_failed(row["status"]) or row["reward"] is None or not trace or not any(trace["env_mask"]):
            continue  # no outcome to learn from: its row is stored, it gets no loss
        turn_rewards = [float(turn["reward"] or 0.0) for turn in row["turns"] or []]
        traces.append(trace)
        rewards.append(turn_rewards)
        terminal.append(float(row["reward"]) - sum(turn_rewards))
        totals.append(float(row["reward"]))
        success.append(row["success"])
    if not traces:
        return None, len(episodes)
    return _collate(traces, rewards, terminal, pad_id, totals, success), len(episodes) - len(traces)


# ---------------------------------------------------------------- the update

def ppo_losses(logp: Any, old_logp: Any, advantages: Any, mask: Any, values: Any, old_values: Any, returns: Any,
               value_mask: Any, clip_range: float = 0.2, clip_range_value: float = 0.2,
               counts: tuple[Any, Any] | None = None):
    """The clipped surrogate (token mean over `mask`) and the clipped value loss (mean over `value_mask`),
    with their statistics. Tokens outside the masks add nothing to either loss nor to their gradients.
    `counts`: the two means' denominators (default the masks' sums); with the whole batch's counts over
    several processes each process's losses and statistics are its share of the batch means (they add up)."""
    import torch

    mask, value_mask = mask.float(), value_mask.float()
    tokens, value_tokens = counts if counts is not None else (mask.sum(), value_mask.sum())

    def mean(x, m, count):
        return (x * m).sum() / max(float(count), 1.0)

    logratio = (logp - old_logp) * mask
    ratio = logratio.exp()
    surrogate = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_range, 1 + clip_range))
    policy_loss = mean(surrogate, mask, tokens)
    delta = values - old_values
    clipped = old_values + delta.clamp(-clip_range_value, clip_range_value)
    value_errors = torch.max((values - returns) ** 2, (clipped - returns) ** 2)
    value_loss = 0.5 * mean(value_errors, value_mask, value_tokens)
    with torch.no_grad():
        stats = {
            "policy_loss": float(policy_loss.detach()), "value_loss": float(value_loss.detach()),
            "clip_fraction": float(mean(((ratio - 1).abs() > clip_range).float(), mask, tokens)),
            "value_clip_fraction": float(mean((delta.abs() > clip_range_value).float(), value_mask, value_tokens)),
            # k3 estimator of KL(old || new) (Schulman): unbiased, never negative
            "approx_kl": float(mean((ratio - 1) - logratio, mask, tokens)),
        }
    return policy_loss, value_loss, stats


def _empty_batch(pad_id: int) -> _Batch:
    """One masked pad token: a process whose episodes all failed still joins every gradient all-reduce."""
    trace = {"prompt_ids": [pad_id], "completion_ids": [pad_id], "env_mask": [0], "logprobs": [0.0]}
    return _collate([trace], [[]], [0.0], pad_id, [], [])


def _update(recipe: PPORecipe, model: Any, reference: Any, optimizer: Any, batch: _Batch, generator: Any,
            procs: _Processes) -> dict[str, float]:
    """`ppo_epochs` passes of clipped PPO over this process's episodes; statistics over all processes'."""
    import torch

    from omrl.train.gae import explained_variance, gae, masked_whiten

    temperature = recipe.rollout.temperature or 1.0
    net = procs.accelerator.unwrap_model(model)
    everything = torch.arange(batch.mask.shape[0])
    mask = batch.mask
    with torch.no_grad():
        old_logp, _, old_values = net(*_inputs(batch, everything), temperature)
        rewards = batch.rewards.clone()
        kl_sum = torch.zeros(())
        if reference is not None:
            ref_logp, _, _ = _forward(reference, None, *_inputs(batch, everything), temperature, with_values=False)
            kl = (old_logp - ref_logp) * mask
            rewards = rewards - recipe.beta * kl
            kl_sum = kl.sum()
        result = gae(rewards, old_values, mask, recipe.gamma, recipe.lam, level=recipe.level)
        advantages = (masked_whiten(result.advantages, mask, reduce=procs.sum) if recipe.whiten_advantages
                      else result.advantages)
        value_mask, returns = result.value_mask, result.returns
        ev = explained_variance(old_values, returns, value_mask, reduce=procs.sum)
        # Training recomputes the logprobs in one padded pass; they must match what was sampled.
        logprob_gap = procs.max((old_logp - batch.sampled_logprobs).abs().mul(mask).max())

    shares: dict[str, float] = {}  # this process's shares of each update's batch means, summed over updates
    grad_norms: list[float] = []
    for _ in range(recipe.ppo_epochs):
        order = torch.randperm(mask.shape[0], generator=generator)
        # Exactly `minibatches` chunks on every process (some may be empty), so all join the same all-reduces.
        for rows in torch.tensor_split(order, recipe.minibatches):
            live = 1.0
            if len(rows) == 0:
                rows, live = order[:1], 0.0  # a forward with no weight: zero gradients, same collectives
            m, vm = mask[rows] * live, value_mask[rows] * live
            tokens, value_tokens = procs.sum(torch.stack([m.sum(), vm.sum()]))
            if tokens == 0:
                continue  # the minibatch is empty on every process: no step (AdamW would move on momentum)
            logp, entropy, values = model(*_inputs(batch, rows), temperature)
            policy_loss, value_loss, stats = ppo_losses(
                logp, old_logp[rows], advantages[rows], m, values, old_values[rows], returns[rows], vm,
                recipe.clip_range, recipe.clip_range_value, counts=(tokens, value_tokens))
            mean_entropy = (entropy * m).sum() / tokens
            loss = policy_loss + recipe.vf_coef * value_loss - recipe.entropy_coef * mean_entropy
            optimizer.zero_grad(set_to_none=True)
            # DDP averages gradients over processes; each loss is this process's share of the batch mean.
            procs.accelerator.backward(loss * procs.count)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, recipe.max_grad_norm)))
            optimizer.step()
            stats["entropy"] = float(mean_entropy.detach())
            for key, value in stats.items():
                shares[key] = shares.get(key, 0.0) + value
    updates = len(grad_norms)  # the same on every process
    keys = ("policy_loss", "value_loss", "clip_fraction", "value_clip_fraction", "approx_kl", "entropy")
    means = procs.sum(torch.tensor([shares.get(k, 0.0) for k in keys], dtype=torch.float64)) / max(updates, 1)
    out = {k: float(v) if updates else float("nan") for k, v in zip(keys, means, strict=True)}
    known = [s for s in batch.success if s is not None]
    totals = procs.sum(torch.tensor([
        sum(batch.episode_reward), len(batch.episode_reward), sum(map(bool, known)), len(known), float(mask.sum()),
        float(kl_sum), float((returns * value_mask).sum()), float((old_values * value_mask).sum()),
        float(value_mask.sum())], dtype=torch.float64)).tolist()
    reward, episodes, solved, judged, trainable, kl_total, return_sum, value_sum, value_count = totals
    out.update(explained_variance=ev, logprob_gap=float(logprob_gap), updates=updates,
               grad_norm=sum(grad_norms) / updates if updates else float("nan"),
               kl_ref=kl_total / episodes if reference is not None and episodes else float("nan"),
               reward=reward / episodes if episodes else float("nan"),
               success=solved / judged if judged else float("nan"), trainable_tokens=int(trainable),
               mean_return=return_sum / max(value_count, 1.0), mean_value=value_sum / max(value_count, 1.0))
    return out


# ---------------------------------------------------------------- the run

def _digest(module: Any) -> str:
    """sha256 of every parameter's bytes, in name order: equal digests, identical copies."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, param in sorted(module.named_parameters()):
        h.update(name.encode())
        h.update(param.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def train_ppo(recipe: PPORecipe | dict[str, Any]) -> PPOResult:
    """Run PPO as the recipe says (one process, or each process of `accelerate launch`/`torchrun` its share);
    return the checkpoint folder and the per-step log (the same on every process)."""
    import copy

    import torch
    from accelerate import Accelerator
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omrl.rollout import env_factory
    from omrl.tasks import load_tasks
    from omrl.train.rollout_func import free_run_prefix

    if isinstance(recipe, dict):
        recipe = PPORecipe.from_dict(recipe)
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
    procs = _Processes(accelerator)
    episodes_per_step = recipe.tasks_per_step * recipe.samples_per_task
    if episodes_per_step < procs.count:
        raise UsageError(f"{episodes_per_step} episodes per step (tasks_per_step x samples_per_task) for "
                         f"{procs.count} processes: every process needs at least one")
    tokenizer = AutoTokenizer.from_pretrained(recipe.model)
    policy = AutoModelForCausalLM.from_pretrained(recipe.model)
    critic = _make_critic(recipe, policy)
    # eval: no dropout, so the old and new logprobs of one batch agree before the first update
    model = accelerator.prepare(_actor_critic(policy, critic).eval())
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
    make_env = env_factory(recipe.rollout.env, recipe.rollout.env_options)
    rng = random.Random(f"ppo-{recipe.seed}")
    generator = torch.Generator().manual_seed(recipe.seed)
    log: list[dict[str, Any]] = []
    stored = 0
    statuses: dict[str, int] = {}
    for step in range(recipe.max_steps):
        started = time.monotonic()
        episodes = _play(recipe, policy, tokenizer, tasks, make_env, step, f"{prefix}/step-{step:05d}", rng, procs)
        played = time.monotonic() - started
        if store is not None and episodes:
            store.append([e.row for e in episodes])  # this process's own episodes (the store's lock orders appends)
            stored += len(episodes)
        for episode in episodes:
            statuses[episode.status] = statuses.get(episode.status, 0) + 1
        batch, failed = _episodes_to_batch(episodes, pad_id)
        trainable = int(procs.sum(torch.tensor(0 if batch is None else batch.mask.shape[0])))
        if trainable == 0:
            first = episodes[0].row if episodes else {"status": "none", "error": "no episodes"}
            raise RuntimeError(f"PPO step {step}: all {len(episodes)} rollouts failed; first error "
                               f"({first['status']}): {first['error']}")
        stats = _update(recipe, model, reference, optimizer, batch if batch is not None else _empty_batch(pad_id),
                        generator, procs)
        counts = procs.sum(torch.tensor([len(episodes), failed]))
        stats = {"step": step, **stats, "episodes": int(counts[0]), "failed": int(counts[1]),
                 "learning_rate": optimizer.param_groups[0]["lr"], "rollout_s": round(float(procs.max(
                     torch.tensor(played))), 3), "step_s": round(time.monotonic() - started, 3)}
        scheduler.step()
        log.append(stats)
        if procs.main and not recipe.quiet and (step % max(recipe.logging_steps, 1) == 0
                                                or step == recipe.max_steps - 1):
            print(f"ppo step {step}: " + ", ".join(f"{k} {_fmt(stats.get(k))}" for k in LOGGED
                                                   if k != "kl_ref" or recipe.beta > 0), flush=True)

    digests = procs.gather(_digest(accelerator.unwrap_model(model)))
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


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)
