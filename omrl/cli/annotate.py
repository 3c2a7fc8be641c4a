"""`omrl annotate`: metrics, LLM-as-judge and the combined reward, appended to a store's annotations."""

from __future__ import annotations

import click

from omrl.cli.common import console, err_console, query_limits, user_errors


@click.command()
@click.argument("store", type=click.Path(exists=True, file_okay=False))
@click.option("--metric", "metrics", multiple=True,
              help="Metric name (env_reward, success, format_valid, exact_match, numeric_match, normalized_match, "
                   "num_turns, num_tokens, repetition, truncated, tool_error_rate), module:function or file.py:function.")
@click.option("--judge", "rubric", metavar="PATH", help="Judge rubric YAML (or shipped:NAME, e.g. shipped:judges/correctness).")
@click.option("--judge-model", help="Model name sent to the judge endpoint.")
@click.option("--base-url", help="OpenAI-compatible endpoint of the judge, e.g. http://localhost:8000/v1.")
@click.option("--api-key", envvar="OPENAI_API_KEY", default="EMPTY", show_default=False,
              help="API key for the judge endpoint (default: $OPENAI_API_KEY).")
@click.option("--mode", type=click.Choice(["pointwise", "pairwise", "group"]), default="pointwise", show_default=True)
@click.option("--where", help="SQL condition over `trajectories` selecting what to annotate.")
@click.option("--concurrency", type=int, default=16, show_default=True,
              help="Judge requests in flight at once; with --ray: per Ray worker (the endpoint sees up to "
                   "workers x this).")
@click.option("--max-chars", type=int, default=12000, show_default=True,
              help="Judge rendering budget per trajectory (long ones keep the task, last turns and outcome).")
@click.option("--max-tokens", type=int, default=512, show_default=True,
              help="Token limit of each judge reply, sent with every request.")
@click.option("--max-prompt-tokens", type=int, default=None,
              help="Judge prompt budget in tokens (its context minus --max-tokens): renderings are elided to fit, "
                   "and a prompt that cannot fit is an error row, not a request. Default: no budget.")
@click.option("--group-max", type=int, default=None,
              help="Group mode: score larger groups in chunks of at most this many trajectories.")
@click.option("--price-prompt", type=float, help="USD per million prompt tokens (for cost_usd).")
@click.option("--price-completion", type=float, help="USD per million completion tokens (for cost_usd).")
@click.option("--reward-recipe", metavar="PATH",
              help="Reward recipe YAML (or shipped:NAME): writes the combined reward as an annotator (after metrics and judge).")
@click.option("--redo", is_flag=True,
              help="Annotate again what already has an ok annotation from the same annotator and rubric "
                   "(by default a re-run resumes and skips those).")
@click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS|local",
              help="Judge on a Ray cluster: auto (the running one), HOST:PORT, or local (start one on this "
                   "machine); shards of trajectories (whole tasks or groups for pairwise/group judges) on Ray "
                   "workers, annotations committed here. Metrics and the reward recipe run here. Needs "
                   "`pip install omrl[ray]`.")
@click.option("--ray-workers", type=int, default=None,
              help="With --ray: judge workers, one CPU each (default: one per cluster CPU).")
@user_errors
@query_limits
def annotate(store, metrics, rubric, judge_model, base_url, api_key, mode, where, concurrency, max_chars,
             max_tokens, max_prompt_tokens, group_max, price_prompt, price_completion, reward_recipe, redo,
             ray_address, ray_workers):
    """Score trajectories with metrics, an LLM judge and a reward recipe.

    \b
    Example:  omrl annotate runs/demo --metric exact_match --metric num_turns --reward-recipe shipped:reward_offline
    """
    from rich.table import Table

    from omrl.annotate.judge import JudgeConfig
    from omrl.annotate.rubric import load_rubric
    from omrl.annotate.runner import annotate as run
    from omrl.progress import terminal_reporter
    from omrl.rollout.executor import executor_for

    if not (metrics or rubric or reward_recipe):
        raise click.UsageError("nothing to do: give --metric, --judge or --reward-recipe")
    if ray_workers is not None and not ray_address:
        raise click.UsageError("--ray-workers needs --ray")
    executor = executor_for(ray_address, workers=ray_workers)  # without Ray: says so before reading the store
    if ray_address and not rubric:
        raise click.UsageError("--ray runs judges; give --judge (metrics and rewards run here)")
    judge = None
    if rubric:
        if not (judge_model and base_url):
            raise click.UsageError("--judge needs --judge-model and --base-url")
        judge = JudgeConfig(rubric=load_rubric(rubric), model=judge_model, base_url=base_url, api_key=api_key,
                            mode=mode, concurrency=concurrency, max_chars=max_chars, max_tokens=max_tokens,
                            max_prompt_tokens=max_prompt_tokens, group_max=group_max,
                            price_prompt=price_prompt, price_completion=price_completion)

    with terminal_reporter(console=err_console) as reporter:
        summary = run(store, metrics=list(metrics), judge=judge, where=where, reward_recipe=reward_recipe,
                      reporter=reporter, redo=redo, executor=executor)

    table = Table(title=f"annotate {store} ({summary.trajectories} trajectories, run {summary.run_id})")
    for col in ("annotator", "written", "errors", "skipped", "already_done"):
        table.add_column(col, justify="left" if col == "annotator" else "right")
    for row in summary.table():
        table.add_row(row["annotator"], str(row["written"]), str(row["errors"]), str(row["skipped"]),
                      str(row["already_done"]))
    console.print(table)
    if summary.judge is not None:
        s = summary.judge
        console.print(f"judge: {s.calls} calls, {s.cache_hits} cache hits, {s.transport_retries} retries, "
                      f"{s.invalid_replies} invalid replies, tokens {s.prompt_tokens} prompt + "
                      f"{s.completion_tokens} completion")
    if reward_recipe:
        console.print(f"reward: {summary.reward_missing} trajectories with a missing component (NULL reward)")
