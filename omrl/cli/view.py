"""`omrl view`: browse a store's trajectories in the browser, or export them as static HTML."""

from __future__ import annotations

import click

from omrl.cli.common import Seconds, query_limits, user_errors
from omrl.store import open_store


def _need_view_extra(exc: ImportError) -> click.ClickException:
    return click.ClickException(f"omrl view needs the `view` extra ({exc.name} is missing): "
                                "pip install 'omrl[view]'")


@click.command()
@click.argument("store", type=click.Path(file_okay=False, exists=True))
@click.option("--port", type=int, default=8765, show_default=True, help="Port to serve on.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; the viewer is meant for this machine only.")
@click.option("--open", "open_browser", is_flag=True, help="Open the viewer in the default browser.")
@click.option("--export", "export_dir", type=click.Path(file_okay=False),
              help="Write the pages as static HTML files into this folder instead of serving.")
@click.option("--where", help="With --export: the SQL condition selecting the trajectories to export.")
@click.option("--search", help="With --export: only trajectories with a message matching this text search "
                               '(words and "phrases", as in the viewer\'s search box).')
@click.option("--limit", type=int, default=1000, show_default=True,
              help="With --export: at most this many trajectories (newest first).")
@click.option("--per-page", type=int, default=100, show_default=True,
              help="With --export: rows per list page (index.html, page-2.html, ... linked by next/prev).")
@click.option("--overwrite", is_flag=True,
              help="With --export: replace a non-empty folder (an earlier export) whole; a store never.")
@click.option("--timeout", type=Seconds(), default=20.0, show_default=True,
              help="Stop a page's queries (a WHERE typed in the viewer, say) once they run this many seconds.")
@user_errors
@query_limits
def view(store: str, port: int, host: str, open_browser: bool, export_dir: str | None, where: str | None,
         search: str | None, limit: int, per_page: int, overwrite: bool, timeout: float) -> None:
    """Browse trajectories in a local, read-only web viewer: list with SQL filter, threads, groups, runs.

    Pages answer only this machine's browser: requests from other sites are refused, a page's queries
    stop at --timeout and share --query-memory.

    \b
    Example:  omrl view demo-store --open
              omrl view demo-store --export site --where "NOT success" --limit 200
              omrl view demo-store --export site --search '"tool call" timeout' --overwrite
    """
    opened = open_store(store)
    if export_dir is not None:
        try:
            from omrl.view.export import export_site
        except ImportError as exc:
            raise _need_view_extra(exc) from None

        done = export_site(opened, export_dir, where=where, limit=limit, per_page=per_page, search=search,
                           overwrite=overwrite)
        cut = f"; {done.matched} matched, --limit kept the newest" if done.matched > done.trajectories else ""
        click.echo(f"wrote {done.trajectories} trajectories and {done.groups} groups to {done.index} "
                   f"({done.pages} list page{'s' if done.pages != 1 else ''}{cut})")
        return
    if where:
        raise click.UsageError("--where selects what --export writes; in the viewer, type it in the WHERE box")
    if search:
        raise click.UsageError("--search selects what --export writes; in the viewer, type it in the search box")
    if click.get_current_context().get_parameter_source("per_page") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--per-page sets the pages --export writes; the viewer pages with its own links")
    if overwrite:
        raise click.UsageError("--overwrite replaces the folder --export writes; the viewer writes nothing")
    try:
        import uvicorn

        from omrl.view.app import LOCAL_HOSTS, make_app
    except ImportError as exc:
        raise _need_view_extra(exc) from None

    local = host in ("127.0.0.1", "localhost", "::1")
    app = make_app(opened, allowed_hosts=LOCAL_HOSTS if local else ["*"], timeout=timeout)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/"
    click.echo(f"omrl view: {url} (read-only; Ctrl-C stops)")
    if not local:
        click.echo("warning: serving beyond this machine; anyone who can reach it can read the store", err=True)
    if open_browser:
        import threading
        import webbrowser

        threading.Timer(1.0, webbrowser.open, [url]).start()
    uvicorn.run(app, host=host, port=port, log_level="warning")
