"""The worker runtime (API §9) on a real SQLite file: settling rules, concurrency, leases, pause,
storage contention, idle polling and shutdown."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from scheduler import SchedulerKernelError
from scheduler.testing import T0, SchedulerClock
from scheduler.worker import Paused, PermanentError, RetryPolicy, Worker
from tests.worker_support import (
    PAUSABLE,
    add_job,
    checkpointing,
    enqueue,
    event_types,
    new_store,
    running,
    wait_for,
)

NO_JITTER = RetryPolicy(base_ms=1_000, factor=2.0, max_ms=60_000, jitter=0.0)


class Opaque:
    pass


def runs_until_should_stop(started: threading.Event, seen: dict[str, bool]) -> Any:
    """A handler that works until ``ctx.should_stop`` (at most 10 s) and records what it saw."""

    def handler(occurrence: Any, ctx: Any) -> str:
        started.set()
        deadline = time.monotonic() + 10
        while not ctx.should_stop and time.monotonic() < deadline:
            time.sleep(0.02)
        seen["should_stop"] = ctx.should_stop
        return "too late"

    return handler


def test_results_and_failures_settle_by_the_rules(tmp_path: Path) -> None:
    clock = SchedulerClock()
    store = new_store(tmp_path / "k.sqlite", clock=clock)
    add_job(store, "work", max_attempts=3)
    add_job(store, "other")
    ids = {
        name: enqueue(store, "work", name, payload={"do": name})
        for name in ("ok", "opaque", "flaky", "permanent", "huge")
    }
    untouched = enqueue(store, "other", "not-mine")

    def handler(occurrence: Any, ctx: Any) -> Any:
        action = occurrence.payload["do"]
        if action == "ok":
            return {"sent": True, "kind": ctx.kind}
        if action == "opaque":
            return Opaque()
        if action == "flaky":
            raise ValueError("upstream timed out")
        if action == "permanent":
            raise PermanentError("address rejected", code="ADDRESS_REJECTED")
        raise PermanentError("m" * 3_000_000, code="C" * 10_000)

    worker = Worker(store, {"work": handler}, retry=NO_JITTER, periodic=False)
    assert worker.run_until_idle() == 5

    ok = store.get_occurrence(ids["ok"])
    assert ok is not None and ok.status == "succeeded" and ok.result == {"sent": True, "kind": "work"}
    opaque = store.get_occurrence(ids["opaque"])
    assert opaque is not None and opaque.status == "dead_letter" and opaque.attempt == 1
    assert opaque.last_error["code"] == "RESULT_NOT_JSON"
    flaky = store.get_occurrence(ids["flaky"])
    assert flaky is not None and flaky.status == "retry_wait"
    assert flaky.last_error == {"code": "ValueError", "message": "upstream timed out"}
    assert flaky.available_at == T0 + 1_000  # RetryPolicy: base_ms after attempt 1
    permanent = store.get_occurrence(ids["permanent"])
    assert permanent is not None and permanent.status == "dead_letter" and permanent.attempt == 1
    assert permanent.last_error == {"code": "ADDRESS_REJECTED", "message": "address rejected"}
    huge = store.get_occurrence(ids["huge"])
    assert huge is not None and huge.status == "dead_letter"
    assert len(huge.last_error["message"]) == 2_000 and len(huge.last_error["code"]) == 128
    mine = store.get_occurrence(untouched)
    assert mine is not None and mine.status == "queued"

    assert worker.run_until_idle() == 0  # the retry is not due yet
    clock.advance(1_000)
    assert worker.run_until_idle() == 1
    flaky = store.get_occurrence(ids["flaky"])
    assert flaky is not None and flaky.attempt == 2 and flaky.available_at == clock.now + 2_000
    clock.advance(2_000)
    assert worker.run_until_idle() == 1
    flaky = store.get_occurrence(ids["flaky"])
    assert flaky is not None and flaky.status == "dead_letter" and flaky.attempt == 3
    store.close()


def test_one_claim_serves_every_handled_kind_async_on_one_loop_sync_on_threads(tmp_path: Path) -> None:
    store = new_store(tmp_path / "k.sqlite")
    add_job(store, "sync")
    add_job(store, "async")
    for index in range(3):
        # One claim takes both kinds in the seed's order (job_kind as a sequence): the async
        # occurrences first, so the three lanes run them together, then the three sync ones.
        enqueue(store, "sync", f"s{index}", at=1)
        enqueue(store, "async", f"a{index}", at=0)
    barrier = threading.Barrier(3, timeout=10)
    loops: set[int] = set()
    running_async = {"now": 0, "max": 0}

    def sync_handler(occurrence: Any, ctx: Any) -> int:
        barrier.wait()  # three sync handlers at once, or BrokenBarrierError
        return threading.get_ident()

    async def async_handler(occurrence: Any, ctx: Any) -> str:
        loops.add(id(asyncio.get_running_loop()))
        running_async["now"] += 1
        running_async["max"] = max(running_async["max"], running_async["now"])
        await asyncio.sleep(0.3)
        running_async["now"] -= 1
        return "done"

    worker = Worker(store, {"sync": sync_handler, "async": async_handler}, concurrency=3, poll_max_ms=100)
    with running(worker):
        wait_for(lambda: store_counts(store).get("succeeded", 0) == 6, message="six settlements")
    assert len(loops) == 1 and running_async["max"] >= 2
    store.close()


def store_counts(store: Any) -> dict[str, int]:
    """Occurrences per status, read on a connection of its own."""
    path = store.connection.engine.url.database
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT status, count(*) FROM occurrences GROUP BY status").fetchall()
    return {status: count for status, count in rows}


def test_leases_are_renewed_in_the_background(tmp_path: Path) -> None:
    store = new_store(tmp_path / "k.sqlite")
    add_job(store, "slow")
    occurrence_id = enqueue(store, "slow", "one")

    def slow(occurrence: Any, ctx: Any) -> str:
        time.sleep(1.2)
        return "finished"

    worker = Worker(store, {"slow": slow}, lease_ms=600, periodic=False)
    assert worker.run_until_idle() == 1
    events = event_types(store, occurrence_id)
    assert events[-1] == "occurrence_succeeded"
    assert events.count("occurrence_renewed") >= 2  # every lease_ms / 3 = 200 ms
    store.close()


def test_lease_loss_stops_the_handler_and_the_result_is_not_settled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="scheduler")
    clock = SchedulerClock()
    path = tmp_path / "k.sqlite"
    store = new_store(path, clock=clock)
    add_job(store, "job")
    occurrence_id = enqueue(store, "job", "one")
    started, seen = threading.Event(), {}
    handler = runs_until_should_stop(started, seen)

    worker = Worker(store, {"job": handler}, lease_ms=1_000, periodic=False, owner_id="worker-a")
    with running(worker):
        assert started.wait(10)
        clock.advance(5_000)  # the lease has expired in store time
        thief = new_store(path, clock=clock)
        stolen = thief.claim_next(owner_id="worker-b", lease_ms=60_000)
        assert stolen is not None and stolen.id == occurrence_id
        wait_for(lambda: "should_stop" in seen, message="the handler to stop")
    assert seen["should_stop"] is True
    current = store.get_occurrence(occurrence_id)
    assert current is not None and current.status == "running" and current.lease_owner == "worker-b"
    assert "occurrence_succeeded" not in event_types(store, occurrence_id)
    lost = [record for record in caplog.records if getattr(record, "state", None) == "lease lost"]
    assert lost and lost[0].occurrence == occurrence_id and lost[0].owner == "worker-a"
    assert any("result not settled (lease lost)" in record.getMessage() for record in caplog.records)
    thief.close()
    store.close()


def test_pause_at_a_checkpoint_then_resume_with_the_checkpoint(tmp_path: Path) -> None:
    store = new_store(tmp_path / "k.sqlite")
    add_job(store, "long", max_attempts=1)
    occurrence_id = enqueue(store, "long", "one")
    first_run, runs = threading.Event(), []

    handler = checkpointing(first_run, runs, 500)

    worker = Worker(store, {"long": handler}, periodic=False, pause_check_ms=0, poll_max_ms=100)
    with running(worker):
        assert first_run.wait(10)
        claimed = store.get_occurrence(occurrence_id)
        assert claimed is not None
        store.request_occurrence_pause(
            occurrence_id=occurrence_id,
            expected_fence=claimed.fence,
            request_id="pause-1",
            capability=PAUSABLE,
        )
        wait_for(lambda: control_state(store, occurrence_id) == "paused", message="the pause")
        paused = store.get_occurrence(occurrence_id)
        control = store.get_occurrence_control(occurrence_id)
        assert paused is not None and control is not None
        assert paused.status == "retry_wait" and paused.lease_owner is None
        assert control.checkpoint["safePoint"] == "adapter_checkpoint"
        checkpoint = control.checkpoint["data"]
        store.resume_occurrence(
            occurrence_id=occurrence_id, expected_revision=control.revision, request_id="go-1"
        )
        wait_for(lambda: status(store, occurrence_id) == "succeeded", message="the resumed run")
    done = store.get_occurrence(occurrence_id)
    assert done is not None and done.attempt == 1  # resuming did not consume an attempt
    assert runs == [None, checkpoint] and done.result == {"resumed_from": checkpoint}
    store.close()


def control_state(store: Any, occurrence_id: str) -> str | None:
    control = store.get_occurrence_control(occurrence_id)
    return None if control is None else control.state


def status(store: Any, occurrence_id: str) -> str | None:
    occurrence = store.get_occurrence(occurrence_id)
    return None if occurrence is None else occurrence.status


def test_paused_is_a_base_exception() -> None:
    assert issubclass(Paused, BaseException) and not issubclass(Paused, Exception)


def test_busy_database_is_retried_for_claims_and_settlements(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    store = new_store(path, busy_timeout_ms=0)
    add_job(store, "job")
    first = enqueue(store, "job", "first")
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def hold_lock(seconds: float) -> None:
        blocker.execute("BEGIN IMMEDIATE")
        threading.Timer(seconds, lambda: blocker.execute("COMMIT")).start()

    def handler(occurrence: Any, ctx: Any) -> str:
        if occurrence.trigger_key == "first":
            hold_lock(0.5)  # the settlement meets SQLITE_BUSY and is retried
        return "ok"

    worker = Worker(store, {"job": handler}, periodic=False, poll_min_ms=20, poll_max_ms=100)
    hold_lock(0.5)  # the first claims meet SQLITE_BUSY
    with running(worker):
        wait_for(lambda: status(store, first) == "succeeded", message="the first occurrence")
        second = enqueue(store, "job", "second")
        wait_for(lambda: status(store, second) == "succeeded", message="the second occurrence")
    blocker.close()
    store.close()


class CountingStore:
    """The real store, counting ``claim_next`` calls (what an idle worker does)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.claims = 0

    def claim_next(self, **arguments: Any) -> Any:
        self.claims += 1
        return self._store.claim_next(**arguments)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_an_idle_worker_polls_with_capped_backoff(tmp_path: Path) -> None:
    store = new_store(tmp_path / "k.sqlite")
    add_job(store, "job")
    counting = CountingStore(store)
    worker = Worker(counting, {"job": lambda o, c: None}, poll_min_ms=50, poll_max_ms=400, periodic=False)  # type: ignore[arg-type]
    with running(worker):
        time.sleep(2.0)
    # 50, 100, 200, 400, 400, ... ms (±20 %): about 7 polls in 2 s; a busy loop would make thousands.
    assert 3 <= counting.claims <= 12
    store.close()


def test_stop_lets_in_flight_work_finish_within_the_grace_period(tmp_path: Path) -> None:
    store = new_store(tmp_path / "k.sqlite")
    add_job(store, "job")
    finishing = enqueue(store, "job", "finishing")
    started = threading.Event()

    def handler(occurrence: Any, ctx: Any) -> str:
        started.set()
        time.sleep(0.5)
        return "finished"

    worker = Worker(store, {"job": handler}, periodic=False)
    with running(worker) as thread:
        assert started.wait(10)
        worker.stop()
        thread.join(timeout=10)
        assert not thread.is_alive()
    assert status(store, finishing) == "succeeded"
    store.close()


def test_work_still_running_after_the_grace_period_is_released(tmp_path: Path) -> None:
    store = new_store(tmp_path / "k.sqlite")
    add_job(store, "job")
    stuck = enqueue(store, "job", "stuck")
    started, seen = threading.Event(), {}
    handler = runs_until_should_stop(started, seen)

    worker = Worker(store, {"job": handler}, periodic=False, shutdown_grace_ms=200)
    with running(worker) as thread:
        assert started.wait(10)
        worker.stop()
        thread.join(timeout=10)
    wait_for(lambda: "should_stop" in seen, message="the handler to see should_stop")
    time.sleep(0.2)
    assert seen["should_stop"] is True
    released = store.get_occurrence(stuck)  # never settled: given back for another worker at once
    assert released is not None and (released.status, released.attempt, released.lease_owner) == (
        "queued",
        0,
        None,
    )
    store.close()


@pytest.mark.parametrize(
    "options",
    [
        {"concurrency": 0},
        {"lease_ms": 0},
        {"kinds": ["unhandled"]},
        {"missed_ticks": "some"},
        {"retry": {"base_ms": 1}},
        {"shutdown_grace_ms": -1},
    ],
)
def test_invalid_worker_options_are_refused(tmp_path: Path, options: dict[str, Any]) -> None:
    store = new_store(tmp_path / "k.sqlite")
    with pytest.raises(SchedulerKernelError) as raised:
        Worker(store, {"job": lambda o, c: None}, **options)
    assert raised.value.code == "SCHEDULER_INVALID_ARGUMENT"
    with pytest.raises(SchedulerKernelError):
        Worker(store, {})
    store.close()


def test_a_failing_claim_half_never_costs_the_settlement(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    store = new_store(path)
    add_job(store, "job")
    first = enqueue(store, "job", "first", at=0)
    corrupt = enqueue(store, "job", "corrupt", at=1)
    with sqlite3.connect(path) as connection:  # a stored row the claim cannot map (SCHEDULER_DATA_CORRUPT)
        connection.execute(
            "UPDATE occurrences SET authority_json = '{\"x\":1}' WHERE occurrence_id = ?", (corrupt,)
        )
    worker = Worker(store, {"job": lambda o, c: "done"}, periodic=False)
    assert worker.run_until_idle() == 1
    assert status(store, first) == "succeeded"
    store.close()
