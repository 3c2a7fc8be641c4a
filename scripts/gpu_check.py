"""Check the GPU path end to end: expert demos -> SFT -> GRPO on a CUDA device, with the tiny model.

Prints one JSON line: the device each stage trained on, losses, step times and held-out success.
Usage (on a machine with a GPU):  python scripts/gpu_check.py --out /tmp/gpu-check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import torch

from omrl.envs.grid import grid_tasks
from omrl.models import build_tiny_model
from omrl.policies.hf import HFPolicy
from omrl.policies.scripted import ScriptedPolicy
from omrl.rollout import collect as collect_episodes
from omrl.rollout import evaluate
from omrl.store import Store
from omrl.train.grpo import GRPORecipe, train_grpo
from omrl.train.sft import SFTRecipe, train_sft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/omrl-gpu-check")
    parser.add_argument("--grpo-steps", type=int, default=30)
    parser.add_argument("--device", default="cuda", help="cuda (the point of the check) or cpu (a dry run)")
    args = parser.parse_args()
    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this script checks the GPU path (use --device cpu for a dry run)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures: dict = {"gpu": torch.cuda.get_device_name(0) if on_gpu else None, "torch": torch.__version__}

    base = build_tiny_model(out / "base", hidden=128, layers=2, seed=0)
    store = Store.create(out / "store")
    train = grid_tasks(1000, seed=0, split="train")
    held_out = grid_tasks(100, seed=1, split="eval")
    tasks_file = out / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(task.to_row()) + "\n" for task in train))
    start = time.perf_counter()
    asyncio.run(collect_episodes("grid", train, ScriptedPolicy(), store, samples=1, run_id="demos",
                                 max_turns=14, progress=False))
    figures["demos_s"] = round(time.perf_counter() - start, 2)

    start = time.perf_counter()
    sft = train_sft(SFTRecipe(model=str(base), store=str(store.path), output_dir=str(out / "sft"),
                              where="run_id = 'demos' AND success", epochs=8, learning_rate=1e-3,
                              batch_size=32, use_cpu=not on_gpu, quiet=True))
    figures.update(sft_s=round(time.perf_counter() - start, 2), sft_final_loss=sft.losses[-1] if sft.losses else None)

    start = time.perf_counter()
    grpo = train_grpo(GRPORecipe(model=str(sft.checkpoint), tasks=str(tasks_file), output_dir=str(out / "grpo"),
                                 store=str(store.path), max_steps=args.grpo_steps, learning_rate=2e-4,
                                 warmup_steps=5, max_new_tokens=4, max_turns=14, use_cpu=not on_gpu, quiet=True))
    figures["grpo_s"] = round(time.perf_counter() - start, 2)
    figures["grpo_s_per_step"] = round(figures["grpo_s"] / args.grpo_steps, 3)
    figures["grpo_rollouts_stored"] = store.count() - len(train)

    for stage, path in (("sft", sft.checkpoint), ("grpo", grpo)):
        policy = HFPolicy(str(path), max_new_tokens=4, temperature=1.0, device=args.device)
        figures[f"{stage}_device"] = str(next(policy.model.parameters()).device)
        result = asyncio.run(evaluate("grid", held_out, policy, store, samples=2, run_id=f"eval-{stage}",
                                      max_turns=14, progress=False))
        figures[f"{stage}_success"] = result.metrics["grid"]["success_rate"]
    print(json.dumps(figures, default=str))


if __name__ == "__main__":
    main()
