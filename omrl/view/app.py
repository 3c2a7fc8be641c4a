"""The viewer's web app: GET-only Starlette routes over one store, strict security headers, requests from
other sites refused, each request's queries under one time limit."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from omrl.store import Store
from omrl.store.query_limits import QueryError, QueryLimits
from omrl.view import pages
from omrl.view.data import PER_PAGE, StoreReader, search_available

DEFAULT_TIMEOUT_S = 20.0  # a request's queries in all (omrl view --timeout)

STATIC_DIR = Path(__file__).parent / "static"
LOCAL_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]

HEADERS = {
    "Content-Security-Policy": pages.CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class _SameOrigin:
    """Pure ASGI middleware refusing (403) what another site's page makes a browser ask for: any page can
    point an <img> or a form at 127.0.0.1. Refused: `Sec-Fetch-Site: cross-site` or `same-site` (another
    port of this host is another origin) and an `Origin` header that is not this server's (`null`
    included). Typed addresses and bookmarks (`none`), the viewer's own links (`same-origin`) and clients
    that send neither header pass."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        site = headers.get("sec-fetch-site", "").strip().lower()
        origin = headers.get("origin")
        own = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}"
        if site in ("cross-site", "same-site") or (origin is not None and origin.rstrip("/") != own):
            why = f"Sec-Fetch-Site: {site}" if site in ("cross-site", "same-site") else f"Origin: {origin}"
            response = PlainTextResponse(f"refused: the viewer answers only its own pages, not a request from "
                                         f"another site ({why})", status_code=403)
            return await response(scope, receive, send)
        await self.app(scope, receive, send)


class _SecurityHeaders:
    """Pure ASGI middleware adding HEADERS to every response (static files included)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.decode("latin-1").lower() not in {h.lower() for h in HEADERS}]
                headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in HEADERS.items()]
                message = dict(message, headers=headers)
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def make_app(store: Store, allowed_hosts: list[str] | None = None, timeout: float = DEFAULT_TIMEOUT_S,
             limits: QueryLimits | None = None) -> Starlette:
    """The read-only viewer of `store`. `allowed_hosts` guards against DNS rebinding (default: local
    names only; ["*"] accepts any Host header); a request's queries stop at `timeout` seconds in all, and
    its connections share `limits` (None: omrl.store.query_limits.query_limits)."""
    reader = StoreReader(store, timeout=timeout, limits=limits, serving=True)
    name = store.path.resolve().name
    links = pages.Links()

    def html(body: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(body, status_code=status)

    def listing(request: Request) -> Response:
        q = request.query_params
        page = reader.list_page(where=q.get("where", ""), sort=q.get("sort"), desc=q.get("dir", "desc") != "asc",
                                page=_int(q.get("page"), 1), per_page=_int(q.get("per_page"), PER_PAGE),
                                search=q.get("q", "") if search_available() else "")
        return html(pages.list_html(page, links, name), 400 if page.error else 200)

    def trajectory(request: Request) -> Response:
        row = reader.trajectory(request.path_params["trajectory_id"])
        if row is None:
            return html(pages.error_html("no trajectory with this id in the store", links, name), 404)
        return html(pages.trajectory_html(row, links, name))

    def full_text(request: Request) -> Response:
        q = request.query_params
        row = reader.trajectory(request.path_params["trajectory_id"])
        at = _int(q.get("at"), -1) if q.get("at") is not None else None
        call = _int(q.get("call"), -1) if q.get("call") is not None else None
        page = pages.full_text_html(row, q.get("field", "content"), at, call, links, name) if row else None
        if page is None:
            return html(pages.error_html("no such text in the store: give /full/TRAJECTORY_ID?field=content&at=N",
                                         links, name), 404)
        return html(page)

    def group(request: Request) -> Response:
        found = reader.group(request.path_params["group_id"])
        if found is None:
            return html(pages.error_html("no group with this id in the store", links, name), 404)
        return html(pages.group_html(found, links, name))

    def diff(request: Request) -> Response:
        a, b = request.query_params.get("a", ""), request.query_params.get("b", "")
        left = reader.trajectory(a) if a else None
        right = reader.trajectory(b) if b else None
        if left is None or right is None:
            missing = ", ".join(repr(x) for x, row in ((a, left), (b, right)) if row is None)
            return html(pages.error_html(f"no trajectory with id {missing} in the store; give ?a=ID&b=ID",
                                         links, name), 404)
        return html(pages.diff_html(left, right, links, name))

    def runs(request: Request) -> Response:
        return html(pages.runs_html(reader.runs(), links, name, store.path))

    async def not_found(request: Request, exc: Exception) -> Response:
        return html(pages.error_html("no such page", links, name), 404)

    async def failed(request: Request, exc: Exception) -> Response:  # past the time limit, all busy, ...
        return html(pages.error_html(str(exc), links, name, status=503), 503)

    @asynccontextmanager
    async def lifespan(app):
        reader.start()
        yield
        reader.close()

    def timed(page):
        """A page whose queries share one time limit (StoreReader.request)."""
        def run(request: Request) -> Response:
            with reader.request():
                return page(request)
        return run

    routes = [
        Route("/", timed(listing), methods=["GET", "HEAD"]),
        Route("/t/{trajectory_id:path}", timed(trajectory), methods=["GET", "HEAD"]),
        Route("/full/{trajectory_id:path}", timed(full_text), methods=["GET", "HEAD"]),
        Route("/g/{group_id:path}", timed(group), methods=["GET", "HEAD"]),
        Route("/runs", timed(runs), methods=["GET", "HEAD"]),
        Route("/diff", timed(diff), methods=["GET", "HEAD"]),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    middleware = [Middleware(_SecurityHeaders), Middleware(_SameOrigin),
                  Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or LOCAL_HOSTS)]
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={404: not_found, QueryError: failed},
                    lifespan=lifespan)
    app.state.reader = reader
    return app
