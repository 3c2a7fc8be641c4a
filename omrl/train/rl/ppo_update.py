"""The PPO update of omrl.train.algorithms.ppo: the critic, batches of token traces, the forward pass, the clipped losses and
one step's epochs over a batch, on one process or each of several (accelerate).

    batch, failed = episodes_to_batch(episodes, pad_id)     # played by omrl.rollout.play_episodes
    stats = update(recipe, model, reference, optimizer, batch, generator, Processes(accelerator))

`recipe` is an omrl.train.algorithms.ppo.PPORecipe; train_ppo (omrl/train/algorithms/ppo.py) runs the steps and says what each does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------- the critic and the forward pass

def make_critic(recipe: Any, policy: Any):
    """The recipe's critic: a zero-initialised value head on the policy's trunk ("head") or on its own model."""
    import torch
    from transformers import AutoModel

    from omrl.models.load import load_model
    from omrl.models.real import resolve_model

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
    trunk = load_model(resolve_model(recipe.critic_model or recipe.model), AutoModel)
    return Critic(trunk.config.hidden_size, trunk)


@dataclass
class Batch:
    """One step's trainable episodes as padded tensors, with their episode rewards and outcomes."""

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


def collate(traces: list[dict[str, list]], rewards: list[list[float]], terminal: list[float], pad_id: int,
             episode_reward: list[float], success: list[bool | None]) -> Batch:
    """Token traces as one padded batch (prompts left-padded, completions right-padded), turn rewards placed."""
    import torch

    from omrl.train.rl.gae import place_turn_rewards

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
    return Batch(input_ids, attention, positions, completion, mask, placed, sampled, width, episode_reward, success)


def inputs(batch: Batch, rows: Any) -> tuple[Any, ...]:
    """The model inputs of `rows` of the batch: ids, attention, positions, completion ids and prompt width."""
    return (batch.input_ids[rows], batch.attention[rows], batch.positions[rows], batch.completion[rows],
            batch.prompt_width)


def forward(policy: Any, critic: Any, ids: Any, att: Any, pos: Any, completion: Any, width: int,
            temperature: float, with_values: bool = True, chunk: int = 0):
    """Logprobs and entropies of the completion tokens under `policy`, and the critic's values: [b, C] each.
    With `chunk` > 0 the completion tokens are scored `chunk` at a time (chunked_logprobs): the same numbers
    without the batch's full-vocabulary logits."""
    import torch

    shared = critic is not None and critic.trunk is None and with_values
    start, length = width - 1, completion.shape[1]  # position i predicts token i + 1
    if chunk > 0:
        causal_lm = policy.get_base_model() if hasattr(policy, "get_base_model") else policy  # peft: the LoRA'd model
        hidden = causal_lm.base_model(input_ids=ids, attention_mask=att, position_ids=pos,
                                      use_cache=False).last_hidden_state
        logprobs, entropy = chunked_logprobs(hidden[:, start: start + length], causal_lm.get_output_embeddings(),
                                             completion, temperature, chunk)
    else:
        out = policy(input_ids=ids, attention_mask=att, position_ids=pos, output_hidden_states=shared,
                     use_cache=False)
        logits = out.logits[:, start: start + length].float() / temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        logprobs = logp_all.gather(-1, completion.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        hidden = out.hidden_states[-1] if shared else None
    values = None
    if with_values and critic is not None:
        if not shared:
            hidden = critic.trunk(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=False).last_hidden_state
        values = critic.head(hidden[:, start: start + length].float()).squeeze(-1)
    return logprobs, entropy, values


def chunked_logprobs(hidden: Any, lm_head: Any, tokens: Any, temperature: float, chunk: int):
    """Logprobs of `tokens` [b, C] and the entropies of their distributions from the hidden states before them
    [b, C, H], `chunk` tokens at a time; each chunk's vocabulary logits are recomputed in the backward pass
    (activation checkpointing), so at most `chunk` x vocabulary logits are held at once."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def score(h, t):
        logp_all = torch.log_softmax(lm_head(h).float() / temperature, dim=-1)
        return logp_all.gather(-1, t.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)

    flat, labels = hidden.reshape(-1, hidden.shape[-1]), tokens.reshape(-1)
    parts = [checkpoint(score, flat[i: i + chunk], labels[i: i + chunk], use_reentrant=False)
             if torch.is_grad_enabled() else score(flat[i: i + chunk], labels[i: i + chunk])
             for i in range(0, flat.shape[0], chunk)]
    logprobs = torch.cat([p[0] for p in parts]) if parts else flat.new_zeros(0)
    entropy = torch.cat([p[1] for p in parts]) if parts else flat.new_zeros(0)
    return logprobs.view(tokens.shape), entropy.view(tokens.shape)


def actor_critic(policy: Any, critic: Any, chunk: int = 0):
    """The policy and its critic as one module: one DDP wrapper then averages the gradients of both."""
    import torch

    class ActorCritic(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.policy, self.critic = policy, critic

        def forward(self, ids, att, pos, completion, width, temperature):
            return forward(self.policy, self.critic, ids, att, pos, completion, width, temperature, chunk=chunk)

    return ActorCritic()


def checkpoint_layers(policy: Any) -> None:
    """Recompute the policy's decoder layers' activations in the backward pass. transformers checkpoints a layer
    only in training mode, and PPO trains in eval mode (no dropout: old and new logprobs of a batch agree), so
    only the layers themselves are flagged as training; their dropout and attention modules stay in eval mode."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    policy.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    for module in policy.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module.training = True


class Processes:
    """The run's processes (accelerate): this one's rank, their number, and sums/maxima over all of them."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self.rank, self.count = accelerator.process_index, accelerator.num_processes
        self.main = accelerator.is_main_process

    def sum(self, tensor: Any) -> Any:
        """`tensor` summed over the processes (a new tensor; no gradient)."""
        return self._reduce(tensor, "SUM")

    def total(self, n: int) -> int:
        """The integer `n` summed over the processes."""
        import torch

        return int(self.sum(torch.tensor(n)))

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


def episodes_to_batch(episodes: list[Any], pad_id: int) -> tuple[Batch | None, int]:
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
    return collate(traces, rewards, terminal, pad_id, totals, success), len(episodes) - len(traces)


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


def empty_batch(pad_id: int) -> Batch:
    """One masked pad token: a process whose episodes all failed still joins every gradient all-reduce."""
    trace = {"prompt_ids": [pad_id], "completion_ids": [pad_id], "env_mask": [0], "logprobs": [0.0]}
    return collate([trace], [[]], [0.0], pad_id, [], [])


def update(recipe: Any, model: Any, reference: Any, optimizer: Any, batch: Batch, generator: Any,
            procs: Processes, train_policy: bool = True) -> dict[str, float]:
    """`ppo_epochs` passes of clipped PPO over this process's episodes; statistics over all processes'.
    With train_policy False (critic warm-up) only the critic's parameters move: the policy's gradients,
    from the value loss through a shared trunk included, are dropped before each optimizer step. With
    recipe.target_kl set, the batch's updates stop before the step of the first minibatch whose approximate
    KL to the rollout policy (over all processes) exceeds 1.5 x target_kl."""
    import torch

    from omrl.train.rl.gae import explained_variance, gae, masked_whiten

    temperature = recipe.rollout.temperature or 1.0
    net = procs.accelerator.unwrap_model(model)
    everything = torch.arange(batch.mask.shape[0])
    mask = batch.mask
    with torch.no_grad():
        old_logp, _, old_values = net(*inputs(batch, everything), temperature)
        rewards = batch.rewards.clone()
        kl_sum = torch.zeros(())
        if reference is not None:
            ref_logp, _, _ = forward(reference, None, *inputs(batch, everything), temperature, with_values=False,
                                     chunk=recipe.logprob_chunk)
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
    stopped = False
    for _ in range(recipe.ppo_epochs):
        if stopped:
            break
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
            logp, entropy, values = model(*inputs(batch, rows), temperature)
            policy_loss, value_loss, stats = ppo_losses(
                logp, old_logp[rows], advantages[rows], m, values, old_values[rows], returns[rows], vm,
                recipe.clip_range, recipe.clip_range_value, counts=(tokens, value_tokens))
            if train_policy and recipe.target_kl is not None and \
                    float(procs.sum(torch.tensor(stats["approx_kl"]))) > 1.5 * recipe.target_kl:
                stopped = True  # every process sees the same all-reduced KL: all stop at this minibatch
                break
            mean_entropy = (entropy * m).sum() / tokens
            loss = recipe.vf_coef * value_loss
            if train_policy:
                loss = loss + policy_loss - recipe.entropy_coef * mean_entropy
            optimizer.zero_grad(set_to_none=True)
            # DDP averages gradients over processes; each loss is this process's share of the batch mean.
            procs.accelerator.backward(loss * procs.count)
            if not train_policy:
                for p in net.policy.parameters():
                    p.grad = None  # AdamW skips a parameter without a gradient: the policy stays as it is
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
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


def digest(module: Any) -> str:
    """sha256 of every parameter's bytes, in name order: equal digests, identical copies."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, param in sorted(module.named_parameters()):
        h.update(name.encode())
        h.update(param.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
