"""`omrl augment`: derived, perturbed trajectories with lineage, into a new store."""

from __future__ import annotations

import click

from omrl.cli.common import EXISTING_STORE, LOCAL_OUTPUT, console, query_limits, user_errors

OP_NAMES = ["paraphrase", "observation_noise", "tool_rename", "error_recovery", "drop_redundant"]


@click.command()
@click.argument("store", type=EXISTING_STORE)
@click.option("--out", required=True, type=LOCAL_OUTPUT, help="New store: originals plus augmented rows.")
@click.option("--op", "ops", multiple=True, required=True, type=click.Choice(OP_NAMES), help="Perturbation (repeatable).")
@click.option("--n", type=int, default=1, show_default=True, help="Variants per trajectory per op.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed: same seed, same ids and contents.")
@click.option("--where", help="SQL condition over `trajectories` selecting what to augment.")
@click.option("--no-originals", is_flag=True, help="Write only the augmented rows.")
@click.option("--base-url", help="OpenAI-compatible endpoint for LLM paraphrases (rule-based templates without).")
@click.option("--model", help="Model for LLM paraphrases.")
@click.option("--api-key", envvar="OPENAI_API_KEY", default="EMPTY", show_default=False, help="API key for --base-url.")
@user_errors
@query_limits
def augment(store, out, ops, n, seed, where, no_originals, base_url, model, api_key):
    """Multiply training data with outcome-preserving perturbations.

    \b
    Example:  omrl augment runs/demo-sft --out runs/demo-aug --op tool_rename --op error_recovery --n 2
    """
    from rich.table import Table

    from omrl.curate.augment import augment_store, llm_paraphraser

    paraphraser = None
    if base_url:
        if not model:
            raise click.UsageError("--base-url needs --model")
        paraphraser = llm_paraphraser(base_url, model, api_key)
    result = augment_store(store, out, list(ops), n=n, seed=seed, keep_originals=not no_originals,
                           paraphraser=paraphraser, where=where)
    table = Table(title=f"augment {store} -> {out} ({result.source_rows} trajectories in, {result.originals} kept as is)")
    for col in ("op", "written", "not applicable", "failed"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for op in ops:
        table.add_row(op, str(result.written[op]), str(result.not_applicable[op]), str(result.failed[op]))
    console.print(table)
    for error in result.errors:
        console.print(f"[red]failed[/red] {error}", highlight=False)
