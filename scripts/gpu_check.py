"""Check the GPU path end to end: expert demos -> SFT -> GRPO, generating with HFPolicy and with TRL's vLLM.

Prints one JSON line: per generation backend the GRPO step time, completion tokens/s of its rollouts and
held-out success, and vllm_speedup (vLLM tokens/s over HFPolicy's).
Usage (on a machine with a GPU and vllm):  python scripts/gpu_check.py --out /tmp/gpu-check
                                           python scripts/gpu_check.py --backend hf --device cpu   # dry run

--backend vllm sets the GRPO recipe's use_vllm (refused on a CPU; a missing vllm is reported instead of a
number). The model is omrl's tiny grid model unless --model names a local checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

BACKENDS = ("hf", "vllm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; --backend both means hf then vllm."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/omrl-gpu-check", help="folder for the stores and checkpoints")
    parser.add_argument("--grpo-steps", type=int, default=30, help="GRPO optimizer steps per backend")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (the point of the check) or cpu (a dry run of the hf backend)")
    parser.add_argument("--backend", default="both", choices=(*BACKENDS, "both"),
                        help="generation during GRPO: hf (HFPolicy), vllm (TRL's vLLM) or both, compared")
    parser.add_argument("--vllm-mode", default="colocate", choices=("colocate", "server"),
                        help="TRL's vLLM mode; server needs `trl vllm-serve --model CHECKPOINT` running")
    parser.add_argument("--model", default=None,
                        help="local checkpoint to start from (default: omrl's tiny model, built here)")
    args = parser.parse_args(argv)
    if args.grpo_steps < 1:
        parser.error("--grpo-steps must be at least 1")
    if args.device == "cpu" and args.backend != "hf":
        parser.error("vLLM needs a GPU: use --backend hf with --device cpu")
    args.backends = list(BACKENDS) if args.backend == "both" else [args.backend]
    return args


def completion_tokens(store: Any, run_prefix: str) -> int:
    """Completion tokens of the stored rollouts whose run id starts with `run_prefix`."""
    import pyarrow.compute as pc

    table = store.read("trajectories", ["run_id", "completion_tokens"])
    rows = table.filter(pc.starts_with(table["run_id"], run_prefix))
    return int(pc.sum(rows["completion_tokens"]).as_py() or 0)


def grpo_figures(backend: str, args: argparse.Namespace, sft_checkpoint: Path, tasks_file: Path, store: Any,
                 held_out: list[Any]) -> dict[str, Any]:
    """Train GRPO generating with `backend`; its step time, tokens/s and held-out success (or why it could not)."""

    from omrl.policies.hf import HFPolicy
    from omrl.rollout import RolloutSettings, evaluate
    from omrl.train.algorithms.grpo import train_grpo
    from omrl.train.config.grpo import GRPORecipe

    out = Path(args.out)
    options: dict[str, Any] = {}
    if backend == "vllm":
        options["use_vllm"] = True
        options["vllm_mode"] = args.vllm_mode
    run_name = f"grpo-{backend}"
    start = time.perf_counter()
    try:
        checkpoint = train_grpo(GRPORecipe(
            model=str(sft_checkpoint), tasks=str(tasks_file), output_dir=str(out / run_name), store=str(store.path),
            run_name=run_name, max_steps=args.grpo_steps, learning_rate=2e-4, warmup_steps=5,
            rollout=RolloutSettings(env="grid", max_turns=14, max_new_tokens=4, concurrency=64),
            use_cpu=args.device == "cpu", quiet=True, **options)).checkpoint
    except (ValueError, ImportError) as exc:  # use_vllm refused on a CPU, or vllm not installed
        return {"error": f"{type(exc).__name__}: {exc}"}
    seconds = time.perf_counter() - start
    tokens = completion_tokens(store, run_name)
    policy = HFPolicy(str(checkpoint), max_new_tokens=4, temperature=1.0, device=args.device)
    result = asyncio.run(evaluate("grid", held_out, policy, store, samples=2, run_id=f"eval-{run_name}",
                                  max_turns=14))
    return {"grpo_s": round(seconds, 2), "grpo_s_per_step": round(seconds / args.grpo_steps, 3),
            "completion_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
            "success": result.metrics["grid"]["success_rate"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch

    from omrl.envs.grid import grid_tasks
    from omrl.models.tiny import build_tiny_model
    from omrl.policies.scripted import ScriptedPolicy
    from omrl.rollout import collect
    from omrl.store import Store
    from omrl.train.algorithms.sft import train_sft
    from omrl.train.config.sft import SFTRecipe

    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this script checks the GPU path (use --device cpu --backend hf for a dry run)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0) if on_gpu else None, "torch": torch.__version__}
    base = Path(args.model) if args.model else build_tiny_model(out / "base", hidden=128, layers=2, seed=0)
    store = Store.create(out / "store")
    train = grid_tasks(1000, seed=0, split="train")
    held_out = grid_tasks(100, seed=1, split="eval")
    tasks_file = out / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(task.to_row()) + "\n" for task in train))
    start = time.perf_counter()
    asyncio.run(collect("grid", train, ScriptedPolicy(), store, samples=1, run_id="demos", max_turns=14))
    figures["demos_s"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    sft = train_sft(SFTRecipe(model=str(base), store=str(store.path), output_dir=str(out / "sft"),
                              where="run_id = 'demos' AND success", epochs=8, learning_rate=1e-3,
                              batch_size=32, use_cpu=not on_gpu, quiet=True))
    figures.update(sft_s=round(time.perf_counter() - start, 2), sft_final_loss=sft.losses[-1] if sft.losses else None)
    for backend in args.backends:
        figures[backend] = grpo_figures(backend, args, sft.checkpoint, tasks_file, store, held_out)
    hf, vllm = figures.get("hf", {}), figures.get("vllm", {})
    if hf.get("tokens_per_s") and vllm.get("tokens_per_s"):
        figures["vllm_speedup"] = round(vllm["tokens_per_s"] / hf["tokens_per_s"], 2)
    print(json.dumps(figures, default=str))
    return figures


if __name__ == "__main__":
    main()
