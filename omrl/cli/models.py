"""`omrl models`: build tiny offline models for tests and the CPU demo."""

from __future__ import annotations

import click

from omrl.cli.common import console, user_errors


@click.group()
def models() -> None:
    """Build small models offline (no download).

    Example:  omrl models tiny --out models/tiny
    """


@models.command("tiny")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder to write.")
@click.option("--hidden", default=128, show_default=True, help="Hidden size.")
@click.option("--layers", default=2, show_default=True, help="Number of transformer layers.")
@click.option("--vocab-size", default=1024, show_default=True, help="Upper bound of the learned BPE vocab.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random initial weights.")
@user_errors
def tiny(out_dir: str, hidden: int, layers: int, vocab_size: int, seed: int) -> None:
    """Build a tiny random Qwen2 with a freshly trained BPE tokenizer and TRL's qwen2_5 chat template.

    Example:  omrl models tiny --out models/tiny --hidden 128 --layers 2
    """
    from omrl.models import build_tiny_model

    path = build_tiny_model(out_dir, hidden=hidden, layers=layers, vocab_size=vocab_size, seed=seed)
    console.print(f"tiny model written to [bold]{path}[/bold]")
