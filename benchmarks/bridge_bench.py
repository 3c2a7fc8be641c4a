"""Bridge batching vs TRL defaults on trajectories of mixed lengths: prints one JSON line.

The data: episodes with a lognormal number of turns and observations/replies of varied length (heavy tail).
Both modes train the same tiny model from the same checkpoint for one epoch over the same examples, so they
feed the same real tokens; runs alternate (trl, bridge, bridge, trl) to cancel drift on a shared machine.

padding_fraction: pad share of the batches the bridge actually fed to the model (target <= 0.1).
tokens_per_s_ratio: real (non-pad) tokens per second of training with the bridge's token-budget batches /
with TRL's defaults (conversational dataset, assistant_only_loss, random batches of batch_size) (target >= 1).

    python benchmarks/bridge_bench.py [--examples 64] [--batch-size 8] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=64, help="trajectories in the store")
    parser.add_argument("--batch-size", type=int, default=8, help="TRL batch size; bridge budget = this x mean length")
    parser.add_argument("--repeats", type=int, default=2, help="(trl, bridge, bridge, trl) cycles")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size of the tiny model")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: steady on a shared box; more threads stall when others use the cores)")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(args.threads)

    from train_helpers import mixed_length_store

    from omrl.models.tiny import cached_tiny_model
    from omrl.train.algorithms.sft import train_sft
    from omrl.train.config.sft import SFTRecipe

    tiny = cached_tiny_model(hidden=args.hidden)
    work = Path(tempfile.mkdtemp(prefix="bridge-bench-"))
    store = mixed_length_store(work / "s", n=args.examples, seed=0, max_turns=20)  # all fit 2048: no split/truncation
    totals = {mode: {"tokens": 0, "padded": 0, "seconds": 0.0, "batches": 0} for mode in ("trl", "bridge")}
    report = None
    for k, mode in enumerate(["trl", "bridge", "bridge", "trl"] * args.repeats):
        recipe = SFTRecipe(model=str(tiny), store=str(store.path), output_dir=str(work / f"{mode}{k}"),
                           batch_size=args.batch_size, epochs=1, max_length=2048, logging_steps=1000, quiet=True,
                           batching=mode, learning_rate=1e-4, seed=k)
        with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its metrics; stdout is the JSON line
            result = train_sft(recipe)
        t = totals[mode]
        t["tokens"] += result.details["train_tokens"]
        t["padded"] += result.details["padded_tokens"]
        t["batches"] += result.details["batches"]
        t["seconds"] += result.metrics["train_runtime"]  # the training loop only, not dataset preparation
        if mode == "bridge":
            report = result.details["bridge"]
    if totals["trl"]["tokens"] != totals["bridge"]["tokens"]:
        raise SystemExit(f"modes fed different real tokens: {totals}")  # the comparison would be unfair
    rate = {mode: t["tokens"] / t["seconds"] for mode, t in totals.items()}
    pad = {mode: 1 - t["tokens"] / t["padded"] for mode, t in totals.items()}
    runs = 2 * args.repeats
    print(json.dumps({
        "padding_fraction": round(pad["bridge"], 4),
        "tokens_per_s_ratio": round(rate["bridge"] / rate["trl"], 3),
        "bridge_tokens_per_s": round(rate["bridge"]), "trl_tokens_per_s": round(rate["trl"]),
        "trl_padding_fraction": round(pad["trl"], 4),
        "bridge_batches": totals["bridge"]["batches"] // runs, "trl_batches": totals["trl"]["batches"] // runs,
        "real_tokens_per_run": totals["bridge"]["tokens"] // runs, "examples": report["examples"],
        "token_budget": report["token_budget"], "batch_size": args.batch_size,
        "bridge_s": round(totals["bridge"]["seconds"] / runs, 2), "trl_s": round(totals["trl"]["seconds"] / runs, 2),
    }))


if __name__ == "__main__":
    main()
