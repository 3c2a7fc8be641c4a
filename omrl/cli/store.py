"""`omrl store`: create, append to, check and compact stores."""

from __future__ import annotations

import sys

import click

from omrl.cli.common import console, query_limits, user_errors
from omrl.store import TABLES, Store, open_store
from omrl.store.layout import CompactPolicy
from omrl.store.record_files import append_files


@click.group()
def store() -> None:
    """Create, append to, check and compact trajectory stores.

    \b
    Example:  omrl export demo-store --out rows.jsonl && omrl store append my-store rows.jsonl
    """


@store.command("init")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--description", default="", help="A sentence for the dataset card.")
@user_errors
def init(path: str, description: str) -> None:
    """Create an empty store (a folder that is also a Hugging Face dataset).

    Example:  omrl store init my-store
    """
    Store.create(path, description=description)
    console.print(f"store ready at {path}")


@store.command("append")
@click.argument("path", type=click.Path(file_okay=False))
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--table", type=click.Choice(TABLES), default="trajectories", show_default=True)
@click.option("--create/--no-create", default=True, show_default=True, help="Create the store if missing.")
@click.option("--skip-existing", is_flag=True,
              help="Leave out rows whose id the store already holds (e.g. re-running an append that was "
                   "killed) instead of refusing the whole append.")
@user_errors
def append(path: str, files: tuple[str, ...], table: str, create: bool, skip_existing: bool) -> None:
    """Validate omrl-format records (.jsonl/.json/.parquet) and append them to a store, all files at once.

    Every record of every file is checked first; then all rows are committed as one part, or none are.

    \b
    Example:  omrl export demo-store --out rows.jsonl && omrl store append my-store rows.jsonl
    """
    target = open_store(path, create=create)
    appended = append_files(target, files, table=table, skip_existing=skip_existing)
    skipped = f" ({appended.skipped} already in the store, left out)" if appended.skipped else ""
    console.print(f"appended {appended.written} {table} rows from {len(files)} file(s){skipped}", highlight=False)


@store.command("check")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--repair", is_flag=True,
              help="First fix what can be fixed: remove what killed writers left, rebuild damaged side files, add "
                   "parts missing from the listing, rewrite the dataset card. Lost parts stay listed.")
@click.option("--accept-loss", is_flag=True,
              help="With --repair: drop parts that are missing or damaged from the store (damaged files are moved "
                   "to the table's .quarantine/ folder); their rows are gone. Each one is named.")
@click.option("--tokens", "model", metavar="MODEL",
              help="Also re-tokenise the stored messages with this model's chat template (a local checkpoint or "
                   "Hub id) and report every turn whose stored completion ids it does not reproduce.")
@click.option("--where", help="With --tokens: only the trajectories matching this SQL condition.")
@click.option("--show", default=20, show_default=True, help="With --tokens: drifts printed (all are counted).")
@user_errors
@query_limits
def check(path: str, repair: bool, accept_loss: bool, model: str | None, where: str | None, show: int) -> None:
    """List lost, damaged or unlisted parts and side files, a broken card, ids stored twice (and, with --tokens,
    token drifts); exit 1 on any.

    \b
    Example:  omrl store check my-store --repair
              omrl store check my-store --tokens Qwen/Qwen2.5-0.5B-Instruct
    """
    if where and not model:
        raise click.UsageError("--where only applies with --tokens")
    if accept_loss and not repair:
        raise click.UsageError("--accept-loss only applies with --repair")
    target = open_store(path)
    from omrl.store.search import build_missing, missing_indexes

    if repair:
        for line in target.repair(accept_loss=accept_loss).lines():
            console.print(line, highlight=False)
    problems = target.check()
    if not problems:
        console.print("all parts listed, whole and readable, every id stored once")
        if repair:
            with console.status("building missing search indexes"):
                built = build_missing(target)  # none on S3: its stores are not indexed
            if built:
                console.print(f"search: {built} missing index(es) built", highlight=False)
        unindexed = missing_indexes(target)
        if unindexed:  # information, not a problem: searches scan these parts, with the same results
            console.print(f"search: {len(unindexed)} part(s) without an index are scanned (--repair builds them)",
                          highlight=False)
    if not target.listed:
        console.print("note: omrl.json does not list the parts (a store from before omrl listed them), so a deleted "
                      "part cannot be told from one never written; the next append, compaction or `--repair` "
                      "writes the listing", highlight=False)
    for problem in problems:
        console.print(f"[red]problem[/red] {problem.path}: {problem.error}", highlight=False)
    drifted = False
    if model and not problems:
        from omrl.policies.tokens_check import check_store_tokens

        with console.status(f"re-tokenising with {model}"):
            report = check_store_tokens(target, model, where)
        skipped = f"; {report.without_ids} without completion ids, not checked" if report.without_ids else ""
        console.print(f"tokens: {report.turns} turns of {report.trajectories} trajectories re-tokenised with "
                      f"{model}'s chat template: {_drifts(len(report.drifts))}{skipped}", highlight=False)
        for drift in report.drifts[:show]:
            console.print(f"[red]drift[/red] {drift.describe()}", highlight=False, soft_wrap=True)
        if len(report.drifts) > show:
            console.print(f"... {len(report.drifts) - show} more (--show N)", highlight=False)
        drifted = not report.ok
    if problems or drifted:
        sys.exit(1)


def _drifts(n: int) -> str:
    return "no drift" if n == 0 else "1 drift" if n == 1 else f"{n} drifts"


@store.command("compact")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--table", type=click.Choice(TABLES), multiple=True, help="Only these tables (default: all).")
@click.option("--no-index", is_flag=True,
              help="Do not build the search index now (searches scan the part; `store check --repair` builds it).")
@user_errors
def compact(path: str, table: tuple[str, ...], no_index: bool) -> None:
    """Merge many small part files into one per table (readers see the same rows) and index it for search.

    \b
    Example:  omrl store compact my-store --no-index && omrl store check my-store --repair
    """
    target = open_store(path)
    for name in table or TABLES:
        before = len(target.parts(name))
        new = target.compact(name, index=not no_index)
        console.print(f"{name}: {before} parts -> {1 if new else before}")


@store.command("auto-compact")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--parts", "small_parts", type=click.IntRange(min=0), default=None,
              help="Compact once this many small parts exist (0 turns automatic compaction off; 1 is refused).")
@click.option("--part-mb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="A part smaller than this many megabytes counts as small (only small parts are merged).")
@user_errors
def auto_compact(path: str, small_parts: int | None, part_mb: float | None) -> None:
    """Show or change when appends compact small parts by themselves (stored in the store's omrl.json).

    Example:  omrl store auto-compact my-store --parts 64 --part-mb 32
    """
    target = open_store(path)
    policy = target.compact_policy
    if small_parts is not None or part_mb is not None:
        try:
            policy = CompactPolicy(small_parts=policy.small_parts if small_parts is None else small_parts,
                                   small_part_bytes=policy.small_part_bytes if part_mb is None
                                   else int(part_mb * 1024 * 1024))
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        target.set_compact_policy(policy)
    state = "off" if policy.small_parts == 0 else (
        f"once {policy.small_parts} parts under {policy.small_part_bytes / 1024 / 1024:g} MB exist")
    console.print(f"automatic compaction: {state}", highlight=False)
