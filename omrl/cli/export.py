"""`omrl export`: write a store (or a SQL selection) as a dataset folder or a JSONL file; optionally push it."""

from __future__ import annotations

import click

from omrl.cli.common import EXISTING_STORE, LOCAL_OUTPUT, console, query_limits, user_errors
from omrl.formats import EXPORTERS
from omrl.formats.exporters import FOLDER_FORMATS


@click.command()
@click.argument("store", type=EXISTING_STORE)
@click.option("--out", required=True, type=LOCAL_OUTPUT, help="Folder (parquet, traces) or .jsonl file to write.")
@click.option("--format", "fmt", default=None, metavar="|".join([*FOLDER_FORMATS, *EXPORTERS.builtins]) + "|PLUGIN",
              help="parquet: HF dataset folder; omrl (or jsonl): omrl rows, everything kept; openai: TRL/OpenAI "
                   "{messages, tools} with reward, success, task_id and per-turn weight; sharegpt: conversations "
                   "with loss flags; atif: Harbor ATIF with token ids; adp: Agent Data Protocol; traces: a folder of "
                   "Hugging Face Hub agent traces (one session file per trajectory, for the Hub's trace viewer); "
                   "swebench-predictions: SWE-bench's {instance_id, model_name_or_path, model_patch} per swe episode. "
                   "Default: parquet for a folder, omrl rows for a .jsonl file. Installed plugins add JSONL formats "
                   "(omrl plugins lists them).")
@click.option("--where", help="SQL condition over the trajectories view, e.g. \"success AND env = 'math'\".")
@click.option("--overwrite", is_flag=True,
              help="Replace an earlier export at --out (never a store, or a folder in or holding one).")
@click.option("--push", "repo_id", help="Also upload the export to this Hub dataset repo (user/name).")
@click.option("--private", is_flag=True, help="Create the Hub repo as private (with --push).")
@user_errors
@query_limits
def export(store: str, out: str, fmt: str | None, where: str | None, overwrite: bool, repo_id: str | None,
           private: bool) -> None:
    """Export trajectories to a Hugging Face dataset folder, a JSONL file (omrl, OpenAI, ShareGPT, ATIF, ADP) or Hub traces.

    Each JSONL format reads back with `omrl import`; see the README for what each one keeps.

    \b
    Example:  omrl export my-store --out sft.jsonl --format openai --where "success"
              omrl export my-store --out traces --format traces --push me/my-agent-traces
    """
    from omrl.formats.exporters import export_store, push_to_hub

    if private and not repo_id:
        raise click.UsageError("--private only applies with --push")
    with console.status(f"exporting {store}"):
        result = export_store(store, out, fmt, where, overwrite=overwrite)
    extra = f" and {result.annotations} annotations" if result.annotations else ""
    console.print(f"wrote {result.trajectories} trajectories{extra} to {result.path} ({result.format})")
    if repo_id:
        with console.status(f"pushing to {repo_id}"):
            url = push_to_hub(result.path, repo_id, private=private)
        console.print(f"pushed to {repo_id}: {url}")
