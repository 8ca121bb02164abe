"""An ``enqueue_occurrence`` of a new identity runs as one statement (``enqueue_statement.py``).

Each scenario runs twice, in two fresh schemas: with the one-statement enqueue, and the usual way
(``enqueue_statement.enqueue_in_one_statement`` turned off: the lock, the job's read, the clock's
read, the two inserts and the notification as statements of their own). Results, errors and tables
(event ids densely renumbered) must be equal. What the statement does not decide itself (an
identity already stored, a missing or disabled job, a caller's payload that is not valid JSON, a
job whose stored texts were not verified) runs the usual way: it too must end as it did before.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import pytest
from backends import PostgresServer, unique_name
from cycle_support import densely_numbered
from sqlalchemy import create_engine, event
from test_fastpath_postgresql import Recorded, recording_cursor
from test_postgresql_races import AUTHORITY
from test_worker_listen import Listener

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.backends.postgresql import enqueue_statement
from scheduler.backends.postgresql.backend import key_space
from scheduler.backends.postgresql.wakeups import wake_channel
from scheduler.testing import dump_tables

pytestmark = pytest.mark.postgresql
T0 = 1_800_000_000_000
JOB = "job-1"
SERVER_TIMES = ("created_at", "updated_at", "occurred_at", "applied_at", "settled_at")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class Run:
    """One run of a scenario: the store (injected clock unless the server's), its schema and
    engine, the statements sent so far, and the enqueues left to one statement."""

    def __init__(self, store: SchedulerStore, schema: str, clock: Clock | None, seen: Recorded) -> None:
        self.store, self.schema, self.clock, self.seen = store, schema, clock, seen
        self.pending: list[enqueue_statement.PendingEnqueue] = []

    def written(self) -> int:
        """How many enqueues the statement wrote (others missed and ran the usual way)."""
        return sum(pending.result is not None for pending in self.pending)

    def execute(self, sql: str) -> None:
        """``sql`` (``{schema}``: the run's quoted schema) in a transaction of its own."""
        connection = self.store.connection
        connection.rollback()
        with connection.begin():
            connection.exec_driver_sql(sql.replace("{schema}", f'"{self.schema}"'))


def enqueue(store: SchedulerStore, **arguments: Any) -> Any:
    """``enqueue_occurrence`` of ``JOB`` (unless ``job_id`` says otherwise): the occurrence, or the
    error's code and details."""
    arguments.setdefault("job_id", JOB)
    arguments.setdefault("trigger_key", "t")
    arguments.setdefault("scheduled_for", T0)
    try:
        return store.enqueue_occurrence(**arguments)
    except SchedulerKernelError as error:
        return error.code, error.details


@contextmanager
def statement(run: Run, on: bool) -> Iterator[None]:
    """The one-statement enqueue, counted into ``run.pending``, or turned off."""
    original = enqueue_statement.enqueue_in_one_statement

    def counting(*args: Any) -> Any:
        pending = original(*args)
        if pending is not None:
            run.pending.append(pending)
        return pending

    with patch.object(enqueue_statement, "enqueue_in_one_statement", counting if on else lambda *_: None):
        yield


def both_ways(
    server: PostgresServer, scenario: Callable[[Run], Any], *, server_clock: bool = False
) -> list[tuple[Any, int, dict[str, Any]]]:
    """``scenario`` with the one-statement enqueue, then without: each run's result, how many
    enqueues the statement wrote, and its tables."""
    runs = []
    for on in (True, False):
        schema = unique_name("t_enqueue")
        seen: Recorded = []
        engine = create_engine(server.url, connect_args={"cursor_factory": recording_cursor(seen)})
        clock = None if server_clock else Clock()
        store = open_store(engine, schema=schema, clock=clock)
        try:
            store.create_job(id=JOB, kind="agenda", authority=AUTHORITY, payload={"n": 1})
            run = Run(store, schema, clock, seen)
            with statement(run, on):
                result = scenario(run)
            runs.append((result, run.written(), densely_numbered(dump_tables(store))))
        finally:
            store.close()
            engine.dispose()
            server.drop_schema(schema)
    return runs


def test_new_identities_are_enqueued_in_one_statement(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        assert run.clock is not None
        results = []
        for index, extra in enumerate(
            [{}, {"payload": {"b": [1, "ü"], "a": None}}, {"payload": None}, {"available_at": T0 + 50}, {}]
        ):
            results.append(enqueue(run.store, trigger_key=f"t{index}", **extra))
            run.clock.now += 3
        return results

    (done, written, tables), (done_without, written_without, tables_without) = both_ways(
        postgres_server, scenario
    )
    assert done == done_without and tables == tables_without
    # The first enqueue of the job reads its texts to verify them (and runs the usual way).
    assert written == 4 and written_without == 0
    assert [occurrence.deduplicated for occurrence in done] == [False] * 5
    assert [occurrence.payload for occurrence in done[:3]] == [{"n": 1}, {"a": None, "b": [1, "ü"]}, None]
    assert done[3].available_at == T0 + 50 and done[1].created_at == T0 + 3
    events = [(row["occurrence_id"], row["occurred_at"], row["data_json"]) for row in tables["events"][1:]]
    assert events[1] == (
        done[1].id,
        T0 + 3,
        '{"jobRevision":1,"scheduledFor":1800000000000,"triggerKey":"t1"}',
    )


def test_an_identity_already_stored_is_returned_as_before(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        first = enqueue(run.store)
        second = enqueue(run.store, trigger_key="other")  # one statement from here on
        return [
            first,
            second,
            enqueue(run.store),  # the same call again
            enqueue(run.store, payload={"n": 1}),  # the job's payload, given
            enqueue(run.store, payload={"n": 2}),  # another payload: refused
            enqueue(run.store, scheduled_for=T0 + 1),  # the same trigger key at another time
            enqueue(run.store, trigger_key="other", available_at=T0 + 9),  # available_at is no part of it
        ]

    (done, written, tables), (done_without, _, tables_without) = both_ways(postgres_server, scenario)
    assert done == done_without and tables == tables_without
    assert written == 2
    first, second, again, given, refused, later, other = done
    assert again == dataclasses.replace(first, deduplicated=True) and given == again
    assert refused == ("SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH", {"jobId": JOB, "triggerKey": "t"})
    assert later.deduplicated is False and later.id != first.id
    assert other == dataclasses.replace(second, deduplicated=True)
    assert len(tables["occurrences"]) == 3 and len(tables["events"]) == 1 + 3


def test_missing_and_disabled_jobs_and_bad_payloads_fail_as_before(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        results = [enqueue(run.store, trigger_key="warm"), enqueue(run.store, job_id="nowhere")]
        job = run.store.get_job(JOB)
        assert job is not None
        run.store.update_job(JOB, job.revision, enabled=False)
        results += [
            enqueue(run.store, trigger_key="off"),
            enqueue(run.store, trigger_key="off", payload=float("nan")),  # the job is reported first
        ]
        run.store.update_job(JOB, job.revision + 1, enabled=True)
        results += [
            enqueue(run.store, trigger_key="bad", payload=float("nan")),
            enqueue(run.store, trigger_key="bad", payload={"x": 1}),  # revision 3's identity
            enqueue(run.store, job_id="nowhere", payload=float("nan")),
        ]
        return results

    (done, written, tables), (done_without, _, tables_without) = both_ways(postgres_server, scenario)
    assert done == done_without and tables == tables_without
    assert written == 1  # the same texts after update_job: still verified
    codes = [result[0] if isinstance(result, tuple) else result.job_revision for result in done]
    assert codes == [
        1,
        "SCHEDULER_NOT_FOUND",
        "SCHEDULER_JOB_DISABLED",
        "SCHEDULER_JOB_DISABLED",
        "SCHEDULER_INVALID_ARGUMENT",
        3,
        "SCHEDULER_NOT_FOUND",
    ]


def test_a_job_whose_texts_changed_is_verified_again(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        results = [enqueue(run.store, trigger_key=f"a{index}") for index in range(2)]
        job = run.store.get_job(JOB)
        assert job is not None
        run.store.update_job(JOB, job.revision, payload={"n": 2}, max_attempts=5)
        results += [enqueue(run.store, trigger_key=f"b{index}") for index in range(2)]
        return results

    (done, written, tables), (done_without, _, tables_without) = both_ways(postgres_server, scenario)
    assert done == done_without and tables == tables_without
    assert written == 2  # a1 and b1: a0 and b0 verified the job's texts first
    assert [(o.job_revision, o.payload, o.max_attempts) for o in done] == [(1, {"n": 1}, 3)] * 2 + [
        (2, {"n": 2}, 5)
    ] * 2


@pytest.mark.parametrize(
    ("column", "stored", "expected"),
    [
        ("payload_json", '{"n": 1, "a": [1.0]}', '{"a":[1],"n":1}'),  # not canonical: re-encoded
        ("authority_json", '{"principal": 1}', "SCHEDULER_DATA_CORRUPT"),  # not an envelope
        ("trigger_json", '{"every": "1h"}', None),  # any JSON: not re-encoded, not written
    ],
)
def test_job_texts_the_statement_does_not_take_are_read_as_before(
    postgres_server: PostgresServer, column: str, stored: str, expected: str | None
) -> None:
    def scenario(run: Run) -> Any:
        results = [enqueue(run.store, trigger_key="before")]
        run.execute(f"UPDATE {{schema}}.jobs SET {column} = '{stored}'")
        results += [enqueue(run.store, trigger_key=f"after{index}") for index in range(3)]
        return results

    (done, written, tables), (done_without, _, tables_without) = both_ways(postgres_server, scenario)
    assert done == done_without and tables == tables_without
    if expected == "SCHEDULER_DATA_CORRUPT":
        assert [result[0] for result in done[1:]] == [expected] * 3 and written == 0
    elif expected is None:
        assert written == 2  # valid JSON: the new texts are verified once
    else:
        assert written == 0  # never taken as stored: the usual way writes them re-encoded
        after = [row["payload_json"] for row in tables["occurrences"] if row["trigger_key"] != "before"]
        assert after == [expected] * 3


def _timeless(value: Any) -> Any:
    """Tables or results with the server clock's readings left out (checked on their own)."""
    if isinstance(value, dict):
        return {key: None if key in SERVER_TIMES else _timeless(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_timeless(item) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, created_at=0, updated_at=0)
    return value


def test_with_the_server_clock_the_statement_reads_it_once(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        before = int(time.time() * 1000)
        results = [enqueue(run.store, trigger_key=f"t{index}") for index in range(4)]
        return results, before, int(time.time() * 1000)

    runs = both_ways(postgres_server, scenario, server_clock=True)
    ((done, before, after), written, tables), ((done_without, _, _), _, tables_without) = runs
    assert _timeless(done) == _timeless(done_without) and _timeless(tables) == _timeless(tables_without)
    assert written == 3
    by_id = {row["occurrence_id"]: row["occurred_at"] for row in tables["events"][1:]}
    for occurrence in done:
        # one reading: the row's and its event's times; the server's clock, near this process's
        assert occurrence.created_at == occurrence.updated_at == by_id[occurrence.id]
        assert before - 5_000 <= occurrence.created_at <= after + 5_000
    assert [o.created_at for o in done] == sorted(o.created_at for o in done)


def test_concurrent_enqueues_of_one_identity_write_one_row(postgres_server: PostgresServer) -> None:
    """Two stores (two connections) enqueue the same identity while a third transaction holds its
    lock: both wait in the lead statement; the first to get it writes the row, the other's
    statement then sees it (its snapshot is taken after the lock), misses, and returns it."""

    def scenario(run: Run) -> Any:
        enqueue(run.store, trigger_key="warm")  # the job's texts verified (both stores: one process)
        other = open_store(run.store.connection.engine, schema=run.schema, clock=run.clock)
        results: list[Any] = []
        try:
            enqueue(other, trigger_key="warm-other")
            space = key_space(run.schema, "enqueue")
            with postgres_server.engine.connect() as holder, holder.begin():
                holder.exec_driver_sql(
                    "SELECT pg_advisory_xact_lock(%(space)s, hashtext(%(key)s))",
                    {"space": space, "key": f"{JOB}\x1f{T0}\x1fraced"},
                )
                threads = [
                    threading.Thread(target=lambda s=store: results.append(enqueue(s, trigger_key="raced")))
                    for store in (run.store, other)
                ]
                for thread in threads:
                    thread.start()
                _wait_for_waiters(postgres_server, 2)
            for thread in threads:
                thread.join(10)
        finally:
            other.close()
        return sorted(results, key=lambda occurrence: occurrence.deduplicated)

    (done, written, tables), (done_without, _, tables_without) = both_ways(postgres_server, scenario)
    assert done == done_without and tables == tables_without
    fresh, found = done
    assert (fresh.deduplicated, found.deduplicated) == (False, True) and found.id == fresh.id
    assert written == 2  # warm-other and the race's winner (warm verified the job's texts)
    raced = [row for row in tables["occurrences"] if row["trigger_key"] == "raced"]
    assert len(raced) == 1
    assert [row["occurrence_id"] for row in tables["events"]].count(fresh.id) == 1


def _wait_for_waiters(server: PostgresServer, count: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with server.engine.connect() as connection:
            waiting = connection.exec_driver_sql(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).scalar()
        if waiting == count:
            return
        time.sleep(0.02)
    raise AssertionError("the enqueues did not wait for the identity's lock")


def test_a_new_identity_is_one_round_trip(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        sent = []
        for index in range(5):
            before = len(run.seen)
            enqueue(run.store, trigger_key=f"t{index}")
            sent.append(run.seen[before:])
        return sent

    (sent, written, _), (sent_without, _, _) = both_ways(postgres_server, scenario)
    assert written == 4
    # Named after their first run: BEGIN, the lock, the statement and COMMIT as one query.
    assert [len(queries) for queries in sent[2:]] == [1, 1, 1]
    query = sent[-1][0][0]
    assert query.startswith("BEGIN ISOLATION LEVEL READ COMMITTED; EXECUTE ") and query.endswith("; COMMIT")
    assert query.count("EXECUTE ") == 2
    # The usual way: BEGIN, lock, job, INSERT, event, NOTIFY (the injected clock is read in
    # Python, the COMMIT is the driver's).
    assert [len(queries) for queries in sent_without[2:]] == [6, 6, 6]


def test_the_statement_is_not_used_where_events_are_logged_or_statements_observed(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    def scenario(run: Run) -> Any:
        results = [enqueue(run.store, trigger_key="warm")]
        with caplog.at_level("INFO", logger="scheduler.events"):
            results.append(enqueue(run.store, trigger_key="logged"))
        results.append(enqueue(run.store, trigger_key="plain"))
        observed: list[str] = []
        event.listen(run.store.connection, "before_cursor_execute", lambda *args: observed.append(args[2]))
        results.append(enqueue(run.store, trigger_key="observed"))
        return results, bool(observed)

    (done, written, tables), (done_without, _, tables_without) = both_ways(postgres_server, scenario)
    assert done == done_without and tables == tables_without
    assert written == 1 and done[1] is True  # only "plain"
    assert any(record.getMessage().startswith("enqueued") for record in caplog.records)


def test_idle_workers_are_woken_as_before(postgres_server: PostgresServer) -> None:
    """One notification on the wake channel per enqueue that wrote a row, none for an identity
    already stored or a refused enqueue, delivered at the COMMIT."""

    def scenario(run: Run) -> Any:
        assert run.store.wake_channel == wake_channel(run.schema)
        listener = Listener(postgres_server, run.store.wake_channel)
        try:
            counts = []
            for trigger_key in ("t0", "t1", "t2", "t1", "t3"):
                enqueue(run.store, trigger_key=trigger_key)
                counts.append(listener.received())
            enqueue(run.store, trigger_key="t4", payload={"n": 2})
            enqueue(run.store, trigger_key="t4", payload={"n": 3})  # refused
            enqueue(run.store, job_id="nowhere")
            counts.append(listener.received())
            return counts
        finally:
            listener.close()

    (counts, written, tables), (counts_without, _, tables_without) = both_ways(postgres_server, scenario)
    assert counts == counts_without == [1, 1, 1, 0, 1, 1] and tables == tables_without
    assert written == 4
