"""Tasks across real processes, on a real SQLite file and on the real PostgreSQL server:
``scheduler worker MODULE:ATTR`` given a ``Tasks`` object (``--queues``), a queue's concurrency
cap holding with 8 worker processes racing, and many processes registering the same definitions at
once (creation, then a changed definition: one compare-and-set update, every process succeeds).
(A worker given only ``--db`` on PostgreSQL serves its ``Tasks`` object's schema:
``tests/backends/postgresql/test_tasks_worker_schema.py``.)

API §10.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from process_support import (
    FORKSERVER,
    start_processes,
    start_python,
    start_scheduler,
    stop_gracefully,
    stop_processes,
    wait_processes,
)
from store_places import StorePlace
from task_app import app_home, register_app, run_app_worker
from tasks_support import app_environment, application, run_row, target_of
from worker_process_support import db_options
from worker_support import wait_for

WORKERS = 8
CAP = 3
RUNS = 24


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return app_home(tmp_path)


def live_leases(place: StorePlace, kind: str) -> int:
    now = int(time.time() * 1000)
    rows = place.sql(
        "SELECT count(*) FROM occurrences o JOIN jobs j ON j.job_id = o.job_id"
        " WHERE o.status = 'running' AND o.lease_expires_at > ? AND j.kind = ?",
        (now, kind),
    )
    return int(rows[0][0])


def statuses(place: StorePlace, job_id: str) -> dict[str, int]:
    rows = place.sql("SELECT status, count(*) FROM occurrences WHERE job_id = ? GROUP BY status", (job_id,))
    return {status: int(number) for status, number in rows}


def test_a_queue_cap_holds_across_8_worker_processes(place: StorePlace) -> None:
    with application(place, cap=CAP) as tasks:
        runs = tasks["app.slow"].defer_many([{"index": index, "seconds": 0.2} for index in range(RUNS)])
    target, where = target_of(place)
    workers = start_processes(run_app_worker, [(target, where.get("schema"), CAP)] * WORKERS)
    samples: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while statuses(place, "app.slow").get("succeeded", 0) < RUNS:
            assert time.monotonic() < deadline, statuses(place, "app.slow")
            assert all(worker.is_alive() for worker in workers), "a worker process exited"
            samples.append(live_leases(place, "capped"))
            time.sleep(0.005)
    finally:
        codes = stop_processes(workers)
    assert codes == [0] * WORKERS
    assert max(samples) == CAP, f"peak {max(samples)} over {len(samples)} samples"
    with application(place) as tasks:
        results = [tasks.get(run.id) for run in runs]
    assert all(run is not None and run.attempt == 1 for run in results)  # each ran once
    pids = {run.value["pid"] for run in results if run is not None}
    print(f"\n{place.backend}: peak {max(samples)}, cap {CAP} ({len(samples)} samples, {len(pids)} pids)")
    assert len(pids) > 1


def test_scheduler_worker_runs_a_tasks_object_and_its_queues_option(home: Path, place: StorePlace) -> None:
    with application(place) as tasks:
        urgent = tasks["app.urgent"].defer("hello")
        slow = tasks["app.slow"].defer(1, seconds=0)
    environment = app_environment(place)
    refused = start_scheduler(
        home, "worker", "app_module:tasks", "--kinds", "critical", environment=environment
    )
    assert refused.wait(60) == 2
    worker = start_scheduler(
        home, "worker", "app_module:tasks", "--queues", "critical", environment=environment
    )
    try:
        with application(place) as tasks:
            assert tasks.get(urgent.id) is not None
            assert urgent.result(timeout_s=30) == "HELLO"
            time.sleep(0.3)
            assert tasks.get(slow.id).status == "queued"  # type: ignore[union-attr]  # not served
    finally:
        code, stderr = stop_gracefully(worker)
    assert code == 0, stderr[-2000:]
    # --db names the database explicitly (the same one here): the tasks run there
    other = start_scheduler(home, *db_options(place), "worker", "app_module:tasks", environment=environment)
    try:
        assert slow.result(timeout_s=30) == {"index": 1, "pid": other.pid}
    finally:
        code, stderr = stop_gracefully(other)
    assert code == 0, stderr[-2000:]


PROCESSES = 6


def test_many_processes_registering_at_once_all_succeed(place: StorePlace) -> None:
    place.open().close()
    target, where = target_of(place)

    def race(attempts: int) -> list[dict[str, Any]]:
        barrier, results = FORKSERVER.Barrier(PROCESSES), FORKSERVER.Queue()
        arguments = (target, where.get("schema"), attempts, barrier, results)
        processes = start_processes(register_app, [arguments] * PROCESSES)
        reports = [results.get(timeout=60) for _ in processes]
        assert wait_processes(processes) == [0] * PROCESSES
        return reports

    created = race(3)
    assert all(report == {"app.slow": [1, 3], "app.urgent": [1, 3]} for report in created), created
    changed = race(5)
    assert all(report["app.slow"] == [2, 5] for report in changed), changed  # one update, seen by all
    assert all(report["app.urgent"] == [1, 3] for report in changed)
    rows = place.sql("SELECT job_id, revision FROM jobs ORDER BY job_id")
    assert [tuple(row) for row in rows] == [("app.slow", 2), ("app.urgent", 1)]
    events = place.sql("SELECT event_type, count(*) FROM events GROUP BY event_type ORDER BY event_type")
    assert [tuple(row) for row in events] == [("job_created", 2), ("job_updated", 1)]


LEASE_MS = 1_000


def test_a_killed_workers_slot_in_a_capped_queue_frees_when_its_lease_expires(place: StorePlace) -> None:
    """Cap 1: a worker process killed (SIGKILL) mid-run holds the queue's one slot until its
    lease expires, then another process runs the next run. (One attempt only, so the expired run
    is dead-lettered rather than taken again.)"""
    target, where = target_of(place)
    arguments = (target, where.get("schema"), 1, LEASE_MS, 1)
    with application(place, cap=1, attempts=1) as tasks:
        slow = tasks["app.slow"]
        first = slow.defer(0, seconds=60)
        (holder,) = start_processes(run_app_worker, [arguments])
        wait_for(lambda: statuses(place, "app.slow") == {"running": 1}, 30, "the first run to start")
        started = FORKSERVER.Event()
        (other,) = start_processes(run_app_worker, [(*arguments, started)])
        try:
            assert started.wait(30)
            second = slow.defer(1, seconds=0)
            time.sleep(0.5)
            assert (tasks.get(second.id) or second).status == "queued"  # the one slot is taken
            holder.kill()
            holder.join()
            expires = run_row(place, first.id)["lease_expires_at"]  # renewed no more
            assert second.result(timeout_s=30) == {"index": 1, "pid": other.pid}
        finally:
            stop_processes([holder, other])
        claimed = place.sql(
            "SELECT occurred_at FROM events WHERE occurrence_id = ? AND event_type = 'occurrence_claimed'",
            (second.id,),
        )
        assert claimed[0][0] >= expires  # not before the killed worker's lease expired
        assert (tasks.get(first.id) or first).status == "dead_letter"


FORKING = textwrap.dedent(
    """
    import os
    import sys

    sys.path.insert(0, os.getcwd())
    from app_module import tasks

    urgent = tasks["app.urgent"]
    tasks.register()  # at startup, before the server forks its workers (gunicorn --preload)
    print(urgent.defer("parent").result(timeout_s=30), flush=True)  # stores and LISTEN opened
    pid = os.fork()
    if pid == 0:
        try:
            print(urgent.defer("child").result(timeout_s=30), flush=True)
        except BaseException as error:
            print("child:", repr(error), flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
    print(urgent.defer("again").result(timeout_s=30), flush=True)  # the parent's stores still work
    """
)


def test_a_tasks_object_used_before_fork_works_in_the_child(home: Path, place: StorePlace) -> None:
    (home / "forking.py").write_text(FORKING)
    environment = app_environment(place)
    options = ("--poll-max-ms", "50")
    worker = start_scheduler(home, "worker", "app_module:tasks", *options, environment=environment)
    try:
        script = start_python(home, home / "forking.py", environment=environment)
        out, err = script.communicate(timeout=90)
    finally:
        code, stderr = stop_gracefully(worker)
    assert out.splitlines() == ["PARENT", "CHILD", "child exit 0", "AGAIN"], out + err[-3000:]
    assert script.returncode == 0 and code == 0, stderr[-2000:]
