"""Every command's --help as a newcomer with a wheel reads it: examples name shipped:NAME, never a checkout's
datasets/ or recipes/ path, and an example keeps its lines (click rewraps a paragraph unless a line holding only
\\b precedes it)."""

from __future__ import annotations

import inspect
import re

import click
from click.testing import CliRunner

from omrl.cli.main import cli

CHECKOUT_PATH = re.compile(r"(?<![\w/.:-])(?:datasets|recipes)/[\w./-]*")


def _commands() -> list[tuple[list[str], click.Command]]:
    """(path, command) for omrl itself and every command and subcommand under it."""
    ctx = click.Context(cli)
    out: list[tuple[list[str], click.Command]] = []

    def walk(path: list[str], command: click.Command) -> None:
        out.append((path, command))
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                walk([*path, name], command.get_command(ctx, name))

    walk([], cli)
    return out


def _printed_help(path: list[str], width: int = 80) -> str:
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="omrl", terminal_width=width)
    assert result.exit_code == 0, (path, result.output)
    return result.output


def _example_lines(command: click.Command) -> list[str]:
    """The lines of the Example paragraphs of a command's help, as written."""
    lines = []
    for paragraph in inspect.cleandoc(command.help or "").split("\n\n"):
        rows = [row for row in paragraph.splitlines() if row.strip() != "\b"]
        if rows and rows[0].startswith("Example"):
            lines += [row.strip() for row in rows]
    return lines


def test_no_help_names_a_checkout_path():
    named = [(" ".join(["omrl", *path]), found) for path, _ in _commands()
             for found in CHECKOUT_PATH.findall(_printed_help(path, width=1000))]  # wide: no path split
    assert not named, f"help names datasets/ or recipes/ paths (from a wheel: shipped:NAME): {named}"
    assert len(CHECKOUT_PATH.findall("--tasks datasets/tasks/x.jsonl -r recipes/a.yaml -r shipped:judges/a")) == 2


def test_examples_keep_their_lines():
    multi_line = 0
    for path, command in _commands():
        example = _example_lines(command)
        multi_line += len(example) > 1
        printed = {line.strip() for line in _printed_help(path).splitlines()}
        for line in example:
            assert line in printed, (f"omrl {' '.join(path)} --help rewraps its example line {line!r} "
                                     "(a line holding only \\b before the paragraph keeps it)")
    assert multi_line >= 5  # the examples with several lines are found


def test_collect_lists_its_required_options_first():
    printed = _printed_help(["collect"], width=200)
    options = re.findall(r"^  (-\w, )?(--[\w-]+)", printed.split("Options:")[1], re.M)
    names = [name for _, name in options]
    assert names[:4] == ["--env", "--tasks", "--policy", "--store"], names
    assert "--samples" in names and "--help" in names  # the others follow
