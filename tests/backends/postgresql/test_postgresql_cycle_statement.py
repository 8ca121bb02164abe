"""A quiet ``settle_and_claim`` that succeeds runs as one statement (``store/cycle_statement.py``).

Each scenario runs twice, in two fresh schemas: with the one-statement cycle, and the way the store
ran it before (``cycle_statement.cycle_in_one_statement`` turned off: the cycle's first statement, Python's
decisions, the writes statement). Results, errors and tables (event ids densely renumbered) must be
equal. The cases the statement does not decide itself (a lost lease, a control on the settled row,
an expired lease ahead in the queue, a head another transaction holds or that is not plain, an
unrepresentable lease expiry) fail its check and run again the usual way: they too must end as
they did before.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any
from unittest.mock import patch

import pytest
from backends import PostgresServer, unique_name
from claim_seed import as_among_workers
from cycle_support import densely_numbered, one_statement_off, slowed_statement
from sqlalchemy import Connection, create_engine
from test_fastpath_postgresql import Recorded, recording_cursor
from test_postgresql_claims import LEASE, enqueue, held

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.backends.postgresql import cycle_statement, queries
from scheduler.contract.constants import MAX_SAFE_INTEGER
from scheduler.store.plumbing.session import OwnedRunner
from scheduler.testing import dump_tables

pytestmark = pytest.mark.postgresql
T0 = 1_800_000_000_000
CAPABILITY = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint"]}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class Run:
    """One run of a scenario: the store (injected clock), its schema and clock, the due
    occurrences (the first one claimed by ``w``), the statements sent so far, and how many cycles
    were left whole to one statement."""

    def __init__(
        self, store: SchedulerStore, schema: str, clock: Clock, made: list[str], seen: Recorded
    ) -> None:
        self.store, self.schema, self.clock, self.made, self._seen = store, schema, clock, made, seen
        self.pending: list[Any] = []
        self.one_statement = True
        """Whether this run may leave cycles to one statement (``both_ways``' first run)."""

    def sent(self) -> int:
        return len(self._seen)


def cycle(store: SchedulerStore, held_id: str, fence: int, **settle: Any) -> Any:
    """``settle_and_claim`` as ``w`` (a success unless ``settle`` says otherwise): its result as
    plain values, or the error's code."""
    arguments: dict[str, Any] = {"outcome": "succeeded", **settle}
    try:
        done = store.settle_and_claim(
            occurrence_id=held_id, owner_id="w", fence=fence, lease_ms=LEASE, **arguments
        )
    except SchedulerKernelError as error:
        return error.code
    return done.settled, done.claimed


@contextmanager
def counted_cycles(run: Run) -> Iterator[None]:
    original = cycle_statement.cycle_in_one_statement

    def counting(*args: Any) -> Any:
        pending = original(*args)
        if pending is not None:
            run.pending.append(pending)
        return pending

    with patch.object(cycle_statement, "cycle_in_one_statement", counting):
        yield


def both_ways(
    server: PostgresServer,
    count: int,
    scenario: Callable[[Run], Any],
    *,
    max_attempts: int = 3,
    contended: bool = False,
) -> list[tuple[Any, int, dict[str, Any]]]:
    """``scenario`` on ``count`` due occurrences, the first claimed by ``w``: with the one-statement
    cycle, then without; each run's result, its count of one-statement cycles (tried), and its
    tables. ``contended``: the store's claims stay on the path among workers (the window)."""
    runs = []
    for one_statement in (True, False):
        schema = unique_name("t_cycle")
        seen: Recorded = []
        engine = create_engine(server.url, connect_args={"cursor_factory": recording_cursor(seen)})
        clock = Clock()
        store = open_store(engine, schema=schema, clock=clock)
        try:
            made = enqueue(store, count, max_attempts=max_attempts)
            first = store.claim_next(owner_id="w", lease_ms=LEASE)
            assert first is not None and first.id == made[0]
            if contended:
                as_among_workers(store)
            run = Run(store, schema, clock, made, seen)
            run.one_statement = one_statement
            with counted_cycles(run) if one_statement else one_statement_off():
                result = scenario(run)
            runs.append((result, len(run.pending), densely_numbered(dump_tables(store))))
        finally:
            store.close()
            engine.dispose()
            server.drop_schema(schema)
    return runs


def test_a_quiet_queue_drains_in_one_statement_a_cycle(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        results, sent = [], []
        for index in range(len(run.made)):
            before = run.sent()
            results.append(cycle(run.store, run.made[index], 1))
            sent.append(run.sent() - before)
            run.clock.now += 7
        return results, sent, run.made

    (with_statement, cycles, tables), (without, none, tables_without) = both_ways(
        postgres_server, 6, scenario
    )
    results, sent, made = with_statement
    without_made = without[2]
    assert results == without[0] and tables == tables_without
    assert cycles == 6 and none == 0
    claimed_ids = [None if claimed is None else claimed.id for _settled, claimed in results]
    assert claimed_ids == [*made[1:], None] and made == without_made
    # Named after their first run: then BEGIN, the cycle and COMMIT go out as one query.
    assert sent[3:] == [1, 1, 1] and without[1][3:] == [2, 2, 2]
    settled, claimed = results[1]
    assert settled.status == "succeeded" and settled.updated_at == settled.settled_at == T0 + 7
    assert claimed.fence == 1 and claimed.attempt == 1 and claimed.lease_expires_at == T0 + 7 + LEASE
    events = [
        (row["event_type"], row["data_json"]) for row in tables["events"] if row["occurred_at"] == T0 + 7
    ]
    assert events == [
        ("occurrence_succeeded", '{"attempt":1,"maxAttempts":3}'),
        ("occurrence_claimed", '{"attempt":1,"previousOwner":null,"previousStatus":"queued"}'),
    ]


def test_the_result_is_written_as_its_canonical_json(postgres_server: PostgresServer) -> None:
    result = {"b": [1, "ü", None], "a": {"z": 1.5, "y": "\u2028"}}

    def scenario(run: Run) -> Any:
        return cycle(run.store, run.made[0], 1, result=result)

    (done, cycles, tables), (done_without, _, tables_without) = both_ways(postgres_server, 2, scenario)
    assert cycles == 1 and done == done_without and tables == tables_without
    assert done[0].result == result
    stored = next(row for row in tables["occurrences"] if row["status"] == "succeeded")["result_json"]
    assert json.loads(stored) == result


@pytest.mark.parametrize(
    ("name", "settle"),
    [
        ("lease lost: another fence", {"fence": 2}),
        ("lease lost: another owner", {"owner": "v"}),
        ("lease lost: expired", {"advance": LEASE}),
        ("a failure", {"outcome": "failed", "retryable": False}),
        ("a retry", {"outcome": "failed"}),
    ],
)
def test_what_the_statement_does_not_decide_ends_as_before(
    postgres_server: PostgresServer, name: str, settle: dict[str, Any]
) -> None:
    def scenario(run: Run) -> Any:
        run.clock.now += settle.get("advance", 0)
        arguments = {key: value for key, value in settle.items() if key in ("outcome", "retryable")}
        if "owner" in settle:
            try:
                run.store.settle_and_claim(
                    occurrence_id=run.made[0],
                    owner_id=settle["owner"],
                    fence=1,
                    lease_ms=LEASE,
                    outcome="succeeded",
                )
            except SchedulerKernelError as error:
                return error.code
        return cycle(run.store, run.made[0], settle.get("fence", 1), **arguments)

    (done, _cycles, tables), (done_without, _, tables_without) = both_ways(postgres_server, 3, scenario)
    assert done == done_without and tables == tables_without, name
    if name.startswith("lease lost"):
        assert done == "SCHEDULER_LEASE_LOST"


def test_a_pause_requested_on_the_settled_row_is_terminalized_as_before(
    postgres_server: PostgresServer,
) -> None:
    def scenario(run: Run) -> Any:
        run.store.request_occurrence_pause(
            occurrence_id=run.made[0], expected_fence=1, request_id="pause-1", capability=CAPABILITY
        )
        return cycle(run.store, run.made[0], 1), run.store.get_occurrence_control(run.made[0])

    (done, cycles, tables), (done_without, _, tables_without) = both_ways(postgres_server, 3, scenario)
    assert done == done_without and tables == tables_without
    assert cycles == 1  # tried, its check failed, and the call ran again the usual way
    assert done[1].state == "terminal"


def test_an_expired_lease_ahead_in_the_queue_is_reclaimed_as_before(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        other = run.store.claim_next(owner_id="v", lease_ms=1)
        run.store.claim_next(owner_id="u", lease_ms=LEASE)  # nothing else is queued
        run.clock.now += 10  # v's lease expired: the claim reclaims its occurrence
        return other, cycle(run.store, run.made[0], 1)

    (done, _cycles, tables), (done_without, _, tables_without) = both_ways(postgres_server, 3, scenario)
    assert done == done_without and tables == tables_without
    other, (_settled, claimed) = done
    assert claimed is not None and claimed.id == other.id and claimed.fence == 2


def test_a_final_attempt_expired_ahead_is_swept_as_before(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        other = run.store.claim_next(owner_id="v", lease_ms=1)
        run.clock.now += 10
        return other, cycle(run.store, run.made[0], 1)

    (done, _cycles, tables), (done_without, _, tables_without) = both_ways(
        postgres_server, 4, scenario, max_attempts=1
    )
    assert done == done_without and tables == tables_without
    statuses = {row["occurrence_id"]: row["status"] for row in tables["occurrences"]}
    assert statuses[done[0].id] == "dead_letter"


def test_a_due_retry_at_the_head_is_claimed_in_the_statement(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        # made[0] fails with a retry due later than the others: made[1] is claimed, then the
        # retry comes due ahead of made[2] and is the head.
        first = cycle(run.store, run.made[0], 1, outcome="failed", retry_at=T0 + 5)
        run.clock.now = T0 + 5
        second = cycle(run.store, run.made[1], 1)
        return first, second

    (done, cycles, tables), (done_without, _, tables_without) = both_ways(postgres_server, 4, scenario)
    assert done == done_without and tables == tables_without
    assert cycles == 1
    claimed = done[1][1]
    assert claimed.id in {row["occurrence_id"] for row in tables["occurrences"]}
    event = tables["events"][-1]
    assert event["event_type"] == "occurrence_claimed" and event["occurrence_id"] == claimed.id


def test_a_head_another_transaction_holds_is_passed_over_as_before(postgres_server: PostgresServer) -> None:
    """The statement's check fails (it locked no head): the call runs again in a transaction the
    store still owns (no savepoints), the usual way, which passes over the held head."""

    def scenario(run: Run) -> Any:
        attempts: list[tuple[bool, bool]] = []
        real_attempt = OwnedRunner._attempt

        def attempt(self: Any, operation: Any, begin: str, sample_clock: bool, **kwargs: Any) -> Any:
            attempts.append((kwargs["call"].may_run_again, kwargs["call"].as_one_statement))
            return real_attempt(self, operation, begin, sample_clock, **kwargs)

        with (
            held(postgres_server.engine, run.schema, run.made[1:2]),
            patch.object(OwnedRunner, "_attempt", attempt),
        ):
            return run.made, cycle(run.store, run.made[0], 1), attempts

    (done, cycles, tables), (done_without, _, tables_without) = both_ways(postgres_server, 4, scenario)
    assert done[:2] == done_without[:2] and tables == tables_without
    made, (_settled, claimed), attempts = done
    assert claimed is not None and claimed.id == made[2]
    assert cycles == 1 and attempts == [(True, True), (True, False)] and done_without[2] == [(True, True)]


def test_a_requeued_dead_letter_at_the_head_is_claimed_as_before(postgres_server: PostgresServer) -> None:
    """The head is a dead letter requeued (its pending requeue request makes it not plain: its
    claim keeps the attempt and consumes the request). The statement, which reads only whether a
    request is pending, must not claim it as a plain row: it misses, and the call claims it the
    usual way, consuming the request."""
    error = {"code": "E_BROKEN", "message": "broken"}

    def scenario(run: Run) -> Any:
        other = run.store.claim_next(owner_id="v", lease_ms=LEASE)
        assert other is not None and other.id == run.made[1]
        run.store.settle(
            occurrence_id=other.id, owner_id="v", fence=1, outcome="failed", retryable=False, error=error
        )
        run.store.requeue_dead_letter(
            occurrence_id=other.id, expected_fence=1, expected_error_code=error["code"], request_id="rq-1"
        )
        return run.made, cycle(run.store, run.made[0], 1)

    # Two occurrences: once made[0] is settled, the requeued made[1] is the only due row, the head.
    (done, cycles, tables), (done_without, _, tables_without) = both_ways(postgres_server, 2, scenario)
    assert done == done_without and tables == tables_without
    made, (_settled, claimed) = done
    assert claimed is not None and claimed.id == made[1] and claimed.attempt == 1 and claimed.fence == 2
    assert cycles == 1
    (request,) = tables["scheduler_occurrence_retries"]
    assert request["request_id"] == "rq-1" and request["claimed_at"] is not None


def test_a_disabled_job_leaves_its_head_unclaimed_as_before(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        job = run.store.get_job("job-1")
        assert job is not None
        run.store.update_job("job-1", job.revision, enabled=False)
        return cycle(run.store, run.made[0], 1)

    (done, _cycles, tables), (done_without, _, tables_without) = both_ways(postgres_server, 3, scenario)
    assert done == done_without and tables == tables_without
    assert done[1] is None


def test_an_unrepresentable_lease_expiry_is_refused_as_before(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        run.clock.now = MAX_SAFE_INTEGER - LEASE + 1
        return cycle(run.store, run.made[0], 1)

    (done, _cycles, tables), (done_without, _, tables_without) = both_ways(postgres_server, 2, scenario)
    assert done == done_without == "SCHEDULER_INVALID_ARGUMENT" and tables == tables_without


def test_with_the_server_clock_one_reading_serves_the_whole_cycle(postgres_server: PostgresServer) -> None:
    schema = unique_name("t_cycle_clock")
    seen: Recorded = []
    engine = create_engine(postgres_server.url, connect_args={"cursor_factory": recording_cursor(seen)})
    store = open_store(engine, schema=schema)
    try:
        made = enqueue(store, 4)
        held_now = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert held_now is not None
        sent = []
        for _ in range(3):
            before = len(seen)
            done = store.settle_and_claim(
                occurrence_id=held_now.id,
                owner_id="w",
                fence=held_now.fence,
                outcome="succeeded",
                lease_ms=LEASE,
            )
            sent.append(len(seen) - before)
            held_now = done.claimed
            assert held_now is not None
            assert done.settled.settled_at == done.settled.updated_at == held_now.updated_at
            assert held_now.lease_expires_at == held_now.updated_at + LEASE
        assert sent[-1] == 1
        tables = dump_tables(store)
        cycles = [row for row in tables["events"] if row["event_type"] == "occurrence_succeeded"]
        assert len(cycles) == 3
        by_time = {row["occurrence_id"]: row["occurred_at"] for row in cycles}
        settled = {
            row["occurrence_id"]: row["settled_at"] for row in tables["occurrences"] if row["settled_at"]
        }
        assert by_time == settled and set(settled) == set(made[:3])
    finally:
        store.close()
        engine.dispose()
        postgres_server.drop_schema(schema)


def test_the_statement_is_not_used_where_events_are_logged(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    def scenario(run: Run) -> Any:
        with caplog.at_level("INFO", logger="scheduler.events"), nullcontext():
            return cycle(run.store, run.made[0], 1)

    (done, cycles, tables), (done_without, _, tables_without) = both_ways(postgres_server, 2, scenario)
    assert done == done_without and tables == tables_without and cycles == 0


def wait_event(connection: Connection, pid: int) -> str | None:
    """``pid``'s wait event now (each read in a transaction of its own: ``pg_stat_activity`` is
    read once per transaction)."""
    try:
        event = connection.exec_driver_sql(
            "SELECT wait_event FROM pg_stat_activity WHERE pid = %(pid)s", {"pid": pid}
        ).scalar()
        return None if event is None else str(event)
    finally:
        connection.rollback()


@pytest.mark.parametrize("lead", [True, False])
def test_a_pause_request_committed_after_the_statement_began_is_never_left_on_a_settled_row(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch, lead: bool
) -> None:
    """The statement's snapshot is taken when it starts; a pause request (whose writer locks the
    occurrence row, then writes its control row) committed after that and before the statement
    locks the settled row would be invisible to it. So the settled row is locked first, by a
    statement of its own in the same round trip (``PendingCycle.lead``): the pause request then
    waits for the cycle and fails on a settled occurrence (serial order: settle, then pause).
    The statement is slowed here (2 s after its snapshot, before its first lock) and the pause
    request sent meanwhile; with the lead turned off, the statement's check would have to catch
    it, and does not (``lead=False`` documents the race: its outcome is the one asserted)."""
    slowed = slowed_statement("cycle")

    monkeypatch.setattr(queries, "CYCLE", slowed)
    if not lead:
        monkeypatch.setattr(cycle_statement.PendingCycle, "lead", property(lambda _self: None))
    schema = unique_name("t_cycle_pause")
    store = open_store(postgres_server.engine, schema=schema, clock=lambda: T0)
    pauser = open_store(postgres_server.engine, schema=schema, clock=lambda: T0)
    try:
        made = enqueue(store, 2)
        held_now = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert held_now is not None and held_now.id == made[0]
        pid = store.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        store.connection.rollback()
        results: list[Any] = []
        with postgres_server.engine.connect() as watcher:  # connected before: polled at once
            thread = threading.Thread(target=lambda: results.append(cycle(store, made[0], 1)))
            thread.start()
            while wait_event(watcher, pid) != "PgSleep":
                assert thread.is_alive(), results
        try:
            pauser.request_occurrence_pause(
                occurrence_id=made[0], expected_fence=1, request_id="pause-1", capability=CAPABILITY
            )
            paused = "requested"
        except SchedulerKernelError as error:
            paused = error.code
        thread.join(30)
        settled, claimed = results[0]
        control = store.get_occurrence_control(made[0])
        state = None if control is None else control.state
        if lead:  # the pause waited for the cycle, then found the occurrence settled
            assert (paused, state, settled.status) == ("SCHEDULER_OCCURRENCE_NOT_RUNNING", None, "succeeded")
            assert claimed is not None and claimed.id == made[1]
        else:  # the race the lead closes: a pause request left on a settled occurrence
            assert (paused, state, settled.status) == ("requested", "pause_requested", "succeeded")
    finally:
        pauser.close()
        store.close()
        postgres_server.drop_schema(schema)
