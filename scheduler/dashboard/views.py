"""The pages: each reads in one snapshot of the store and renders a template (GET only).

A page asked for with ``?fragment=1`` (htmx polling) answers with its live part only, so the
figures refresh without reloading the page or touching the filter forms.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import urlencode

from jinja2 import Environment
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from scheduler.contract.constants import DEAD_LETTER, OCCURRENCE_STATUSES
from scheduler.contract.errors import SchedulerKernelError
from scheduler.contract.storable import normalize_key
from scheduler.dashboard import lists, queries
from scheduler.dashboard.actions import BULK_LIMIT, CANCELLABLE
from scheduler.dashboard.runs import RunFilter, list_runs_in
from scheduler.dashboard.security import CSRF_FIELD, Guard, root_path, route_path
from scheduler.store.facade import SchedulerStore
from scheduler.store.plumbing.tx import Tx
from scheduler.worker.triggers import TriggerError, parse_trigger

T = TypeVar("T")
FLASH_COOKIE: Final = "scheduler_dashboard_flash"
NAV: Final = (
    ("overview", "/", "Overview"),
    ("runs", "/runs", "Runs"),
    ("jobs", "/jobs", "Jobs"),
    ("dead-letters", "/dead-letters", "Dead letters"),
    ("adjudication", "/adjudication", "Adjudication"),
    ("paused", "/paused", "Paused"),
    ("workers", "/workers", "Workers"),
)


@dataclass(frozen=True)
class Settings:
    """What every page needs besides the request: the store, the templates, the guard, options."""

    store: SchedulerStore
    templates: Environment
    guard: Guard
    read_only: bool
    refresh_ms: int


def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.dashboard
    return settings


async def read(request: Request, operation: Callable[[Tx, int], T]) -> T:
    """``operation(tx, now)`` in one read snapshot of the store, off the event loop."""
    store = settings_of(request).store

    def run() -> T:
        now = store.clock()
        return store._read(lambda tx: operation(tx, now))

    return await run_in_threadpool(run)


def link(request: Request, path: str, **params: Any) -> str:
    """``path`` below the dashboard's mount point, with the non-empty ``params`` as its query."""
    query = urlencode([(key, value) for key, value in params.items() if value not in (None, "")])
    return root_path(request.scope) + path + (f"?{query}" if query else "")


def link_below(request: Request) -> str:
    """This page's address below the mount point, without ``fragment`` (where an action returns to)."""
    query = urlencode(
        [(key, value) for key, value in request.query_params.multi_items() if key != "fragment"]
    )
    return route_path(request.scope) + (f"?{query}" if query else "")


def take_flash(request: Request) -> dict[str, Any] | None:
    data = settings_of(request).guard.unsign(b"flash", request.cookies.get(FLASH_COOKIE))
    if data is None:
        return None
    try:
        flash = json.loads(data)
    except ValueError:
        return None
    return flash if isinstance(flash, dict) else None


def render(
    request: Request, template: str, context: Mapping[str, Any], *, nav: str, status_code: int = 200
) -> Response:
    """The page (or with ``?fragment=1`` its live part, the template ``_<template>``)."""
    settings = settings_of(request)
    fragment = request.query_params.get("fragment") == "1"
    session = request.scope.get("state", {}).get("dashboard_session", "")
    flash = None if fragment else take_flash(request)
    values = {
        **context,
        "request": request,
        "nav": nav,
        "nav_items": NAV,
        "read_only": settings.read_only,
        "refresh_ms": settings.refresh_ms,
        "csrf_field": CSRF_FIELD,
        "csrf": settings.guard.csrf_token(session),
        "flash": flash,
        "url": lambda path, **params: link(request, path, **params),
        "self_fragment": link(
            request, route_path(request.scope), **{**request.query_params, "fragment": "1"}
        ),
        "here": link_below(request),
    }
    name = f"_{template}" if fragment else template
    response = HTMLResponse(settings.templates.get_template(name).render(values), status_code=status_code)
    if flash is not None:
        response.delete_cookie(FLASH_COOKIE, path=root_path(request.scope) or "/")
    return response


def failure_page(request: Request, error: SchedulerKernelError, *, nav: str, status_code: int) -> Response:
    return render(request, "error.html", {"error": error}, nav=nav, status_code=status_code)


# --------------------------------------------------------------------------- filters from the query


def filter_params(request: Request) -> dict[str, str]:
    """The listing's filter as submitted (echoed into the form, the links and the bulk forms)."""
    names = ("status", "queue", "job", "workspace", "code", "since", "until")
    return {name: request.query_params.get(name, "") for name in names}


# --------------------------------------------------------------------------- pages


async def overview(request: Request) -> Response:
    data = await read(request, queries.overview_in)
    context = {"o": data, "statuses": OCCURRENCE_STATUSES, "sample": queries.SAMPLE}
    return render(request, "overview.html", context, nav="overview")


async def throughput(request: Request) -> Response:
    data = await read(request, queries.throughput_in)
    return JSONResponse(data.to_json())


async def _listing(
    request: Request, template: str, nav: str, path: str, status: str | None = None
) -> Response:
    context: dict[str, Any] = {
        "params": filter_params(request),
        "statuses": OCCURRENCE_STATUSES,
        "fixed_status": status is not None,
        "base_path": path,
        "bulk_limit": BULK_LIMIT,
        "cancellable": CANCELLABLE,
        "window": queries.WINDOW,
    }
    try:
        runs = RunFilter.from_params(request.query_params, status=status)
    except SchedulerKernelError as error:
        return render(request, template, {**context, "filter_error": error}, nav=nav, status_code=400)
    cursor = request.query_params.get("cursor")
    page = await read(request, lambda tx, _now: list_runs_in(tx, runs, cursor))
    return render(request, template, {**context, "page": page, "filter_error": None}, nav=nav)


async def runs(request: Request) -> Response:
    return await _listing(request, "runs.html", "runs", "/runs")


async def dead_letters(request: Request) -> Response:
    return await _listing(request, "dead_letters.html", "dead-letters", "/dead-letters", DEAD_LETTER)


async def run(request: Request) -> Response:
    try:
        occurrence_id = normalize_key(request.query_params.get("id"), "id")
    except SchedulerKernelError as error:
        return failure_page(request, error, nav="runs", status_code=400)
    detail = await read(request, lambda tx, now: (lists.run_detail_in(tx, occurrence_id), now))
    found, now = detail
    if found is None:
        missing = SchedulerKernelError(
            "SCHEDULER_NOT_FOUND", f"Scheduler occurrence does not exist: {occurrence_id}"
        )
        return failure_page(request, missing, nav="runs", status_code=404)
    return render(request, "run.html", {"d": found, "now": now}, nav="runs")


@dataclass(frozen=True, slots=True)
class JobView:
    job: Any
    trigger_type: str | None
    next_tick: int | None
    trigger_problem: str | None


def _job_view(job: Any, now: int) -> JobView:
    kind = job.trigger.get("type") if isinstance(job.trigger, dict) else None
    try:
        trigger = parse_trigger(job.trigger, created_at=job.created_at)
    except TriggerError as error:
        return JobView(job, kind if isinstance(kind, str) else None, None, str(error))
    next_tick = None if trigger is None else trigger.next_after(now)
    return JobView(job, kind if isinstance(kind, str) else None, next_tick, None)


async def jobs(request: Request) -> Response:
    params = request.query_params
    try:
        kind = normalize_key(params["queue"], "queue") if params.get("queue") else None
        after = normalize_key(params["after"], "after") if params.get("after") else None
    except SchedulerKernelError as error:
        return failure_page(request, error, nav="jobs", status_code=400)
    page, now = await read(request, lambda tx, now: (lists.list_jobs_in(tx, after=after, kind=kind), now))
    views = [_job_view(job, now) for job in page.jobs]
    context = {"jobs": views, "next_after": page.next_after, "queue": kind or "", "now": now}
    return render(request, "jobs.html", context, nav="jobs")


async def adjudication(request: Request) -> Response:
    cases = await read(request, lambda tx, _now: lists.cases_in(tx))
    return render(
        request, "adjudication.html", {"cases": cases, "window": queries.WINDOW}, nav="adjudication"
    )


async def paused(request: Request) -> Response:
    found = await read(
        request,
        lambda tx, now: (
            lists.controlled_runs_in(tx, "paused"),
            lists.controlled_runs_in(tx, "pause_requested"),
            now,
        ),
    )
    context = {"paused": found[0], "requested": found[1], "now": found[2]}
    return render(request, "paused.html", context, nav="paused")


async def workers(request: Request) -> Response:
    found = await read(request, lambda tx, now: (lists.workers_in(tx, now), now))
    return render(
        request, "workers.html", {"w": found[0], "now": found[1], "window": queries.WINDOW}, nav="workers"
    )
