"""Write docs/reference/cli.md and docs/reference/recipes.md from the code, so the reference cannot drift.

    python scripts/gen_reference.py            # writes docs/reference/*.md
    mkdocs build --strict                      # runs it too: mkdocs.yml names this file as a hook

- cli.md: the help of every command and subcommand of the `omrl` click group (a lazy group: each verb is
  loaded through the group's own get_command, as `omrl VERB --help` loads it).
- recipes.md: every setting of every recipe kind (each trainer TRAINERS registers, iterate, reward, judge
  rubric, import mapping) with its type, default and help, from the dataclass fields omrl.config loads.

Recipe classes are found by name in the omrl source, not by module path, so a module that moves needs no
change here.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import sys
import types
import typing
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference"
WIDTH = 100  # help text wrapped as on a 100-column terminal, the same on every machine

# (page heading, class name, how the recipe is used): the recipe kinds beside the registered trainers
OTHER_RECIPES = [
    ("iterate", "IterateRecipe", "`omrl train iterate --recipe FILE` and `omrl demo` (recipes `quickstart`, "
                                 "`iterate_grid`, `hard_grid`, `judge_grid`, `textworld_coin`)"),
    ("reward", "RewardRecipe", "`omrl annotate --reward-recipe FILE` and `reward:` in a GRPO, RFT or iterate recipe "
                               "(recipe `reward`)"),
    ("judge rubric", "Rubric", "`omrl annotate --judge FILE` and a reward recipe's judge components "
                               "(recipes `judges/*`)"),
    ("import mapping", "RecordMapping", "`omrl import FILE --map MAPPING` (recipes `imports/*`)"),
]


def _find_class(name: str) -> type:
    """The class `name` defined at the top level of a module under omrl/ (found by parsing, then imported)."""
    for path in sorted((ROOT / "omrl").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.ClassDef) and node.name == name for node in tree.body):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            return getattr(importlib.import_module(module), name)
    raise LookupError(f"no class {name} under omrl/")


def _find_trainers():
    """omrl's TRAINERS registry, wherever its module lives."""
    for path in sorted((ROOT / "omrl").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "\nTRAINERS = " in text:
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            return importlib.import_module(module).TRAINERS
    raise LookupError("no TRAINERS registry under omrl/")


# ---- the CLI -------------------------------------------------------------------------------------------

def command_paths(group: click.Command, ctx: click.Context) -> list[tuple[tuple[str, ...], click.Command,
                                                                           click.Context]]:
    """(path, command, context) for `group` and every command below it, depth first, names sorted."""
    found = [(tuple(ctx.command_path.split()[1:]), group, ctx)]
    if isinstance(group, click.Group):
        for name in sorted(group.list_commands(ctx)):
            command = group.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            sub = click.Context(command, info_name=name, parent=ctx, max_content_width=WIDTH, terminal_width=WIDTH)
            found.extend(command_paths(command, sub))
    return found


def cli_page() -> str:
    """docs/reference/cli.md: every command's --help, one section each."""
    from omrl.cli.main import cli

    root = click.Context(cli, info_name="omrl", max_content_width=WIDTH, terminal_width=WIDTH)
    lines = ["# Command reference", "",
             "Generated from the `omrl` click group by `scripts/gen_reference.py`: the text each command prints "
             "with `--help`.", ""]
    for path, command, ctx in command_paths(cli, root):
        title = " ".join(("omrl", *path))
        lines += [f"## {title}", "", "```text", command.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(lines)


# ---- the recipes ----------------------------------------------------------------------------------------

def type_name(hint: typing.Any) -> str:
    """A type hint as a reader writes it: `int`, `str | None`, `list[str]`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None:
        base = getattr(origin, "__name__", str(origin))
        return f"{base}[{', '.join('...' if a is Ellipsis else type_name(a) for a in args)}]" if args else base
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        value = [dataclasses.asdict(v) for v in value]
    return f"`{value!r}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _item_class(hint: typing.Any) -> type | None:
    """The dataclass a field holds as a section (itself, optional or not, or the items of a list of them);
    else None."""
    options = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(options) == 1:
        hint = options[0]
    if dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) is list and typing.get_args(hint) and dataclasses.is_dataclass(typing.get_args(hint)[0]):
        return typing.get_args(hint)[0]
    return None


def section_tables(cls: type, prefix: str = "") -> list[str]:
    """A table of `cls`'s keys (type, default, help), then one per nested section (`lora.`, `components[].`)."""
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    rows, nested = [], []
    for f in fields:
        inner = _item_class(hints[f.name])
        if inner is not None:
            key = f.name + ("[]" if typing.get_origin(hints[f.name]) is list else "")
            nested.append((prefix + key, inner))
            rows.append(f"| `{prefix}{f.name}` | {_cell(type_name(hints[f.name]))} | section below | "
                        f"{_cell(f.metadata.get('help', ''))} |")
            continue
        rows.append(f"| `{prefix}{f.name}` | {_cell(type_name(hints[f.name]))} | {_cell(_default(f))} | "
                    f"{_cell(f.metadata.get('help', ''))} |")
    lines = ["| key | type | default | help |", "|---|---|---|---|", *rows, ""]
    for key, inner in nested:
        doc = (inner.__doc__ or "").strip().splitlines()[0] if inner.__doc__ else ""
        lines += [f"### `{key}`", "", *([doc, ""] if doc and not doc.startswith(inner.__name__ + "(") else []),
                  *section_tables(inner, key + ".")]
    return lines


def recipe_kinds() -> list[tuple[str, type, str]]:
    """(name, recipe class, how it is used) for every recipe kind: the registered trainers, then the others."""
    trainers = _find_trainers()
    kinds = [(name, trainers.load(name).recipe, f"`omrl train {name} --recipe FILE [key=value ...]`")
             for name in trainers.names()]
    return kinds + [(name, _find_class(cls), used) for name, cls, used in OTHER_RECIPES]


def recipes_page() -> str:
    """docs/reference/recipes.md: every recipe kind's keys with their types, defaults and help."""
    lines = ["# Recipe reference", "",
             "Generated from the recipe dataclasses by `scripts/gen_reference.py`. A recipe is a YAML file of "
             "these keys; `key=value` on the command line overrides one (dots for sections: `lora.r=8`), and "
             "an unknown key is an error naming it. `omrl recipes list` names the shipped recipes, "
             "`omrl recipes copy NAME` copies one to edit.", ""]
    for name, cls, used in recipe_kinds():
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        lines += [f"## {name}", "", f"Used by {used}.", ""]
        if doc and not doc.startswith(cls.__name__ + "("):
            lines += [doc, ""]
        lines += section_tables(cls)
    return "\n".join(lines)


def generate(out: Path = OUT) -> list[Path]:
    """Write the reference pages under `out`; a page whose text is unchanged is left alone (no rebuild loop
    under `mkdocs serve`)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (("cli.md", cli_page()), ("recipes.md", recipes_page())):
        path = out / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def on_pre_build(config, **kwargs) -> None:
    """The mkdocs hook: regenerate the reference before every build."""
    generate(Path(config["docs_dir"]) / "reference")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
