"""`omrl envs`: list the environments; serve one over the AgentGym HTTP protocol."""

from __future__ import annotations

import click

from omrl.cli.common import console, user_errors


@click.group(invoke_without_command=True)
@click.pass_context
def envs(ctx: click.Context) -> None:
    """List the built-in environments with one-line descriptions.

    Example:  omrl envs
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_)


@envs.command("list")
@user_errors
def list_() -> None:
    """List the environments: built-in and from installed plugins (also usable: --env package.module:ClassName).

    Each row says where it comes from, whether it runs here (else the missing extra or system package),
    the splits its task generator knows and the resource limits in force. A plugin that fails to load or
    to answer is named in a warning line and left out; the others are listed.

    Example:  omrl envs list
    """
    from rich.table import Table

    from omrl.envs import ENVIRONMENTS, EnvSpecError, registry

    table = Table(title="environments")
    for column in ("name", "from", "runs here", "tasks", "description"):
        table.add_column(column, overflow="fold")
    for name, entry in sorted(registry().items()):
        if name in ENVIRONMENTS.builtins:
            try:
                table.add_row(*_row(name, entry.provider))
            except EnvSpecError as exc:
                table.add_row(name, entry.provider, f"no: {exc}", "-", "")
            continue
        try:
            table.add_row(*_row(name, entry.provider))
        except Exception as exc:  # a plugin's code, not omrl's: whatever it raises, it is skipped, named
            ENVIRONMENTS.skip(name, exc)
    console.print(table)


def _row(name: str, provider: str) -> tuple[str, ...]:
    """The table row of one environment; raises what loading it or asking it (unavailable, limits) raises."""
    from omrl.envs import describe, env_class, unavailable

    cls = env_class(name)
    reason = unavailable(cls)
    generator = callable(getattr(cls, "generate_tasks", None))
    splits = ", ".join(getattr(cls, "splits", ()) or ()) or "any split"
    limits = getattr(cls, "resource_limits", None)
    shown = limits() if callable(limits) else None
    text = describe(name) + (f" Limits: {shown}" if shown else "")
    return (name, provider, "yes" if reason is None else f"no: {reason}",
            f"generate ({splits})" if generator else "import", text)


@envs.command()
@click.argument("env")
@click.option("--tasks", "tasks_path", required=True,
              help="Tasks file (data_idx indexes it), or shipped:NAME for a shipped task set.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@user_errors
def serve(env: str, tasks_path: str, host: str, port: int) -> None:
    """Serve ENV over the AgentGym HTTP protocol (create/reset/step/observation/close) until Ctrl-C.

    Example:  omrl envs serve math --tasks shipped:math_arith --port 8000
    """
    import time

    from omrl.envs import env_class
    from omrl.envs.http.server import start_server
    from omrl.tasks import load_tasks

    env_class(env)  # an unknown environment is an error now, not on the first /create
    tasks = load_tasks(tasks_path)
    try:
        httpd, url = start_server(env, tasks, host=host, port=port)
    except OSError as exc:  # port in use, address not available
        raise click.ClickException(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    console.print(f"serving {env} at {url} (Ctrl-C to stop)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        httpd.shutdown()
        httpd.server_close()
