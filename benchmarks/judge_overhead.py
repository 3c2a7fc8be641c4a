"""What an online judge costs a GRPO step: wall time with a judge of fixed latency against the same step without.

    python benchmarks/judge_overhead.py --steps 4 --latency 0.5 [--model runs/quickstart/sft]

Both runs are the same seeded GRPO (grid env, tasks_per_step x samples_per_task episodes a step) from the
same checkpoint; the judged one adds a group judge (omrl.testing.judge_server in its own process, every
reply delayed `--latency` s, no cache hits: a fresh store each run) to the env reward. A step's wall time is
the rollout function's (play + scoring + storing) plus TRL's update (its step_time); the first step of
each run is left out (warm-up). Runs alternate (plain, judged, plain, ...) `--repeats` times so a change
in machine load hits both. Prints ONE JSON line:

    judge_overhead = median judged step / median plain step - 1     (target <= 0.15: calls overlap rollouts)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def step_times(result) -> tuple[list[float], list[float]]:
    """(per-step wall seconds after the first, per-step scoring seconds not overlapped with play) of a GRPO
    run's TrainResult."""
    rollout = result.rollouts["rollout_s"]
    updates = [float(e["step_time"]) for e in result.history if "step_time" in e]
    if len(updates) != len(rollout):
        raise RuntimeError(f"{len(updates)} logged updates for {len(rollout)} rollout steps (logging_steps must be 1)")
    return [r + u for r, u in zip(rollout, updates, strict=True)][1:], result.rollouts.get("scoring_tail_s", [])[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps per run (the first is not counted)")
    parser.add_argument("--repeats", type=int, default=2, help="plain/judged run pairs")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the judge takes per reply")
    parser.add_argument("--model", help="starting checkpoint (default: the offline tiny model, hidden 64)")
    parser.add_argument("--tasks-per-step", type=int, default=8, help="tasks per step")
    parser.add_argument("--samples", type=int, default=8, help="episodes per task (the judged group)")
    args = parser.parse_args()

    from omrl.models.tiny import cached_tiny_model
    from omrl.rollout import RolloutSettings
    from omrl.testing.judge_server import JudgeProcess
    from omrl.train.algorithms.grpo import train_grpo
    from omrl.train.config.grpo import GRPORecipe

    model = args.model or str(cached_tiny_model(hidden=64))
    work = Path(tempfile.mkdtemp(prefix="judge-overhead-"))
    plain, judged, tails = [], [], []
    with JudgeProcess(rule="grid", latency=args.latency) as judge:
        reward = {"components": {"env_reward": 1.0, "judge:grid_goal:group": {"weight": 0.5, "scale": [0, 10]}},
                  "missing": "renormalize",
                  "judges": [{"rubric": str(ROOT / "recipes" / "judges" / "grid_goal.yaml"), "model": "rule-judge",
                              "base_url": judge.base_url, "mode": "group", "max_tokens": 512,
                              "max_prompt_tokens": 7680}]}
        for rep in range(args.repeats):
            for name, rec in (("plain", None), ("judged", reward)):
                out = work / f"{name}-{rep}"
                recipe = GRPORecipe(
                    model=model, tasks=str(ROOT / "datasets" / "tasks" / "grid_train.jsonl"), output_dir=str(out),
                    store=str(out / "store"), rollout=RolloutSettings(env="grid", max_turns=14, max_new_tokens=4,
                                                                      env_options={"noise": 0.3, "seed": 0}),
                    max_steps=args.steps, tasks_per_step=args.tasks_per_step, samples_per_task=args.samples,
                    warmup_steps=0, learning_rate=2e-4, logging_steps=1, quiet=True, reward=rec)
                seconds, tail = step_times(train_grpo(recipe))
                (judged if rec else plain).extend(seconds)
                tails.extend(tail)
        calls = judge.stats()["requests"]
    base, with_judge = statistics.median(plain), statistics.median(judged)
    print(json.dumps({"judge_overhead": round(with_judge / base - 1, 4), "target": 0.15,
                      "step_s_without_judge": round(base, 3), "step_s_with_judge": round(with_judge, 3),
                      "judge_latency_s": args.latency, "judge_calls": calls,
                      "scoring_tail_s_median": round(statistics.median(tails), 3) if tails else None,
                      "steps_counted": [len(plain), len(judged)],
                      "episodes_per_step": args.tasks_per_step * args.samples,
                      "model": args.model or "tiny(hidden=64)"}))


if __name__ == "__main__":
    main()
