"""The operator's console (docs/web.md): an ASGI app with server-rendered pages, each also as
JSON under ``/api/...`` with the same fields.

    import assetq.web
    console = assetq.web.app(engine, namespace="assetq")          # read-only
    console = assetq.web.app(engine, read_only=False)             # with retry/cancel/pause

The overview's consumer table and a run page refresh themselves: htmx (vendored in
``static/htmx.min.js`` with its license, no CDN) asks for the part of the page that changes,
``/partials/...``, every ``refresh_seconds``.

Mount it in an application (``Mount("/assetq", app=console)``) or serve it with
``assetq web``. Needs the ``web`` extra (``pip install 'assetq[web]'``).

Actions (retry, cancel, pause, unpause) exist only with ``read_only=False``; each is a POST
carrying the app's CSRF token (a hidden form field, an HMAC of a secret made per app), goes
through the public API (assetq.retry_run, cancel_run, pause_dag, unpause_dag: their fencing,
checks and error codes) in a transaction of its own, and is logged on logger ``assetq.web``
with the client's address (and the HTTP basic user when ``password`` is set).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote

import sqlalchemy as sa
from jinja2 import Environment, FileSystemLoader
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import api, ops
from ..errors import (
    AssetqError,
    InvalidArgument,
    InvalidRunState,
    UnknownAsset,
    UnknownDag,
    UnknownRun,
)
from ..validation import check_namespace
from . import data

__all__ = ["app"]

log = logging.getLogger("assetq.web")

_HERE = resources.files(__name__)

#: The form field that carries the CSRF token.
CSRF_FIELD = "csrf_token"

#: How often, by default, the live parts of the pages ask for themselves again.
REFRESH_SECONDS = 5.0

_NOT_FOUND = (UnknownDag, UnknownRun, UnknownAsset)


def _environment() -> Environment:
    # Autoescape on for every template, whatever its name: asset names, extra JSON and
    # errors are the producers' and workers' text, shown as text.
    env = Environment(
        loader=FileSystemLoader(str(_HERE / "templates")),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = lambda value: quote(str(value), safe="")
    env.filters["age"] = _age
    env.filters["summary"] = data.error_summary
    return env


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


class _BasicAuth(BaseHTTPMiddleware):
    """HTTP basic authentication: any user name, the one password (compared in constant
    time). The user name is what the action log says did it."""

    def __init__(self, app: Any, password: str) -> None:
        super().__init__(app)
        self.password = password.encode()

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        header = request.headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(encoded).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, password = "", ""
            if hmac.compare_digest(password.encode(), self.password):
                request.scope["assetq_user"] = user
                return await call_next(request)
        return Response(
            "authentication required\n",
            status_code=401,
            headers={"WWW-Authenticate": 'Basic realm="assetq"'},
        )


def app(
    engine: sa.Engine,
    namespace: str = "assetq",
    read_only: bool = True,
    *,
    password: str | None = None,
    secret: bytes | None = None,
    refresh_seconds: float = REFRESH_SECONDS,
) -> Starlette:
    """The console for ``namespace`` of ``engine``, as a Starlette app.

    ``read_only`` (the default) serves the pages only: the action forms are not shown and
    every POST is refused with 403. ``password`` asks every request for HTTP basic
    authentication with that password. ``secret`` keys the CSRF token (default: random,
    made once per app, so a token is good for this app's lifetime only). ``refresh_seconds``
    is how often the live parts of the pages (the overview's consumers, a run) ask for
    themselves again."""
    namespace = check_namespace(namespace)
    if not refresh_seconds > 0:
        raise ValueError(f"refresh_seconds must be positive, got {refresh_seconds!r}")
    # In whole milliseconds: htmx 4 reads "every 0.5s" as no interval at all and polls as
    # fast as its requests come back (about 100 a second), "every 500ms" as meant.
    refresh = f"every {max(1, round(refresh_seconds * 1000))}ms"
    env = _environment()
    key = secret if secret is not None else secrets.token_bytes(32)
    token = hmac.new(key, b"assetq.web csrf", hashlib.sha256).hexdigest()

    async def read(
        function: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        def work() -> dict[str, Any]:
            with engine.connect() as conn:
                return function(conn, namespace, *args, **kwargs)

        return await run_in_threadpool(work)

    def render(
        request: Request, template: str, page: dict[str, Any], status: int = 200
    ) -> Response:
        base = request.scope.get("root_path", "")
        context = {
            **page,
            "page": page,
            "base": base,
            "read_only": read_only,
            "csrf_field": CSRF_FIELD,
            "csrf_token": token,
            "namespace": namespace,
            "query": f"?{request.url.query}" if request.url.query else "",
            "refresh": refresh,
        }
        html = env.get_template(template).render(context)
        return HTMLResponse(html, status_code=status)

    Endpoint = Callable[[Request], Awaitable[Response]]

    def page(
        template: str, load: Callable[[Request], Awaitable[dict[str, Any]]]
    ) -> tuple[Endpoint, Endpoint]:
        """A page and its /api twin: the same dict, as HTML and as JSON."""

        async def as_html(request: Request) -> Response:
            try:
                found = await load(request)
            except (AssetqError, ValueError) as exc:
                return render(request, "error.html", _problem(exc), _status(exc))
            return render(request, template, found)

        async def as_json(request: Request) -> Response:
            try:
                found = await load(request)
            except (AssetqError, ValueError) as exc:
                return JSONResponse(_problem(exc), status_code=_status(exc))
            return JSONResponse(found)

        return as_html, as_json

    def partial(template: str, load: Callable[[Request], Awaitable[dict[str, Any]]]) -> Endpoint:
        """The live part of a page, alone (what htmx swaps in): the same dict, the same
        template the page includes."""

        async def as_fragment(request: Request) -> Response:
            try:
                found = await load(request)
            except (AssetqError, ValueError) as exc:
                return render(request, "_error.html", _problem(exc), _status(exc))
            return render(request, template, found)

        return as_fragment

    def _int(request: Request, name: str) -> int | None:
        value = request.query_params.get(name)
        if value in (None, ""):
            return None
        try:
            return int(value)
        except ValueError:
            raise InvalidArgument(f"{name} must be an integer, got {value!r}") from None

    async def load_overview(request: Request) -> dict[str, Any]:
        after = request.query_params.get("after") or None
        return await read(data.overview, after=after)

    async def load_dag(request: Request) -> dict[str, Any]:
        return await read(
            data.dag,
            request.path_params["dag_id"],
            state=request.query_params.get("state") or None,
            before=_int(request, "before"),
            events_after=request.query_params.get("events_after") or None,
            partitions_after=request.query_params.get("partitions_after") or None,
        )

    async def load_run(request: Request) -> dict[str, Any]:
        return await read(data.run, request.path_params["dag_id"], request.path_params["run_id"])

    async def load_assets(request: Request) -> dict[str, Any]:
        after = request.query_params.get("after") or None
        return await read(data.assets, after=after)

    async def load_asset(request: Request) -> dict[str, Any]:
        return await read(
            data.asset,
            request.path_params["name"],
            before=request.query_params.get("before") or None,
            key=request.query_params.get("key") or None,
        )

    async def load_workers(request: Request) -> dict[str, Any]:
        return await read(data.workers)

    routes: list[Any] = []
    for path, template, load in (
        ("/", "overview.html", load_overview),
        ("/dags/{dag_id}", "dag.html", load_dag),
        ("/dags/{dag_id}/runs/{run_id}", "run.html", load_run),
        ("/assets", "assets.html", load_assets),
        ("/assets/{name:path}", "asset.html", load_asset),
        ("/workers", "workers.html", load_workers),
    ):
        html, json_ = page(template, load)
        api_path = "/api" if path == "/" else "/api" + path
        routes.append(Route(path, html, methods=["GET"]))
        routes.append(Route(api_path, json_, methods=["GET"]))

    for path, template, load in (
        ("/partials/consumers", "_consumers.html", load_overview),
        ("/partials/dags/{dag_id}/runs/{run_id}", "_run.html", load_run),
    ):
        routes.append(Route(path, partial(template, load), methods=["GET"]))

    async def action(request: Request) -> Response:
        """POST .../retry, .../cancel, /dags/<dag>/pause, .../unpause."""
        what = request.path_params["action"]
        dag_id = request.path_params["dag_id"]
        run_id = request.path_params.get("run_id")
        who = _who(request)
        if what not in (_RUN_ACTIONS if run_id is not None else _DAG_ACTIONS):
            return render(
                request, "error.html", {"error": f"no action {what!r}", "code": None}, 404
            )
        if read_only:
            log.warning(
                "refused %s of %s %s by %s: the console is read-only", what, dag_id, run_id, who
            )
            return _refused(request, render, "this console is read-only (assetq web --actions)")
        # The forms are application/x-www-form-urlencoded: read here, so the console needs
        # no multipart parser (python-multipart) for its three fields.
        form = {
            k: v[-1] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()
        }
        sent = str(form.get(CSRF_FIELD) or "")
        if not hmac.compare_digest(sent.encode(), token.encode()):
            log.warning("refused %s of %s %s by %s: no valid CSRF token", what, dag_id, run_id, who)
            return _refused(request, render, "missing or wrong CSRF token: reload the page")
        reason = str(form.get("reason") or "") or None

        def work() -> None:
            with engine.begin() as conn:
                ops.require_dag(conn, dag_id, namespace=namespace)
                if what == "retry":
                    api.retry_run(conn, dag_id, str(run_id), namespace=namespace)
                elif what == "cancel":
                    api.cancel_run(conn, dag_id, str(run_id), reason, namespace=namespace)
                elif what == "pause":
                    api.pause_dag(conn, dag_id, namespace=namespace)
                else:
                    api.unpause_dag(conn, dag_id, namespace=namespace)

        try:
            await run_in_threadpool(work)
        except AssetqError as exc:
            log.warning("%s of %s %s by %s failed: %s", what, dag_id, run_id, who, exc)
            status = _status(exc)
            return render(request, "error.html", _problem(exc), status)
        fields = {"dag_id": dag_id, "run_id": run_id, "action": what, "client": who}
        log.info("%s of %s %s by %s", what, dag_id, run_id, who, extra=fields)
        base = request.scope.get("root_path", "")
        where = f"{base}/dags/{quote(dag_id, safe='')}"
        if run_id is not None:
            where += f"/runs/{quote(run_id, safe='')}"
        return RedirectResponse(where, status_code=303)

    routes += [
        Route("/dags/{dag_id}/runs/{run_id}/{action:str}", action, methods=["POST"]),
        Route("/dags/{dag_id}/{action:str}", action, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
    middleware = [] if password is None else [Middleware(_BasicAuth, password=password)]
    console = Starlette(routes=routes, middleware=middleware)
    console.state.csrf_token = token
    return console


_RUN_ACTIONS = frozenset({"retry", "cancel"})
_DAG_ACTIONS = frozenset({"pause", "unpause"})


def _who(request: Request) -> str:
    client = request.client.host if request.client else "unknown"
    user = request.scope.get("assetq_user")
    return f"{user}@{client}" if user else client


def _refused(request: Request, render: Callable[..., Response], message: str) -> Response:
    return render(request, "error.html", {"error": message, "code": None}, 403)


def _problem(exc: Exception) -> dict[str, Any]:
    return {"error": str(exc), "code": getattr(exc, "code", None)}


def _status(exc: Exception) -> int:
    if isinstance(exc, _NOT_FOUND):
        return 404
    if isinstance(exc, InvalidRunState):
        return 409
    if isinstance(exc, InvalidArgument | ValueError):
        return 400
    return 500
