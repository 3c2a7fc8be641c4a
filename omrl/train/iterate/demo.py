"""The learning demo: `recipes/quickstart.yaml` run through the one orchestrator, omrl.train.iterate.run.

    omrl demo [key=value ...]          (or: make demo, python -m omrl.train.iterate.demo, omrl train iterate -r recipes/quickstart.yaml)

A tiny offline model learns grid navigation on the CPU: the noisy scripted expert's own held-out
success (stage expert), the untrained model (base), SFT on the expert's demonstrations (sft), GRPO
rounds (grpo-1, grpo-2) and the compute-matched more-SFT baseline (sft-more), each evaluated on the
held-out split, sampled (temperature 1, several samples per task) and greedy. What is demo-specific
here: the run is fresh (output_dir wiped, so the table is one seeded run, not a resumed mix), and the
table and the paths of results.json and the report are printed at the end.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

DEFAULT_RECIPE = "shipped:quickstart"  # recipes/quickstart.yaml, found from an installed wheel too


def run_demo(recipe: str = DEFAULT_RECIPE, overrides: list[str] | tuple[str, ...] = (), *,
             verbose: bool = False, fresh: bool = True) -> list[dict[str, Any]]:
    """Run the demo recipe through omrl.train.iterate.run (with key=value overrides); return the stage rows."""
    from rich.console import Console

    from omrl.config import load_recipe
    from omrl.progress import terminal_reporter
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.evaluation import round_table
    from omrl.train.iterate.run import run_iterate
    from omrl.train.trainer_progress import quiet_libraries

    config = load_recipe(recipe, IterateRecipe, list(overrides))
    out = Path(config.output_dir)
    if fresh and out.exists():
        shutil.rmtree(out)
    console = Console(stderr=True, soft_wrap=True)  # piped output is not wrapped
    with quiet_libraries(not verbose), terminal_reporter(console=console) as reporter:
        results = run_iterate(config, reporter=reporter)
        minutes = results[-1].get("minutes", 0.0) if results else 0.0
    console.print(round_table(results))
    console.print(f"results in {out / 'results.json'}"
                  + (f"; report in {out / 'report'}" if config.report else "") + f"; {minutes:.1f} min")
    return results


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Run the omrl learning demo on the CPU.")
    parser.add_argument("--recipe", default=DEFAULT_RECIPE)
    parser.add_argument("--verbose", action="store_true", help="TRL's own logs and bars beside omrl's progress")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. grpo.max_steps=10")
    args = parser.parse_args(argv)
    run_demo(args.recipe, args.overrides, verbose=args.verbose)


if __name__ == "__main__":
    main()
