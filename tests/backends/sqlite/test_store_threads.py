"""A store shared by threads: every method, close() included, is safe (issue 15, item 1).

close() waits for the call in flight (it never frees the connection under a running statement),
later calls get SCHEDULER_STORE_CLOSED, and no write is ever half-committed. The stress test of
this kind is tests/reliability/test_thread_close_stress.py.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from hardening_support import (
    T0,
    enqueue_requests,
    expect_code,
    new_store,
    orphan_occurrences,
    raw_rows,
)

from scheduler import SchedulerKernelError, open_store


class GatedClock:
    """A clock that can hold a call inside its write transaction until released."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> int:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.release.wait(10)
        return T0


def test_close_waits_for_the_write_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    clock = GatedClock()
    store = new_store(path, clock=clock)
    results: dict[str, Any] = {}
    clock.armed = True
    writer = threading.Thread(
        target=lambda: results.update(batch=store.enqueue_many(enqueue_requests("b", 20)))
    )
    writer.start()
    assert clock.entered.wait(10)  # the batch holds its BEGIN IMMEDIATE transaction now
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close() returned while a write was in flight"
    clock.release.set()
    writer.join(10)
    closer.join(10)
    assert len(results["batch"]) == 20
    assert raw_rows(path, "SELECT count(*) FROM occurrences") == [(20,)]
    assert orphan_occurrences(path) == []
    expect_code("SCHEDULER_STORE_CLOSED", lambda: store.get_job("job-a"))


def _batches_until_closed(
    store: Any, prefix: str, acknowledged: list[int], failures: list[BaseException], started: threading.Event
) -> None:
    index = 0
    while True:
        try:
            acknowledged.append(len(store.enqueue_many(enqueue_requests(f"{prefix}-{index}", 20))))
        except BaseException as error:
            failures.append(error)
            return
        started.set()
        index += 1


def test_close_during_a_batch_loop_never_half_commits(tmp_path: Path) -> None:
    """The issue's input: enqueue_many of 20 items in a loop on one thread, close() from another."""
    path = tmp_path / "k.sqlite"
    for round_number in range(3):
        store = open_store(path, clock=lambda: T0) if round_number else new_store(path)
        acknowledged: list[int] = []
        failures: list[BaseException] = []
        started = threading.Event()
        writer = threading.Thread(
            target=_batches_until_closed, args=(store, f"r{round_number}", acknowledged, failures, started)
        )
        writer.start()
        assert started.wait(10)
        store.close()
        writer.join(10)
        assert len(failures) == 1
        assert isinstance(failures[0], SchedulerKernelError), repr(failures[0])
        assert failures[0].code == "SCHEDULER_STORE_CLOSED"
        written = raw_rows(
            path, "SELECT count(*) FROM occurrences WHERE trigger_key LIKE ?", (f"r{round_number}-%",)
        )
        assert written == [(20 * len(acknowledged),)]  # every acknowledged batch, nothing more
        assert orphan_occurrences(path) == []


def test_calls_waiting_behind_close_are_refused_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    clock = GatedClock()
    store = new_store(path, clock=clock)
    outcomes: list[Any] = []
    clock.armed = True
    holder = threading.Thread(
        target=lambda: store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="h")
    )
    holder.start()
    assert clock.entered.wait(10)

    def call(name: str) -> None:
        try:
            outcomes.append(getattr(store, name)())
        except BaseException as error:
            outcomes.append(error)

    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.1)
    waiting = [
        threading.Thread(target=call, args=(name,))
        for name in ("history", "list_dead_letters", "schema_info")
    ]
    for thread in waiting:
        thread.start()
    clock.release.set()
    for thread in [holder, closer, *waiting]:
        thread.join(10)
    # each waiting call either ran before close() took the lock, or got STORE_CLOSED; never a bare error
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, SchedulerKernelError) and outcome.code == "SCHEDULER_STORE_CLOSED"
    assert raw_rows(path, "SELECT count(*) FROM occurrences") == [(1,)]


def test_close_never_raises_a_driver_error(tmp_path: Path) -> None:
    """Even when the driver connection is already gone under the store."""
    store = new_store(tmp_path / "k.sqlite")
    store.connection.connection.dbapi_connection.close()  # type: ignore[union-attr]
    store.close()
    store.close()
    expect_code("SCHEDULER_STORE_CLOSED", lambda: store.get_job("job-a"))
