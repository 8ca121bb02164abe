"""Batched worker cycles: a worker with several lanes claims for its free lanes in one transaction
and settles finished runs in groups together with the next claims, on a SQLite file and on
PostgreSQL (``place``), without weakening any guarantee: exactly-once settlement across processes,
a cancelled or lost member dropped from its group without failing the others, a stop settling the
pending group and releasing the unfinished runs, a bounded wait, pauses honoured.

Commits are counted on the worker's own connection (SQLAlchemy events; a transaction counts when
it wrote something), never timed.
API §9, §5 Batches.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import pytest
from process_support import start_processes, stop_processes
from sqlalchemy import Connection, event
from store_places import StorePlace
from tasks_support import target_of

from scheduler import SchedulerKernelError, SchedulerStore
from scheduler.worker import Worker
from tests.worker_support import PAUSABLE, add_job, checkpointing, noop, run_noop_worker, running, wait_for

_WRITE = re.compile(r"\b(INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM)\b", re.IGNORECASE)


class WriteCommits:
    """Counts the commits of ``connection`` whose transaction wrote something."""

    def __init__(self, connection: Connection) -> None:
        self.count = 0
        self._wrote = False
        self._connection = connection
        event.listen(connection, "before_cursor_execute", self._statement)
        event.listen(connection, "commit", self._commit)

    def _statement(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        self._wrote = self._wrote or _WRITE.search(statement) is not None

    def _commit(self, _conn: Any) -> None:
        self.count += self._wrote
        self._wrote = False

    def close(self) -> None:
        event.remove(self._connection, "before_cursor_execute", self._statement)
        event.remove(self._connection, "commit", self._commit)


def enqueue_runs(store: SchedulerStore, job_id: str, count: int, prefix: str = "r") -> list[str]:
    requests = [
        {"job_id": job_id, "scheduled_for": index, "trigger_key": f"{prefix}{index}", "payload": index}
        for index in range(count)
    ]
    return [occurrence.id for occurrence in store.enqueue_many(requests)]


def statuses(place: StorePlace) -> dict[str, int]:
    rows = place.sql("SELECT status, count(*) FROM occurrences GROUP BY status")
    return {status: int(number) for status, number in rows}


def status(place: StorePlace, occurrence_id: str) -> tuple[str, int]:
    rows = place.sql("SELECT status, attempt FROM occurrences WHERE occurrence_id = ?", (occurrence_id,))
    return str(rows[0][0]), int(rows[0][1])


def events(place: StorePlace, occurrence_id: str) -> list[tuple[str, int | None, int]]:
    """``(event_type, fence, occurred_at)`` of one occurrence, in order."""
    rows = place.sql(
        "SELECT event_type, fence, occurred_at FROM events WHERE occurrence_id = ? ORDER BY event_id",
        (occurrence_id,),
    )
    return [(str(row[0]), row[1], int(row[2])) for row in rows]


def drained_with(place: StorePlace, runs: int, concurrency: int) -> int:
    """Drain ``runs`` no-op runs with one worker of ``concurrency`` lanes; its write commits."""
    with place.open() as setup:
        add_job(setup, "noop")
        enqueue_runs(setup, "noop", runs)
    store = place.open()
    commits = WriteCommits(store.connection)
    worker = Worker(
        store, {"noop": noop}, concurrency=concurrency, periodic=False, poll_min_ms=5, poll_max_ms=20
    )
    with running(worker):
        wait_for(lambda: statuses(place).get("succeeded", 0) == runs, 60, "every run settled")
    commits.close()
    store.close()
    assert statuses(place) == {"succeeded": runs}
    return commits.count


def test_concurrency_8_drains_the_runs_with_far_fewer_commits_than_runs(place: StorePlace) -> None:
    runs = 240
    commits = drained_with(place, runs, 8)
    # a lane-per-claim worker commits at least once per run; groups of up to 8 need about runs / 8
    assert commits <= runs // 4, commits


def test_a_group_commits_without_a_savepoint(place: StorePlace) -> None:
    runs = 64
    with place.open() as setup:
        add_job(setup, "noop")
        enqueue_runs(setup, "noop", runs)
    store = place.open()
    seen: list[str] = []

    def statement(_conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        seen.append(sql)

    event.listen(store.connection, "before_cursor_execute", statement)
    worker = Worker(store, {"noop": noop}, concurrency=4, periodic=False, poll_min_ms=5, poll_max_ms=20)
    with running(worker):
        wait_for(lambda: statuses(place).get("succeeded", 0) == runs, 60, "every run settled")
    event.remove(store.connection, "before_cursor_execute", statement)
    store.close()
    assert statuses(place) == {"succeeded": runs}
    assert [sql for sql in seen if re.match(r"\s*(SAVEPOINT|RELEASE)\b", sql, re.IGNORECASE)] == []


def test_concurrency_1_still_settles_and_claims_in_one_commit_per_run(place: StorePlace) -> None:
    runs = 30
    commits = drained_with(place, runs, 1)
    assert runs <= commits <= runs + 1  # the first claim, then one settle-and-claim per run


WORKER_PROCESSES = 4


def test_every_run_is_settled_exactly_once_by_4_processes_with_8_lanes_each(place: StorePlace) -> None:
    runs = 480
    with place.open() as setup:
        add_job(setup, "noop")
        ids = enqueue_runs(setup, "noop", runs)
    target, where = target_of(place)
    workers = start_processes(run_noop_worker, [(target, where.get("schema"), 8)] * WORKER_PROCESSES)
    try:
        deadline = time.monotonic() + 90
        while statuses(place).get("succeeded", 0) < runs:
            assert time.monotonic() < deadline, statuses(place)
            assert all(worker.is_alive() for worker in workers), "a worker process exited"
            time.sleep(0.05)
    finally:
        codes = stop_processes(workers)
    assert codes == [0] * WORKER_PROCESSES
    rows = place.sql(
        "SELECT occurrence_id, event_type, count(*), min(fence), max(fence), count(DISTINCT owner_id)"
        " FROM events WHERE event_type IN ('occurrence_claimed', 'occurrence_succeeded')"
        " GROUP BY occurrence_id, event_type"
    )
    counts = {(str(row[0]), str(row[1])): tuple(int(value) for value in row[2:]) for row in rows}
    for occurrence_id in ids:  # one claim, one settlement, same fence and owner
        assert counts[(occurrence_id, "occurrence_claimed")] == (1, 1, 1, 1), occurrence_id
        assert counts[(occurrence_id, "occurrence_succeeded")] == (1, 1, 1, 1), occurrence_id
    assert statuses(place) == {"succeeded": runs}
    results = place.sql("SELECT result_json, attempt FROM occurrences")
    assert sorted(int(row[0]) for row in results) == list(range(runs)) and {row[1] for row in results} == {1}
    owners = place.sql(
        "SELECT count(DISTINCT owner_id) FROM events WHERE event_type = 'occurrence_succeeded'"
    )
    assert int(owners[0][0]) > 1  # the processes shared the work


class Gate:
    """Handlers that wait at a gate: each says it started, then waits until the gate opens."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.opened = threading.Event()
        self._lock = threading.Lock()

    def handler(self, occurrence: Any, ctx: Any) -> str:
        with self._lock:
            self.started.append(occurrence.id)
        self.opened.wait(20)
        return "done"


def gated_worker(store: SchedulerStore, gate: Gate, **options: Any) -> Worker:
    settings: dict[str, Any] = {"concurrency": 4, "periodic": False, "poll_min_ms": 5, "poll_max_ms": 20}
    return Worker(store, {"gate": gate.handler}, **{**settings, **options})


def succeeded_at(place: StorePlace, occurrence_id: str) -> int:
    return next(at for kind, _fence, at in events(place, occurrence_id) if kind == "occurrence_succeeded")


def test_a_cancelled_member_is_dropped_and_the_rest_of_its_group_is_settled(
    place: StorePlace, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="scheduler.worker")
    with place.open() as setup:
        add_job(setup, "gate", max_attempts=3)
        ids = enqueue_runs(setup, "gate", 4)
    store, operator, gate = place.open(), place.open(), Gate()
    worker = gated_worker(store, gate, settle_batch_ms=1_000)
    with running(worker):
        wait_for(lambda: len(gate.started) == 4, 20, "four runs started")
        operator.cancel_occurrence(occurrence_id=ids[1], reason="no longer needed")
        gate.opened.set()  # all four end together: one group, one member cancelled
        wait_for(lambda: statuses(place).get("succeeded", 0) == 3, 20, "the other three settled")
    others = [ids[0], ids[2], ids[3]]
    assert len({succeeded_at(place, occurrence_id) for occurrence_id in others}) == 1  # one transaction
    assert status(place, ids[1])[0] == "dead_letter"
    assert "occurrence_succeeded" not in [kind for kind, _fence, _at in events(place, ids[1])]
    lost = [record for record in caplog.records if "result not settled (lease lost)" in record.getMessage()]
    assert [record.occurrence for record in lost] == [ids[1]]
    store.close()
    operator.close()


def test_a_member_whose_lease_was_lost_is_dropped_and_runs_again_under_a_new_fence(place: StorePlace) -> None:
    with place.open() as setup:
        add_job(setup, "gate", max_attempts=3)
        ids = enqueue_runs(setup, "gate", 3)
    store, operator, gate = place.open(), place.open(), Gate()
    worker = gated_worker(store, gate, concurrency=3, settle_batch_ms=1_000)
    with running(worker):
        wait_for(lambda: len(gate.started) == 3, 20, "three runs started")
        operator.release_lease(occurrence_id=ids[0], owner_id=worker.owner_id, fence=1)  # lost to us
        gate.opened.set()
        wait_for(lambda: statuses(place).get("succeeded", 0) == 3, 20, "all three settled")
    first = [(kind, fence) for kind, fence, _at in events(place, ids[0])]
    assert first[-1] == ("occurrence_succeeded", 2)  # its second claim, not the lost first run
    assert [kind for kind, _fence in first].count("occurrence_succeeded") == 1
    for occurrence_id in ids[1:]:
        assert [(kind, fence) for kind, fence, _at in events(place, occurrence_id)][-1] == (
            "occurrence_succeeded",
            1,
        )
    store.close()
    operator.close()


def test_a_stop_settles_the_pending_group_and_releases_the_unfinished_runs(place: StorePlace) -> None:
    with place.open() as setup:
        add_job(setup, "quick")
        add_job(setup, "stuck", max_attempts=1)
        quick = enqueue_runs(setup, "quick", 1, "q")[0]
        stuck = enqueue_runs(setup, "stuck", 1, "s")[0]
    finished, started = threading.Event(), threading.Event()

    def quick_handler(occurrence: Any, ctx: Any) -> str:
        started.wait(10)  # end only once the other run is going: the group then waits for it
        finished.set()
        return "quick"

    def stuck_handler(occurrence: Any, ctx: Any) -> str:
        started.set()
        deadline = time.monotonic() + 20
        while not ctx.should_stop and time.monotonic() < deadline:
            time.sleep(0.01)
        return "discarded"

    store = place.open()
    handlers = {"quick": quick_handler, "stuck": stuck_handler}
    worker = Worker(store, handlers, concurrency=2, periodic=False, settle_batch_ms=1_000, poll_min_ms=5)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    assert finished.wait(20)
    time.sleep(0.1)
    assert status(place, quick) == ("running", 1)  # finished, waiting for its group
    worker.stop(grace_ms=300)
    thread.join(20)
    assert not thread.is_alive()
    assert status(place, quick) == ("succeeded", 1)
    assert status(place, stuck) == ("queued", 0)  # released: claimable at once, the attempt given back
    store.close()


def test_a_run_that_finishes_alone_waits_at_most_settle_batch_ms(place: StorePlace) -> None:
    with place.open() as setup:
        add_job(setup, "quick")
        add_job(setup, "gate")
        quick = enqueue_runs(setup, "quick", 1, "q")[0]
        enqueue_runs(setup, "gate", 1, "g")
    gate, returned = Gate(), {}

    def quick_handler(occurrence: Any, ctx: Any) -> str:
        wait_for(lambda: len(gate.started) == 1, 10, "the other run")
        returned["at"] = time.monotonic()
        return "quick"

    store = place.open()
    handlers = {"quick": quick_handler, "gate": gate.handler}
    worker = Worker(store, handlers, concurrency=2, periodic=False, settle_batch_ms=200, poll_min_ms=5)
    with running(worker):
        wait_for(lambda: status(place, quick)[0] == "succeeded", 10, "the quick run settled")
        settled_after = time.monotonic() - returned["at"]
        assert gate.started and not gate.opened.is_set()  # the other run is still going
        gate.opened.set()
    # 200 ms for its group, plus generous slack for a shared machine (the point: not held until
    # the other run ends, which here is never before the gate opens)
    assert settled_after < 0.2 + 2.0, settled_after
    store.close()


def test_settle_batch_ms_is_validated(place: StorePlace) -> None:
    with place.open() as store:
        for bad in (-1, 1_001, 2.5, "10", None, True):
            with pytest.raises(SchedulerKernelError) as raised:
                Worker(store, {"k": noop}, settle_batch_ms=bad)
            assert raised.value.code == "SCHEDULER_INVALID_ARGUMENT"
        assert Worker(store, {"k": noop}, settle_batch_ms=0).settle_batch_ms == 0


def test_a_pause_at_a_checkpoint_is_honoured_in_batched_mode(place: StorePlace) -> None:
    with place.open() as setup:
        add_job(setup, "long", max_attempts=1)
        add_job(setup, "noop")
        long = enqueue_runs(setup, "long", 1, "l")[0]
    first_run, runs = threading.Event(), []

    long_handler = checkpointing(first_run, runs, 300)

    store, operator = place.open(), place.open()
    handlers = {"long": long_handler, "noop": noop}
    worker = Worker(
        store, handlers, concurrency=4, periodic=False, pause_check_ms=0, poll_min_ms=5, poll_max_ms=50
    )
    with running(worker):
        assert first_run.wait(10)
        enqueue_runs(operator, "noop", 20)  # other lanes keep settling in groups meanwhile
        operator.request_occurrence_pause(
            occurrence_id=long, expected_fence=1, request_id="pause-1", capability=PAUSABLE
        )
        wait_for(lambda: status(place, long)[0] == "retry_wait", 20, "the pause")
        control = operator.get_occurrence_control(long)
        assert control is not None and control.state == "paused"
        operator.resume_occurrence(occurrence_id=long, expected_revision=control.revision, request_id="go-1")
        wait_for(lambda: statuses(place).get("succeeded", 0) == 21, 30, "the resumed run and the others")
    assert status(place, long) == ("succeeded", 1)  # resuming did not consume an attempt
    assert runs[0] is None and runs[1] == control.checkpoint["data"]
    store.close()
    operator.close()
