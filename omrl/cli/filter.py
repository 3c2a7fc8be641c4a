"""`omrl filter`: select trajectories into a new, rebuildable store."""

from __future__ import annotations

import click

from omrl.cli.common import EXISTING_STORE, LOCAL_OUTPUT, console, query_limits, user_errors


@click.command(name="filter")
@click.argument("store", type=EXISTING_STORE)
@click.option("--out", required=True, type=LOCAL_OUTPUT, help="New store for the kept rows (train split).")
@click.option("--where", help="SQL condition over `trajectories`.")
@click.option("--success", is_flag=True, help="Keep only successful trajectories.")
@click.option("--min-reward", type=float, help="Keep rows whose reward (combined with --reward-recipe) is >= X.")
@click.option("--status", help="Keep only this status, e.g. ok.")
@click.option("--dedupe", type=click.Choice(["exact", "near"]), help="Drop duplicates (near: MinHash LSH candidates, then exact shingle Jaccard).")
@click.option("--near-threshold", type=float, default=0.8, show_default=True,
              help="Word-3-shingle Jaccard at or above which rows are near duplicates.")
@click.option("--best-of-n", type=int, help="Keep the K best rows per group by reward.")
@click.option("--drop-flat-groups", is_flag=True, help="Drop groups whose rewards are all equal.")
@click.option("--max-turns", type=int, help="Drop rows with more assistant turns.")
@click.option("--split", help="Split by task, e.g. val=0.05 (other splits go to OUT-<name>).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split assignment.")
@click.option("--rejects", type=click.Path(dir_okay=False), help="Write dropped rows, with a reason, to this Parquet file.")
@click.option("--reward-recipe", metavar="PATH",
              help="Reward recipe YAML (or shipped:NAME): rank and threshold by this combined reward instead of the env reward.")
@click.option("--rebuild", "rebuild_from", is_flag=True,
              help="STORE is a filtered store: re-run the filter recorded in its omrl.json into --out.")
@user_errors
@query_limits
def filter_(store, out, where, success, min_reward, status, dedupe, near_threshold, best_of_n, drop_flat_groups,
            max_turns, split, seed, rejects, reward_recipe, rebuild_from):
    """Filter, deduplicate, rejection-sample and split trajectories into a new store.

    \b
    Example:  omrl filter runs/demo --out runs/demo-sft --status ok --success --dedupe near --split val=0.05
    """
    from rich.table import Table

    from omrl.curate.filters import FilterOptions, filter_store, rebuild, summary_table

    if rebuild_from:
        result = rebuild(store, out)
    else:
        options = FilterOptions(where=where, status=status, success=success, max_turns=max_turns,
                                drop_flat_groups=drop_flat_groups, best_of_n=best_of_n, min_reward=min_reward,
                                dedupe=dedupe, near_threshold=near_threshold, split=split, seed=seed,
                                reward_recipe=reward_recipe)
        result = filter_store(store, out, options, rejects=rejects)
    table = Table(title=f"filter {store} -> {out} ({result.source_rows} rows in)")
    table.add_column("what")
    table.add_column("rows", justify="right")
    for line in summary_table(result):
        table.add_row(line["what"], str(line["rows"]))
    console.print(table)
    for name, path in result.stores.items():
        console.print(f"{name}: {path}")
