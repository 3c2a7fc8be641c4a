"""`omrl eval`: success rate, mean reward and pass@k of a policy on tasks; rows are stored like any collection."""

from __future__ import annotations

import tempfile
from typing import Any

import click
from rich.table import Table

from omrl.cli.collect import closing, prepare, rollout_kwargs, rollout_options, run_interruptible
from omrl.cli.common import console, err_console, user_errors


@click.command(name="eval")
@rollout_options
@click.option("--store", "store_path", default=None, type=click.Path(),
              help="Store to keep the episodes in (created if missing); default: a temporary one.")
@click.option("--samples", "-k", default=1, show_default=True, help="Samples per task (pass@k up to k).")
@click.option("--predictions", "predictions_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Score a predictions file instead of playing a policy (SWE-bench's {instance_id, "
                   "model_name_or_path, model_patch}, JSON or JSONL) against the tasks; envs with score_prediction.")
@user_errors
def eval_(store_path: str | None, samples: int, predictions_path: str | None, **args: Any) -> None:
    """Evaluate a policy: success rate, mean reward and pass@k per environment.

    \b
    Example:  omrl eval --env grid --tasks shipped:grid_eval --policy hf:tiny -k 4 --store evals
              omrl eval --env swe --tasks swe.jsonl --predictions preds.jsonl
    """
    from omrl.progress import terminal_reporter
    from omrl.rollout import default_run_name, evaluate
    from omrl.store import Store

    if predictions_path is not None:
        return _score_predictions(args["env_spec"], args["tasks_path"], predictions_path, args["concurrency"])

    options = rollout_kwargs(args)  # first: a bad flag (or --ray without Ray) fails before models load
    tasks, policy = prepare(args["tasks_path"], args["policy_spec"], args["base_url"], args["concurrency"],
                            args["limit"], args["split"], args["server_tokens"], args["context_length"],
                            args["tool_format"])
    run_id = args["run_id"] or default_run_name(args["env_spec"], args["tasks_path"], args["policy_spec"],
                                                prefix="eval-")
    with tempfile.TemporaryDirectory(prefix="omrl-eval-") as tmp, \
            terminal_reporter(args["progress"], err_console) as reporter:
        store = Store.create(store_path or f"{tmp}/store")
        result = run_interruptible(
            lambda on_finish: closing(policy, evaluate(None, tasks, policy, store, samples=samples, run_id=run_id,
                                                       reporter=reporter, on_finish=on_finish, **options)),
            run_id, store_path or "a temporary store (not kept)")
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
    if result.collect.retried:
        console.print(f"{result.collect.retried} episode(s) whose stored attempts all failed were played again "
                      "(--retry-failed); the table counts each episode's last attempt", highlight=False)
    if store_path is None:
        console.print("[dim]episodes were not kept; pass --store to keep them[/dim]")


def _score_predictions(env_spec: str, tasks_path: str, predictions_path: str, concurrency: int) -> None:
    """Each prediction scored by the environment's own scorer (its score_prediction); one table, resolved rate."""
    import json
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from omrl.envs import env_class
    from omrl.errors import UsageError
    from omrl.tasks import load_tasks

    score = getattr(env_class(env_spec), "score_prediction", None)
    if not callable(score):
        raise UsageError(f"environment {env_spec!r} does not score predictions files (no score_prediction)")
    text = Path(predictions_path).read_text(encoding="utf-8")
    try:
        records = json.loads(text)
        records = list(records.values()) if isinstance(records, dict) else records
    except json.JSONDecodeError:
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{predictions_path}:{number}: not JSON ({exc.msg})") from None
    patches = {}
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict) or not isinstance(record.get("instance_id"), str) \
                or not isinstance(record.get("model_patch") or "", str):
            raise UsageError(f"{predictions_path}: prediction {number} needs instance_id and model_patch (text)")
        patches[record["instance_id"]] = record.get("model_patch") or ""
    tasks = {t.payload.get("instance_id", t.id): t for t in load_tasks(tasks_path)}
    unknown = sorted(set(patches) - set(tasks))
    if unknown:
        raise UsageError(f"{len(unknown)} predictions name no task of {tasks_path}: {', '.join(unknown[:5])}")
    chosen = [(tasks[i], p) for i, p in patches.items()]
    with console.status(f"scoring {len(chosen)} predictions"), ThreadPoolExecutor(max(1, concurrency)) as pool:
        verdicts = list(pool.map(lambda pair: score(*pair), chosen))
    table = Table(title=f"predictions {Path(predictions_path).name} ({env_spec})")
    for column in ("instance_id", "resolved", "FAIL_TO_PASS", "PASS_TO_PASS"):
        table.add_column(column)
    for (task, _), verdict in zip(chosen, verdicts, strict=True):
        table.add_row(task.payload.get("instance_id", task.id), "yes" if verdict["resolved"] else "no",
                      verdict["fail_to_pass"], verdict["pass_to_pass"])
    console.print(table)
    resolved = sum(v["resolved"] for v in verdicts)
    console.print(f"resolved {resolved}/{len(verdicts)} ({resolved / max(1, len(verdicts)):.1%}); "
                  f"{len(tasks) - len(chosen)} tasks without a prediction")
