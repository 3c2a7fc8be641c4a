"""Bridge batching vs TRL defaults on trajectories of mixed lengths: prints one JSON line.

padding_fraction: pad share of the bridge's SFT batches (target <= 0.1).
tokens_per_s_ratio: real (non-pad) tokens per second of SFT with the bridge's batches / with TRL's defaults
(conversational dataset, assistant_only_loss, random batches), same data, same steps, same run (target >= 1).
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    from test_sft import demo_store  # noqa: F401  (shared helper shapes, not used for lengths)

    from omrl.models import cached_tiny_model
    from omrl.schema import Message, ToolCall, Trajectory
    from omrl.store import Store
    from omrl.train.sft import SFTRecipe, train_sft

    rng = random.Random(0)
    tiny = cached_tiny_model(hidden=64)
    work = Path(tempfile.mkdtemp(prefix="bridge-bench-"))
    store = Store.create(work / "s")
    rows = []
    for i in range(256):
        steps = rng.choice([1, 2, 3]) if rng.random() < 0.6 else rng.randint(10, 30)  # mixed lengths
        messages = [Message("system", "Reach the goal."), Message("user", f"at {i % 7} 3 goal 3 3")]
        for k in range(steps):
            messages.append(Message("assistant", "", tool_calls=[ToolCall("move", '{"direction": "left"}')]))
            messages.append(Message("tool", f"at {k % 7} 3 goal 3 3, goal is {k % 5} left"))
        messages.append(Message("assistant", "done"))
        rows.append(Trajectory(id=f"t{i}", task_id=f"t{i}", messages=messages, reward=1.0, success=True).to_row())
    store.append(rows)
    measured = {}
    for mode in ("trl", "bridge", "trl", "bridge"):  # alternate, keep the second of each (warm caches)
        recipe = SFTRecipe(model=str(tiny), store=str(store.path), output_dir=str(work / mode), batch_size=16,
                           max_steps=12, logging_steps=1, quiet=True, batching=mode, learning_rate=1e-4)
        started = time.perf_counter()
        result = train_sft(recipe)
        measured[mode] = (result, time.perf_counter() - started)
    bridge, bridge_s = measured["bridge"]
    trl, trl_s = measured["trl"]
    bridge_rate = bridge.metrics["train_samples_per_second"]
    trl_rate = trl.metrics["train_samples_per_second"]
    print(json.dumps({
        "padding_fraction": round(bridge.report["padding_fraction"], 4),
        "tokens_per_s_ratio": round(bridge_rate / trl_rate, 3),
        "bridge_samples_per_s": round(bridge_rate, 2), "trl_samples_per_s": round(trl_rate, 2),
        "examples": bridge.report["examples"], "steps": 12, "batch_size": 16,
    }))


if __name__ == "__main__":
    main()
