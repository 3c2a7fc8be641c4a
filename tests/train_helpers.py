"""Stores of hand-made grid-like SFT data, shared by the training tests and benchmarks/bridge_bench.py."""

from __future__ import annotations

import json
import math
import random

from omrl.schema import Message, ToolCall, Trajectory
from omrl.store import Store

TOOLS = json.dumps([{"type": "function", "function": {"name": "move", "parameters": {
    "type": "object", "properties": {"direction": {"type": "string"}}}}}])


def demo_store(path, n=8, untrainable=False):
    """n short episodes of 1-3 moves then "done"; with `untrainable`, each first move is flagged untrainable."""
    store = Store.create(path)
    rows = []
    for i in range(n):
        messages = [Message("system", "Reach the goal."), Message("user", f"at {i % 7} 3 goal 3 3")]
        for k in range(1 + i % 3):
            messages.append(Message("assistant", "", tool_calls=[ToolCall("move", '{"direction": "left"}')],
                                    trainable=False if (untrainable and k == 0) else None))
            messages.append(Message("tool", f"at {i % 7 - k} 3 goal 3 3"))
        messages.append(Message("assistant", "done"))
        rows.append(Trajectory(id=f"t{i}", task_id=f"t{i}", messages=messages, tools=TOOLS, reward=1.0,
                               success=True).to_row())
    store.append(rows)
    return store


WORDS = ("left", "right", "up", "down", "goal", "wall", "at", "is", "the", "reach", "move", "step")


def mixed_length_store(path, n=256, *, seed=0, median_turns=3.0, sigma=0.9, max_turns=40):
    """n episodes of heavy-tailed length: lognormal number of turns, observations and replies of varied length."""
    rng = random.Random(seed)
    store = Store.create(path)
    rows = []
    directions = ("left", "right", "up", "down")

    def words(k):
        return " ".join(rng.choice(WORDS) for _ in range(k))

    for i in range(n):
        turns = min(max_turns, max(1, round(rng.lognormvariate(math.log(median_turns), sigma))))
        messages = [Message("system", "Reach the goal. " + words(rng.randint(0, 20))),
                    Message("user", f"at {i % 7} 3 goal 3 3 " + words(rng.randint(0, 30)))]
        for k in range(turns):
            thought = words(rng.randint(0, 12))
            messages.append(Message("assistant", thought, tool_calls=[
                ToolCall("move", json.dumps({"direction": rng.choice(directions)}), id=f"c{k}")]))
            messages.append(Message("tool", f"at {k % 7} 3 goal 3 3 " + words(rng.randint(2, 40)),
                                    tool_call_id=f"c{k}"))
        messages.append(Message("assistant", "done " + words(rng.randint(0, 8))))
        rows.append(Trajectory(id=f"m{i:04d}", task_id=f"m{i}", messages=messages, tools=TOOLS, reward=1.0,
                               success=True).to_row())
    store.append(rows)
    return store


def random_mover_model(out, *, hidden: int = 32):
    """A tiny checkpoint that answers a uniformly random grid move ("left<|im_end|>") to any observation.

    Built by hand, not trained (training one takes minutes on a CPU): with the attention and MLP outputs
    zeroed the model is a bigram table over its tied embeddings; the end-of-prompt newline then points to
    the four direction tokens and a direction to <|im_end|>. Real weights, real generation, no mocks.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omrl.models.tiny import cached_tiny_model

    source = cached_tiny_model(hidden=hidden)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source)
    if not model.config.tie_word_embeddings:
        raise ValueError("random_mover_model expects tied embeddings")
    ids = {w: tokenizer.encode(w, add_special_tokens=False) for w in ("\n", "left", "right", "up", "down")}
    if any(len(v) != 1 for v in ids.values()):
        raise ValueError(f"direction words must be single tokens, got {ids}")
    newline, moves, end = ids.pop("\n")[0], [v[0] for v in ids.values()], tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream stays the current token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        emb = model.model.embed_tokens.weight
        emb[:, :2] = 0.0  # dims 0 and 1 carry the bigram rules; no other token competes there
        emb[newline] = 0.0
        emb[newline, 0] = 0.01  # as input: "after the header"; as output: a negligible logit
        for m in moves:
            emb[m] = 0.0
            # Logit ~20 after the newline: all other tokens together get ~1e-6 there (at 2.0, logit ~11, one
            # of them was drawn in ~0.4% of turns: a reply of byte fragments that cannot re-tokenise).
            emb[m, 0] = emb[m, 1] = 4.0
        emb[end] = 0.0
        emb[end, 1] = 16.0  # logit ~64 after a move, a move's ~32
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
