"""`omrl eval`: success rate, mean reward and pass@k of a policy on tasks; rows are stored like any collection."""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

import click
from rich.table import Table

from omrl.cli.collect import closing, prepare, rollout_kwargs, rollout_options
from omrl.cli.common import console, user_errors


@click.command(name="eval")
@rollout_options
@click.option("--store", "store_path", default=None, type=click.Path(),
              help="Store to keep the episodes in (created if missing); default: a temporary one.")
@click.option("--samples", "-k", default=1, show_default=True, help="Samples per task (pass@k up to k).")
@user_errors
def eval_(store_path: str | None, samples: int, **args: Any) -> None:
    """Evaluate a policy: success rate, mean reward and pass@k per environment.

    Example:  omrl eval --env grid --tasks datasets/tasks/grid_eval.jsonl --policy hf:tiny -k 4 --store evals
    """
    from omrl.rollout import default_run_name, evaluate
    from omrl.store import Store

    options = rollout_kwargs(args)  # first: a bad flag (or --ray without Ray) fails before models load
    tasks, policy = prepare(args["env_spec"], args["tasks_path"], args["policy_spec"], args["base_url"],
                            args["concurrency"], args["limit"], args["split"],
                            args["server_tokens"])
    run_id = args["run_id"] or default_run_name(args["env_spec"], args["tasks_path"], args["policy_spec"],
                                                prefix="eval-")
    with tempfile.TemporaryDirectory(prefix="omrl-eval-") as tmp:
        store = Store.create(store_path or f"{tmp}/store")
        result = asyncio.run(closing(policy, evaluate(None, tasks, policy, store, samples=samples,
                                                      run_id=run_id, **options)))
    table = Table(title=f"eval {run_id} ({args['policy_spec']})")
    pass_keys = sorted({k for m in result.metrics.values() for k in m if k.startswith("pass@")},
                       key=lambda k: int(k[5:]))
    for column in ["env", "tasks", "n", "success", "reward", *pass_keys, "trunc", "errors"]:
        table.add_column(column, justify="left" if column == "env" else "right")
    for env, m in result.metrics.items():
        reward = "-" if m["mean_reward"] is None else f"{m['mean_reward']:.3f}"
        success = "-" if m["success_rate"] is None else f"{m['success_rate']:.1%}"
        table.add_row(env, str(m["tasks"]), str(m["episodes"]), success, reward,
                      *(f"{m[k]:.1%}" if k in m else "-" for k in pass_keys), str(m["truncated"]), str(m["errors"]))
    console.print(table)
    if store_path is None:
        console.print("[dim]episodes were not kept; pass --store to keep them[/dim]")
