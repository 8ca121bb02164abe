"""Stopping a worker: after the stop request (SIGTERM, ``stop()``) it claims nothing more, and
what it cannot finish within the grace period is released at once (``queued``, the attempt given
back), never left running until its lease expires.

Real ``scheduler worker`` processes sent SIGTERM, and workers run in a thread, on a SQLite file
and a PostgreSQL schema (the ``place`` fixture).
API §9.
"""

from __future__ import annotations

import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from process_support import start_scheduler, stop_gracefully
from store_places import StorePlace
from worker_process_support import db_options, events_of, status_of

from scheduler.worker import Worker
from tests.worker_support import add_job, enqueue, running, wait_for

HANDLERS = textwrap.dedent(
    """
    import asyncio
    import time
    from pathlib import Path

    MARKS = Path(__file__).parent / "marks"

    def mark(name):
        MARKS.mkdir(exist_ok=True)
        (MARKS / name).write_text("")

    def slow(occurrence, ctx):
        mark("slow-" + occurrence.trigger_key)
        time.sleep(occurrence.payload["seconds"])
        return "done"

    def stuck(occurrence, ctx):
        mark("stuck-" + occurrence.trigger_key)
        deadline = time.monotonic() + 30
        while not ctx.should_stop and time.monotonic() < deadline:
            time.sleep(0.02)
        return "discarded"

    async def stuck_async(occurrence, ctx):
        mark("stuck_async-" + occurrence.trigger_key)
        await asyncio.sleep(30)

    HANDLERS = {"slow": slow, "stuck": stuck, "stuck_async": stuck_async}
    """
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "shutdown_handlers.py").write_text(HANDLERS)
    return tmp_path


def start(home: Path, place: StorePlace, *extra: str) -> subprocess.Popen[str]:
    return start_scheduler(home, *db_options(place), "worker", "shutdown_handlers:HANDLERS", *extra)


def types(place: StorePlace, occurrence_id: str) -> list[str]:
    return [event[0] for event in events_of(place, occurrence_id)]


def test_after_sigterm_the_worker_claims_nothing_more(home: Path, place: StorePlace) -> None:
    """SIGTERM while a handler runs: the handler finishes, the occurrence queued behind it is not
    claimed (it used to be, by the same commit that settled the first; the grace period then ran
    out in its handler and it was dead-lettered ``lease_expired`` on its only attempt)."""
    with place.open() as store:
        add_job(store, "slow", max_attempts=1)
        first = enqueue(store, "slow", "first", payload={"seconds": 1.0}, at=0)
        second = enqueue(store, "slow", "second", payload={"seconds": 6.0}, at=1)
    process = start(home, place, "--grace-ms", "3000", "--lease-ms", "1000", "--no-periodic")
    wait_for(lambda: (home / "marks" / "slow-first").exists(), 30, "the first handler")
    code, stderr = stop_gracefully(process)
    assert code == 0, stderr
    assert status_of(place, first)[0] == "succeeded"
    assert not (home / "marks" / "slow-second").exists(), "a handler started after SIGTERM"
    assert types(place, second) == ["occurrence_enqueued"]
    assert status_of(place, second)[:2] == ("queued", 0)
    time.sleep(1.2)  # any lease the stopped worker left behind has expired by now
    with place.open() as store:
        taken = store.claim_next(owner_id="next-worker", lease_ms=60_000)
    assert taken is not None and (taken.id, taken.attempt) == (second, 1)


def test_work_the_grace_period_cannot_finish_is_released_at_once(home: Path, place: StorePlace) -> None:
    """A sync handler still running and an async one still awaiting when the grace period ends:
    both occurrences are released (they used to stay ``running`` until their leases expired, and
    on a last attempt were then dead-lettered ``lease_expired`` though they never failed)."""
    kinds = ("stuck", "stuck_async")
    with place.open() as store:
        for kind in kinds:
            add_job(store, kind, max_attempts=1)
        stuck = {kind: enqueue(store, kind, "one") for kind in kinds}
    process = start(home, place, "--grace-ms", "300", "--concurrency", "2", "--no-periodic")
    for kind in kinds:
        wait_for(lambda kind=kind: (home / "marks" / f"{kind}-one").exists(), 30, f"the {kind} handler")
    started = time.monotonic()
    code, stderr = stop_gracefully(process)
    assert code == 0, stderr
    assert time.monotonic() - started < 10
    with place.open() as store:  # another worker takes them at once, each on its only attempt
        taken = [store.claim_next(owner_id="next-worker", lease_ms=60_000) for _ in kinds]
    for kind, occurrence_id in stuck.items():
        last, fence, _, data = events_of(place, occurrence_id)[-2]
        assert (last, fence, data) == (
            "occurrence_released",
            1,
            {"attempt": 0, "maxAttempts": 1, "attemptReturned": True},
        ), kind
        assert f"released (shutdown grace period over) occurrence={occurrence_id}" in stderr
    assert {(o.id, o.attempt, o.fence) for o in taken if o is not None} == {(i, 1, 2) for i in stuck.values()}


class StopDuringClaims:
    """The real store; a stop request arrives while a claim's transaction is in flight (after it
    committed, before the worker saw its result), as a SIGTERM can."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.worker: Worker | None = None

    def _stop_now(self) -> None:
        assert self.worker is not None
        self.worker.stop()

    def claim_next(self, **arguments: Any) -> Any:
        claimed = self._store.claim_next(**arguments)
        if claimed is not None:
            self._stop_now()
        return claimed

    def settle_and_claim(self, **arguments: Any) -> Any:
        cycle = self._store.settle_and_claim(**arguments)
        if cycle.claimed is not None:
            self._stop_now()
        return cycle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_a_claim_in_flight_when_the_stop_arrives_is_released_not_run(place: StorePlace) -> None:
    store = place.open()
    add_job(store, "job", max_attempts=1)
    occurrence_id = enqueue(store, "job", "one")
    ran: list[str] = []
    wrapped = StopDuringClaims(store)
    worker = Worker(wrapped, {"job": lambda o, c: ran.append(o.id)}, periodic=False)  # type: ignore[arg-type]
    wrapped.worker = worker
    with running(worker) as thread:
        thread.join(timeout=20)
        assert not thread.is_alive()
    assert ran == []
    current = store.get_occurrence(occurrence_id)
    assert current is not None and (current.status, current.attempt, current.lease_owner) == (
        "queued",
        0,
        None,
    )
    assert types(place, occurrence_id) == ["occurrence_enqueued", "occurrence_claimed", "occurrence_released"]
    store.close()


def test_a_stop_during_a_handler_keeps_the_settling_commit_from_claiming(place: StorePlace) -> None:
    """The settlement of the last handler claims nothing once a stop was requested (the busy
    cycle used to decide to claim before the handler ran)."""
    store = place.open()
    add_job(store, "job")
    first = enqueue(store, "job", "first", at=0)
    second = enqueue(store, "job", "second", at=1)
    worker: Worker | None = None

    def handler(occurrence: Any, ctx: Any) -> str:
        assert worker is not None
        worker.stop()
        return occurrence.trigger_key

    worker = Worker(store, {"job": handler}, periodic=False)
    with running(worker) as thread:
        thread.join(timeout=20)
        assert not thread.is_alive()
    assert status_of(place, first)[0] == "succeeded"
    assert types(place, second) == ["occurrence_enqueued"]
    assert types(place, first)[-1] == "occurrence_succeeded"
    store.close()
