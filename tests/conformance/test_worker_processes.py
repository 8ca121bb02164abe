"""``scheduler worker MODULE:ATTR`` end to end, as real processes running a user's handlers module
(``worker_support.HANDLERS``), on a SQLite file and on a PostgreSQL schema (the ``place`` fixture):
success, retry with backoff, permanent failure to dead letter, requeue, pause/resume at a
checkpoint, lease loss, SIGTERM in the middle of a handler.

The operator steps (``requeue``, ``pause``, ``resume``, ``controls list``) are ``scheduler``
commands too, on the same place.
API §9.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from store_places import StorePlace
from worker_process_support import (
    cli,
    db_options,
    events_of,
    runner,
    start_worker,
    status_of,
    stop,
    writes_blocked,
)

from scheduler.cli import app
from tests.worker_support import HANDLER_KINDS, HANDLERS, add_job, enqueue, wait_for


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "handlers_module.py").write_text(HANDLERS)
    return tmp_path


@pytest.fixture
def database(place: StorePlace) -> StorePlace:
    with place.open() as store:
        for kind in HANDLER_KINDS:
            add_job(store, kind, max_attempts=3)
    return place


def test_worker_runs_the_handlers_module_with_retries_permanent_failures_and_requeue(
    home: Path, database: StorePlace
) -> None:
    with database.open() as store:
        done = enqueue(store, "ok", "one", payload={"to": "a@example.org"})
        flaky = enqueue(store, "flaky", "one")
        fatal = enqueue(store, "fatal", "one")
    process = start_worker(home, database, "--concurrency", "2", "--retry-base-ms", "300", "--json")
    try:
        wait_for(lambda: status_of(database, done)[0] == "succeeded", 30, "success")
        wait_for(lambda: status_of(database, fatal)[0] == "dead_letter", 30, "permanent failure")
        wait_for(lambda: status_of(database, flaky)[0] == "succeeded", 30, "retry")
        requeued = cli(database, "requeue", fatal)
        assert requeued["deduplicated"] is False
        assert requeued["occurrence"]["status"] == "retry_wait"
        again = cli(database, "requeue", fatal, "--fence", "1", "--error-code", "RECIPIENT_REJECTED")
        assert again["deduplicated"] is True
        wait_for(lambda: status_of(database, fatal)[0] == "dead_letter", 30, "the requeued run")
    finally:
        code, stderr = stop(process)
    assert code == 0, stderr
    assert json.loads(status_of(database, done)[5]) == {"echo": {"to": "a@example.org"}}
    fatal_row = status_of(database, fatal)
    assert fatal_row[1] == 1 and json.loads(fatal_row[4]) == {
        "code": "RECIPIENT_REJECTED",
        "message": "recipient rejected",
    }
    flaky_events = events_of(database, flaky)
    assert [event[0] for event in flaky_events] == [
        "occurrence_enqueued",
        "occurrence_claimed",
        "occurrence_retry_scheduled",
        "occurrence_claimed",
        "occurrence_succeeded",
    ]
    claimed_at = flaky_events[1][2]
    _, _, failed_at, data = flaky_events[2]
    # --retry-base-ms 300 with ±10 % jitter, counted from the moment the handler failed: after the
    # claim and no later than the settle that recorded it (a loaded machine may delay the settle).
    assert claimed_at + 270 <= data["retryAt"] <= failed_at + 330
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert {"claimed", "retried", "settled", "dead-lettered"} <= {r.get("state") for r in records}
    assert any(
        r.get("state") == "retried" and r["occurrence"] == flaky and r["kind"] == "flaky" for r in records
    )


def test_pause_and_resume_of_a_running_handler(home: Path, database: StorePlace) -> None:
    with database.open() as store:
        long = enqueue(store, "long", "one")
    process = start_worker(home, database)
    try:
        wait_for(lambda: (home / "marks" / "long-started-1").exists(), 30, "the handler")
        assert cli(database, "pause", long)["control"]["state"] == "pause_requested"
        assert cli(database, "controls", "list", "--kind", "long")["count"] == 1  # any job kind
        wait_for(lambda: status_of(database, long)[0] == "retry_wait", 30, "the pause")
        assert cli(database, "resume", long)["control"]["state"] == "resumed"
        wait_for(lambda: status_of(database, long)[0] == "succeeded", 60, "the resumed run")
    finally:
        code, stderr = stop(process)
    assert code == 0, stderr
    result = json.loads(status_of(database, long)[5])
    assert isinstance(result["resumed_from"]["step"], int) and status_of(database, long)[1] == 1
    conflict = runner.invoke(app, [*db_options(database), "resume", long, "--json"])
    assert conflict.exit_code == 1, conflict.output  # no longer paused: a conflict
    assert json.loads(conflict.stdout)["error"]["code"] == "SCHEDULER_OCCURRENCE_CONTROL_CONFLICT"


def test_lease_loss_in_a_worker_process_abandons_the_result(home: Path, database: StorePlace) -> None:
    with database.open() as store:
        stubborn = enqueue(store, "stubborn", "one")
    process = start_worker(home, database, "--lease-ms", "900", "--json")
    try:
        wait_for(lambda: (home / "marks" / "stubborn-1").exists(), 30, "the handler")
        with writes_blocked(database, stubborn):  # renewals cannot write: the lease expires
            time.sleep(2.5)
        wait_for(lambda: (home / "marks" / "stubborn-stopped-1").exists(), 30, "should_stop")
    finally:
        code, stderr = stop(process)
    assert code == 0, stderr
    assert (home / "marks" / "stubborn-stopped-1").read_text() == "True"
    assert ("occurrence_succeeded", 1) not in [event[:2] for event in events_of(database, stubborn)]
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(r.get("state") == "lease lost" and r["occurrence"] == stubborn for r in records)


def test_sigterm_mid_handler_lets_it_finish_and_exits_zero(home: Path, database: StorePlace) -> None:
    with database.open() as store:
        slow = enqueue(store, "slow", "one")
    process = start_worker(home, database)
    wait_for(lambda: (home / "marks" / "slow-started").exists(), 30, "the handler")
    code, stderr = stop(process)
    assert code == 0, stderr
    assert (home / "marks" / "slow-finished").exists()
    assert status_of(database, slow)[0] == "succeeded"
    assert "worker stopping" in stderr and "worker stopped" in stderr
