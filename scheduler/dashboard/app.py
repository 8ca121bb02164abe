"""``create_app``: the dashboard as an ASGI application (Starlette), standalone or mounted."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any, Final

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.dashboard import views
from scheduler.dashboard.actions import ACTIONS
from scheduler.dashboard.format import FILTERS
from scheduler.dashboard.security import CSRF_FIELD, CSRF_HEADER, Guard, SecurityMiddleware, root_path
from scheduler.store.facade import SchedulerStore

log = logging.getLogger("scheduler.dashboard")

DEFAULT_REFRESH_MS: Final = 5_000
MAX_FLASH_TEXT: Final = 1_000


def _store_of(target: Any) -> SchedulerStore:
    """The store behind ``create_app``'s argument: a store, or an object with a ``store`` (``Tasks``)."""
    if isinstance(target, SchedulerStore):
        return target
    store = getattr(target, "store", None)
    if isinstance(store, SchedulerStore):
        return store
    raise invalid_argument("create_app needs a SchedulerStore or a Tasks object")


def _templates() -> Environment:
    environment = Environment(
        loader=PackageLoader("scheduler.dashboard", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(FILTERS)
    return environment


def _safe_return(value: str | None) -> str:
    """Where an action sends the browser back to: a path of this dashboard (never another site)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def _flash_cookie(request: Request, response: Response, flash: dict[str, Any]) -> None:
    guard: Guard = views.settings_of(request).guard
    value = guard.sign(b"flash", json.dumps(flash, ensure_ascii=True).encode())
    response.set_cookie(
        views.FLASH_COOKIE,
        value,
        max_age=120,
        path=root_path(request.scope) or "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


async def _action(request: Request) -> Response:
    """Every POST: read-only → 403, CSRF token missing or wrong → 403, else the store method.

    The outcome (or the store's refusal, code and message) is shown on the page the form came from.
    """
    settings = views.settings_of(request)
    name = request.path_params["name"]
    action = ACTIONS.get(name)
    if action is None:
        return PlainTextResponse("404 Not Found: no such action", status_code=404)
    if settings.read_only:
        return PlainTextResponse("403 Forbidden: this dashboard is read-only", status_code=403)
    form = await request.form()
    fields = {key: value for key, value in form.items() if isinstance(value, str)}
    session = request.scope.get("state", {}).get("dashboard_session")
    submitted = fields.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
    if not settings.guard.csrf_ok(session, submitted):
        return PlainTextResponse("403 Forbidden: missing or invalid CSRF token", status_code=403)
    try:
        text = await run_in_threadpool(action, settings.store, fields)
        flash: dict[str, Any] = {"ok": True, "text": text[:MAX_FLASH_TEXT]}
        log.info("dashboard action %s: %s", name, text)
    except SchedulerKernelError as error:
        flash = {"ok": False, "code": error.code, "text": error.message[:MAX_FLASH_TEXT]}
        if error.details is not None:
            flash["details"] = json.dumps(error.details, ensure_ascii=False, default=str)[:MAX_FLASH_TEXT]
        log.info("dashboard action %s refused: %s %s", name, error.code, error.message)
    target = root_path(request.scope) + _safe_return(fields.get("return_to"))
    response = RedirectResponse(target, status_code=303)
    _flash_cookie(request, response, flash)
    return response


async def _store_failure(request: Request, error: Exception) -> Response:
    """A read the store refused (storage unavailable, corrupt data): its code and message, 503."""
    assert isinstance(error, SchedulerKernelError)
    log.warning("dashboard read failed: %s %s", error.code, error.message)
    return views.failure_page(request, error, nav="", status_code=503)


def create_app(
    store_or_tasks: Any,
    read_only: bool = False,
    token: str | None = None,
    *,
    allowed_hosts: Iterable[str] | None = None,
    secret: bytes | None = None,
    refresh_ms: int = DEFAULT_REFRESH_MS,
) -> Starlette:
    """The dashboard as an ASGI application (API §11).

    ``store_or_tasks``: an open ``SchedulerStore`` or a ``Tasks`` object (its store is used).
    ``read_only``: no action buttons, and every POST is refused with 403.
    ``token``: when set, every request needs ``Authorization: Bearer <token>`` or a session cookie
    obtained by visiting once with ``?token=<token>``; else 401.
    ``allowed_hosts``: host names the ``Host`` header may name (``None``: any; the CLI passes the
    loopback names when it runs without a token).
    ``secret``: the key that signs session cookies and CSRF tokens (default: derived from the
    token, else random per application — give one when several processes serve the dashboard
    without a token).
    ``refresh_ms``: how often the pages refresh their figures (at least 500).

    Raises ``SCHEDULER_INVALID_ARGUMENT`` for a bad argument (and, imported as
    ``scheduler.dashboard.create_app``, ``ImportError`` naming the extra when Starlette or Jinja2
    is missing). Mount it in a host with ``Mount("/scheduler", app=create_app(store))``; links,
    forms and cookies follow the mount.
    """
    store = _store_of(store_or_tasks)
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise invalid_argument("token must be a non-empty string")
    if type(refresh_ms) is not int or refresh_ms < 500:
        raise invalid_argument("refresh_ms must be an integer >= 500")
    guard = Guard(token, secret, allowed_hosts)
    routes = [
        Route("/", views.overview, methods=["GET"]),
        Route("/runs", views.runs, methods=["GET"]),
        Route("/run", views.run, methods=["GET"]),
        Route("/jobs", views.jobs, methods=["GET"]),
        Route("/dead-letters", views.dead_letters, methods=["GET"]),
        Route("/adjudication", views.adjudication, methods=["GET"]),
        Route("/paused", views.paused, methods=["GET"]),
        Route("/workers", views.workers, methods=["GET"]),
        Route("/api/throughput", views.throughput, methods=["GET"]),
        Route("/actions/{name}", _action, methods=["POST"]),
        Mount("/static", app=StaticFiles(packages=[("scheduler.dashboard", "static")]), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={SchedulerKernelError: _store_failure})
    app.state.dashboard = views.Settings(store, _templates(), guard, read_only, refresh_ms)
    app.add_middleware(SecurityMiddleware, guard=guard)
    return app
