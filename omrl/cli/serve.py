"""`omrl serve`: a real model server on 127.0.0.1 that omrl's `openai:` policies talk to."""

from __future__ import annotations

import json
import time

import click

from omrl.cli.common import console, user_errors


@click.group()
def serve() -> None:
    """Serve a model for `--policy openai:NAME --base-url URL`.

    Example:  omrl serve vllm smollm2-135m-instruct --tool-parser hermes
    """


@serve.command("vllm")
@click.argument("model", required=False)
@click.option("--name", "served_name", help="The model name clients ask for (default: MODEL's name).")
@click.option("--port", type=int, help="Port on 127.0.0.1 (default: a free one).")
@click.option("--max-model-len", default=2048, show_default=True, help="Longest prompt + completion, in tokens.")
@click.option("--max-num-seqs", default=8, show_default=True, help="Sequences vLLM batches at once.")
@click.option("--tool-parser", help="vLLM's tool-call parser (e.g. hermes): the server returns tool calls itself. "
                                    "Without it, omrl's openai: policy asks for text and parses the calls.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto", show_default=True,
              help="Weights and activations; auto: bfloat16 where the CPU has bf16 instructions, else float32.")
@click.option("--install", is_flag=True, help="Install vLLM for CPUs into its own venv first if missing (~12 min).")
@click.option("--install-only", is_flag=True, help="Install vLLM for CPUs if missing, then exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the ready line as JSON (base_url, model, pids).")
@user_errors
def vllm(model: str | None, served_name: str | None, port: int | None, max_model_len: int, max_num_seqs: int,
         tool_parser: str | None, dtype: str, install: bool, install_only: bool, as_json: bool) -> None:
    """Run vLLM (the CPU build, in its own cached venv) for MODEL, a known model name or a model folder, until
    Ctrl-C; it and everything it starts stop with this command, however it ends.

    \b
    Example:  omrl serve vllm smollm2-135m-instruct --tool-parser hermes
              omrl collect --env math --policy openai:smollm2-135m-instruct --base-url URL --store runs/zs
              omrl serve vllm --install-only
    """
    from pathlib import Path

    from omrl.errors import UsageError
    from omrl.models.real import resolve_model
    from omrl.serve.vllm import VLLMServer, venv_python

    if install_only:
        console.print(f"vLLM for CPUs: {venv_python(install=True, progress=console.print).parent.parent}")
        return
    if not model:
        raise UsageError("name the model: `omrl serve vllm NAME_OR_FOLDER` (e.g. smollm2-135m-instruct)")
    folder = Path(resolve_model(model))
    server = VLLMServer(folder, served_name or (model if not Path(model).exists() else folder.name), port=port,
                        max_model_len=max_model_len, max_num_seqs=max_num_seqs, tool_parser=tool_parser,
                        dtype=None if dtype == "auto" else dtype)
    try:
        server.start(install=install, progress=console.print)
        ready = {"base_url": server.base_url, "model": server.served_name, "pids": server.pids()}
        if as_json:
            click.echo(json.dumps(ready), nl=True)
        else:
            console.print(f"ready: {server.base_url} serves [bold]{server.served_name}[/bold] "
                          f"(use --policy openai:{server.served_name} --base-url {server.base_url}); Ctrl-C stops it")
        while server.process is not None and server.process.alive():
            time.sleep(1.0)
        console.print(f"vLLM ended: {server.log_tail()}")
        raise SystemExit(1)
    except KeyboardInterrupt:
        console.print("stopping vLLM")
    finally:
        server.close()
