"""`omrl import`: bring trajectory data made elsewhere (ShareGPT, OpenAI, SWE-agent, ...) into a store."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from omrl.cli.common import console, err_console, user_errors
from omrl.formats import FORMATS
from omrl.progress import terminal_reporter

KEY_FLAGS = ("messages", "reward", "success", "id", "instruction", "tools", "model", "content")


KEY_HELP = {
    "messages": "Where each record keeps its message list (dotted path): maps OpenAI/ShareGPT-style records "
                "under any key.",
    "content": "The key of each message's text, when not content/value (e.g. output); implies a mapping.",
}


def _key_option(name: str):
    return click.option(f"--{name}-key", f"{name}_key", default=None, metavar="KEY" if name == "content" else "PATH",
                        help=KEY_HELP.get(name, f"Where each record keeps its {name} (dotted path, e.g. info.{name}); "
                                                "implies a mapping."))


@click.command("import")
@click.argument("src", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              help="Store to import into (created when there is something to write).")
@click.option("--format", "fmt", default="auto", show_default=True, metavar="auto|" + "|".join(FORMATS.builtins) + "|PLUGIN",
              help="Source format; auto decides from the extension and the keys of the first record. Installed "
                   "plugins add formats (omrl plugins lists them).")
@click.option("--map", "map_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A YAML mapping of record keys onto the schema (`omrl recipes copy imports/tau_bench` gives one "
                   "to edit); the --*-key flags override it.")
@_key_option("messages")
@_key_option("reward")
@_key_option("success")
@_key_option("id")
@_key_option("instruction")
@_key_option("tools")
@_key_option("model")
@_key_option("content")
@click.option("--skip-errors", is_flag=True, help="Skip bad records (counted and reported) instead of stopping.")
@click.option("--partial", is_flag=True,
              help="When some files fail, still write the ones that converted (default: all or nothing).")
@click.option("--keep-demos", is_flag=True,
              help="Keep demonstration messages (SWE-agent is_demo) as trainable=false instead of skipping them.")
@click.option("--root", type=click.Path(file_okay=False, exists=True), default=None,
              help="Folder run ids are relative to (default: the working directory, or the files' common folder).")
@user_errors
def import_cmd(src: tuple[str, ...], store_path: str, fmt: str, map_path: str | None, skip_errors: bool,
               partial: bool, keep_demos: bool, root: str | None, **keys: str | None) -> None:
    """Import trajectory files into a store; importing the same data again (under any name) adds nothing.

    Each record becomes one trajectory (env `import:<format>`, run `import:<path relative to the root>`),
    messages in OpenAI form with linked tool calls; rewards and success only where the source states
    them. Every file is converted and checked before anything is written: when one fails, nothing is
    (unless --partial). Records under other keys: --messages-key KEY, or --map map.yaml.

    Example:  omrl import results.jsonl --messages-key traj --store my-store
    """
    from omrl.formats import format_module
    from omrl.formats.importer import ImportFailed, import_files
    from omrl.formats.mapping import load_mapping

    if fmt != "auto":
        format_module(fmt)  # an unknown format stops here, before any file is read

    overrides = {name: keys.get(f"{name}_key") for name in KEY_FLAGS}
    mapping = None
    if map_path or any(overrides.values()):
        if fmt not in ("auto", "openai", "sharegpt"):  # a mapping reads OpenAI or ShareGPT messages under any key
            raise click.UsageError(f"--format {fmt} and --map/--*-key are alternatives: a mapping says where everything is")
        mapping = load_mapping(map_path, **overrides)
    failure = None
    with terminal_reporter(console=err_console) as reporter:
        try:
            reports = import_files(src, store_path, fmt=fmt, skip_errors=skip_errors, partial=partial,
                                   root=root, mapping=mapping, keep_demos=keep_demos, reporter=reporter)
        except ImportFailed as exc:
            failure, reports = exc, exc.reports
    _summary(reports, store_path)
    if partial and failure is not None:
        written = [Path(r.path).name for r in reports if r.status == "written"]
        console.print(f"written: {', '.join(written) or 'none'}", highlight=False, markup=False)
    if failure is not None:
        raise failure


def _summary(reports, store_path: str) -> None:
    table = Table(title=f"import into {store_path}")
    for name in ("file", "format", "records", "imported", "already in store", "skipped", "status"):
        table.add_column(name, justify="left" if name in ("file", "format", "skipped", "status") else "right")
    for r in reports:
        skipped = ", ".join(f"{reason}: {n}" for reason, n in r.skipped.most_common()) or "0"
        status = f"failed: {r.reason}" if r.status == "failed" else r.status
        table.add_row(Path(r.path).name, r.format, str(r.records), str(r.imported), str(r.already_present), skipped,
                      status)
    console.print(table)
    for r in reports:
        if r.dropped:
            said = ", ".join(f"{n:,} characters ({reason})" for reason, n in r.dropped.most_common())
            console.print(f"{Path(r.path).name}: left out on purpose: {said}", highlight=False, markup=False)
        for example in r.examples:
            console.print(f"[yellow]skipped[/yellow] {example}", highlight=False, markup=True)
