"""A small, realistic queue for the dashboard's tests, built through the store's own methods, and a
dashboard served by uvicorn on 127.0.0.1 (a free port) in a thread of the test process.

``seed(store)`` leaves runs in every status: queued, running (two workers, one lease expired),
retry_wait, succeeded, dead letters (one with a hostile payload), an outcome-unknown dead letter
awaiting adjudication, a paused run and one whose pause was requested; jobs with cron, interval and
event triggers in three queues, one job with a hostile id.
"""

from __future__ import annotations

import http.cookiejar
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import pytest
import uvicorn
from backends import POSTGRESQL, SQLITE, PostgresServer, unique_name
from store_places import PostgresSchemaPlace, SqliteFilePlace, StorePlace

from scheduler import SchedulerStore
from scheduler.dashboard import create_app
from scheduler.testing import SchedulerClock

AUTHORITY: Final = {"principal": {"type": "service", "id": "shop"}, "workspaceId": "ws-main"}
HOSTILE_TEXT: Final = (
    '<script>window.__pwned = 1; alert("pwned")</script><img src=x onerror="window.__pwned = 2">'
    " 'quoted' \u202eevil\u202c zero\u200bwidth"
)
HOSTILE_JOB_ID: Final = 'evil.<script>alert(1)</script>"\u202egnp.exe'
PAUSE_CAPABILITY: Final = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint"]}
LEASE_MS: Final = 3_600_000


@dataclass(frozen=True)
class Seeded:
    """The ids of the runs the tests look at."""

    queued: list[str]
    running: str
    expired: str
    retry_wait: str
    succeeded: str
    dead_letter: str
    hostile: str
    outcome_unknown: str
    paused: str
    pause_requested: str


def _claim(store: SchedulerStore, occurrence_id: str, owner: str, lease_ms: int = LEASE_MS) -> Any:
    claimed = store.claim_occurrence(occurrence_id=occurrence_id, owner_id=owner, lease_ms=lease_ms)
    assert claimed is not None, occurrence_id
    return claimed


def _fail(store: SchedulerStore, occurrence: Any, code: str, message: str, retryable: bool = False) -> Any:
    return store.settle(
        occurrence_id=occurrence.id,
        owner_id=occurrence.lease_owner,
        fence=occurrence.fence,
        outcome="failed",
        error={"code": code, "message": message},
        retryable=retryable,
    )


def seed(store: SchedulerStore, now: int) -> Seeded:
    """Jobs and runs in every state (``now``: the store clock's current time, epoch ms)."""
    jobs = {
        "emails.send_welcome": ("emails", {"type": "event"}, 3),
        "reports.daily": (
            "reports",
            {"type": "cron", "expression": "0 8 * * *", "timezone": "Europe/Berlin"},
            3,
        ),
        "billing.charge": ("billing", {"type": "interval", "everyMs": 900_000, "anchor": 0}, 1),
        HOSTILE_JOB_ID: ("emails", {"type": "event"}, 1),
    }
    for job_id, (kind, trigger, attempts) in jobs.items():
        store.create_job(id=job_id, kind=kind, authority=AUTHORITY, trigger=trigger, max_attempts=attempts)

    def enqueue(job_id: str, key: str, payload: Any, delay: int = 0) -> str:
        return store.enqueue_occurrence(
            job_id=job_id, scheduled_for=now - 60_000 + delay, trigger_key=key, payload=payload
        ).id

    queued = [enqueue("emails.send_welcome", f"welcome-{user}", {"userId": user}) for user in range(1, 6)]
    running = _claim(store, enqueue("billing.charge", "interval:1", {"invoice": 17}), "worker-a")
    retry = _fail(
        store,
        _claim(store, enqueue("reports.daily", "cron:2026-01-01T07:00:00.000Z", {"day": 1}), "worker-a"),
        "TIMEOUT",
        "report took too long",
        retryable=True,
    )
    done = _claim(store, enqueue("reports.daily", "cron:2026-01-02T07:00:00.000Z", {"day": 2}), "worker-a")
    store.settle(
        occurrence_id=done.id,
        owner_id="worker-a",
        fence=done.fence,
        outcome="succeeded",
        result={"rows": 1200},
    )
    plain = _claim(store, enqueue(HOSTILE_JOB_ID, "plain", {"to": "a@example.com"}), "worker-a")
    dead = _fail(store, plain, "SMTP_REFUSED", "550 mailbox unavailable")
    hostile = _fail(
        store,
        _claim(store, enqueue("billing.charge", "hostile", {"note": HOSTILE_TEXT}), "worker-b"),
        "BAD_INPUT",
        HOSTILE_TEXT,
    )
    unknown = _fail(
        store,
        _claim(store, enqueue("billing.charge", "unknown", {"invoice": 19}), "worker-a"),
        "PAYMENT_OUTCOME_UNKNOWN",
        "the gateway timed out after the charge was sent",
    )
    paused = _claim(store, enqueue("reports.daily", "cron:2026-01-03T07:00:00.000Z", {"day": 3}), "worker-c")
    control = store.request_occurrence_pause(
        occurrence_id=paused.id,
        expected_fence=paused.fence,
        request_id="pause-1",
        capability=PAUSE_CAPABILITY,
    )
    store.ack_occurrence_pause(
        occurrence_id=paused.id,
        owner_id="worker-c",
        fence=paused.fence,
        request_id="pause-1",
        expected_revision=control.revision,
        safe_point="adapter_checkpoint",
        checkpoint={"page": 7},
    )
    asked = _claim(store, enqueue("reports.daily", "cron:2026-01-04T07:00:00.000Z", {"day": 4}), "worker-c")
    store.request_occurrence_pause(
        occurrence_id=asked.id, expected_fence=asked.fence, request_id="pause-2", capability=PAUSE_CAPABILITY
    )
    # Last: any later claim would first sweep this expired final attempt into a dead letter.
    expired = _claim(store, enqueue("billing.charge", "interval:2", {"invoice": 18}), "worker-b", lease_ms=1)
    return Seeded(
        queued=queued,
        running=running.id,
        expired=expired.id,
        retry_wait=retry.id,
        succeeded=done.id,
        dead_letter=dead.id,
        hostile=hostile.id,
        outcome_unknown=unknown.id,
        paused=paused.id,
        pause_requested=asked.id,
    )


HISTORY_MINUTES: Final = 40


def seed_history(store: SchedulerStore, clock: SchedulerClock) -> None:
    """The last ``HISTORY_MINUTES`` minutes of a worker's life in the ``reports`` queue, minute by
    minute (``clock`` starts that long ago): runs enqueued, claimed and settled, some failing."""
    store.create_job(id="reports.hourly", kind="reports", authority=AUTHORITY, max_attempts=2)
    for minute in range(HISTORY_MINUTES):
        count = 2 + minute % 4
        store.enqueue_many(
            [
                {"job_id": "reports.hourly", "scheduled_for": clock.now, "trigger_key": f"m{minute}-{n}"}
                for n in range(count)
            ]
        )
        clock.advance(20_000)
        claimed = store.claim_batch(owner_id="worker-history", lease_ms=60_000, limit=10)
        clock.advance(20_000)
        settlements = []
        for n, occurrence in enumerate(claimed):
            base = {"occurrence_id": occurrence.id, "owner_id": "worker-history", "fence": occurrence.fence}
            if (minute + n) % 5:
                settlements.append({**base, "outcome": "succeeded", "result": {"pages": n}})
            else:
                error = {"code": "UPSTREAM_502", "message": "bad gateway"}
                settlements.append({**base, "outcome": "failed", "error": error, "retry_at": clock.now})
        store.settle_many(settlements)
        clock.advance(20_000)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on 127.0.0.1 in a thread; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


# --------------------------------------------------------------------------- a served dashboard per backend


@dataclass
class Site:
    """A seeded store on one backend, its dashboard served on 127.0.0.1, and a view of its tables."""

    backend: str
    place: StorePlace
    store: SchedulerStore
    seeded: Seeded
    base: str

    def dump(self) -> dict[str, Any]:
        return self.place.dump()


@pytest.fixture(scope="module", params=[SQLITE, pytest.param(POSTGRESQL, marks=pytest.mark.postgresql)])
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """One seeded database and dashboard per backend for the whole module (a test that acts
    creates the runs it acts on, or acts on a seeded run no other test of the module uses)."""
    place: StorePlace
    if request.param == SQLITE:
        place = SqliteFilePlace(tmp_path_factory.mktemp("dashboard") / "kernel.sqlite")
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        place = PostgresSchemaPlace(server, server.empty_schema(unique_name("t_dashboard")))
    start = int(time.time() * 1000) - HISTORY_MINUTES * 60_000
    history_clock = SchedulerClock(start)
    with place.open(clock=history_clock) as history:
        seed_history(history, history_clock)
    store = place.open()
    try:
        seeded = seed(store, store.clock())
        with serve(create_app(store, refresh_ms=1_000)) as base:
            yield Site(request.param, place, store, seeded, base)
    finally:
        store.close()


# --------------------------------------------------------------------------- an HTTP client (stdlib)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Any
    text: str


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Client:
    """A browser-like HTTP client without JavaScript: keeps cookies, does not follow redirects."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies = http.cookiejar.CookieJar()
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies), _NoRedirect
        )

    def request(
        self,
        method: str,
        path: str,
        fields: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        data = None if fields is None else urllib.parse.urlencode(fields).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers or {})
        try:
            with self._opener.open(request, timeout=30) as response:
                return Answer(response.status, response.headers, response.read().decode())
        except urllib.error.HTTPError as error:
            return Answer(error.code, error.headers, error.read().decode())

    def get(self, path: str, headers: dict[str, str] | None = None) -> Answer:
        return self.request("GET", path, headers=headers)

    def post(self, path: str, fields: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
        return self.request("POST", path, fields, headers)

    def csrf(self, path: str = "/") -> str:
        """The CSRF token of this client's session, read from a page's forms (starts a session)."""
        page = self.get(path).text
        found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
        assert found is not None, page[:500]
        return found.group(1)

    def act(self, name: str, fields: dict[str, Any], *, return_to: str = "/") -> Answer:
        """POST an action with this session's CSRF token; then the page it returned to (its flash)."""
        answer = self.post(f"/actions/{name}", {**fields, "csrf_token": self.csrf(), "return_to": return_to})
        assert answer.status == 303, (answer.status, answer.text)
        return self.get(urllib.parse.urlsplit(answer.headers["location"]).path + _query(answer))


def _query(answer: Answer) -> str:
    query = urllib.parse.urlsplit(answer.headers["location"]).query
    return f"?{query}" if query else ""
