"""A quiet ``claim_next`` and a successful ``settle`` each run as one statement
(``claim_statement``, ``settle_statement``).

Each scenario runs twice, in two fresh schemas: with the statements, and the usual way (both turned
off: ``cycle_support.claim_and_settle_statements_off``). Results, errors and tables (event ids
densely renumbered) must be equal. The cases the statements do not decide themselves (an expired
lease ahead, a head another transaction holds or that is not plain, a lost lease, a control on
the settled row, an unrepresentable lease expiry) fail their check and run again the usual way;
failures and retries are never tried as one statement.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import pytest
from backends import PostgresServer, unique_name
from claim_seed import as_among_workers
from cycle_support import claim_and_settle_statements_off, densely_numbered
from sqlalchemy import Connection, create_engine
from test_fastpath_postgresql import Recorded, recording_cursor
from test_postgresql_claims import LEASE, enqueue, held

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.backends.postgresql import claim_statement, queries, settle_statement
from scheduler.contract.constants import MAX_SAFE_INTEGER
from scheduler.store.plumbing.session import OwnedRunner
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.testing import dump_tables

pytestmark = pytest.mark.postgresql
T0 = 1_800_000_000_000
CAPABILITY = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint"]}
ERROR = {"code": "E_BROKEN", "message": "broken"}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class Run:
    """One run of a scenario: the store (injected clock), its schema, the due occurrences, the
    statements sent so far, and the calls left to one statement (tried)."""

    def __init__(
        self, store: SchedulerStore, schema: str, clock: Clock, made: list[str], seen: Recorded
    ) -> None:
        self.store, self.schema, self.clock, self.made, self._seen = store, schema, clock, made, seen
        self.tried: list[str] = []

    def sent(self) -> int:
        return len(self._seen)


@contextmanager
def counted(run: Run) -> Iterator[None]:
    """Note each call left to one statement (``claim`` or ``settle``) in ``run.tried``."""
    real_claim, real_settle = claim_statement.claim_in_one_statement, settle_statement.settle_in_one_statement

    def claim(*args: Any) -> Any:
        pending = real_claim(*args)
        if pending is not None:
            run.tried.append("claim")
        return pending

    def settle(*args: Any) -> Any:
        pending = real_settle(*args)
        if pending is not None:
            run.tried.append("settle")
        return pending

    with (
        patch.object(claim_statement, "claim_in_one_statement", claim),
        patch.object(settle_statement, "settle_in_one_statement", settle),
    ):
        yield


def both_ways(
    server: PostgresServer,
    count: int,
    scenario: Callable[[Run], Any],
    *,
    max_attempts: int = 3,
    contended: bool = False,
) -> list[tuple[Any, list[str], dict[str, Any]]]:
    """``scenario`` on ``count`` due occurrences: with the statements, then without; each run's
    result, the calls it left to one statement, and its tables. ``contended``: the store's claims
    stay on the path among workers (the window)."""
    runs = []
    for one_statement in (True, False):
        schema = unique_name("t_single")
        seen: Recorded = []
        engine = create_engine(server.url, connect_args={"cursor_factory": recording_cursor(seen)})
        clock = Clock()
        store = open_store(engine, schema=schema, clock=clock)
        try:
            made = enqueue(store, count, max_attempts=max_attempts)
            if contended:
                as_among_workers(store)
            run = Run(store, schema, clock, made, seen)
            with counted(run) if one_statement else claim_and_settle_statements_off():
                result = scenario(run)
            runs.append((result, run.tried, densely_numbered(dump_tables(store))))
        finally:
            store.close()
            engine.dispose()
            server.drop_schema(schema)
    return runs


def claim(store: SchedulerStore, owner: str = "w", lease_ms: int = LEASE) -> Any:
    """``claim_next``'s result, or the error's code."""
    try:
        return store.claim_next(owner_id=owner, lease_ms=lease_ms)
    except SchedulerKernelError as error:
        return error.code


def settle(
    store: SchedulerStore, occurrence_id: str, fence: int = 1, owner: str = "w", **outcome: Any
) -> Any:
    """``settle``'s result (a success unless ``outcome`` says otherwise), or the error's code."""
    arguments: dict[str, Any] = {"outcome": "succeeded", **outcome}
    try:
        return store.settle(occurrence_id=occurrence_id, owner_id=owner, fence=fence, **arguments)
    except SchedulerKernelError as error:
        return error.code


def assert_same(runs: list[tuple[Any, list[str], dict[str, Any]]]) -> tuple[Any, list[str], dict[str, Any]]:
    (done, tried, tables), (done_without, tried_without, tables_without) = runs
    assert done == done_without and tables == tables_without
    assert tried_without == []
    return done, tried, tables


@pytest.mark.parametrize("contended", [False, True], ids=["quiet", "among-workers"])
def test_a_queue_drains_in_one_statement_per_call(postgres_server: PostgresServer, contended: bool) -> None:
    def scenario(run: Run) -> Any:
        results, sent = [], []
        for _ in range(len(run.made)):
            before = run.sent()
            held_now = claim(run.store)
            middle = run.sent()
            settled = settle(run.store, held_now.id, held_now.fence, result={"n": len(results)})
            sent.append((middle - before, run.sent() - middle))
            results.append((held_now, settled))
            run.clock.now += 7
        before = run.sent()
        results.append(claim(run.store))  # nothing is due
        sent.append((run.sent() - before, 0))
        return results, sent, run.made

    ((results, sent, made), tried, tables), (without, _, tables_without) = both_ways(
        postgres_server, 6, scenario, contended=contended
    )
    without_results, without_sent, without_made = without
    assert (results, made) == (without_results, without_made) and tables == tables_without
    assert tried == ["claim", "settle"] * 6 + ["claim"]
    # Named after their first run: then BEGIN, the statement (after the settle's lead) and COMMIT
    # go out as one query; the usual way, a claim (with the injected clock: no clock read; among
    # workers, three) and a settle are two each (and a PREPARE for each new window length).
    assert sent[3:] == [(1, 1)] * 3 + [(1, 0)]
    assert all(claimed >= 2 and settled >= 2 for claimed, settled in without_sent[3:6])
    assert results[-1] is None
    claimed = [held_now.id for held_now, _settled in results[:-1]]
    assert claimed == made  # the seed's order
    held_now, settled = results[1]
    assert (held_now.status, held_now.attempt, held_now.fence) == ("running", 1, 1)
    assert held_now.updated_at == T0 + 7 and held_now.lease_expires_at == T0 + 7 + LEASE
    assert (settled.status, settled.result, settled.settled_at) == ("succeeded", {"n": 1}, T0 + 7)
    events = [
        (row["event_type"], row["data_json"]) for row in tables["events"] if row["occurred_at"] == T0 + 7
    ]
    assert events == [
        ("occurrence_claimed", '{"attempt":1,"previousOwner":null,"previousStatus":"queued"}'),
        ("occurrence_succeeded", '{"attempt":1,"maxAttempts":3}'),
    ]


@pytest.mark.parametrize(
    ("contended", "holding", "missed"),
    [(False, 1, True), (True, 1, False), (True, 8, True)],
    ids=["quiet", "among-workers", "among-workers-window-held"],
)
def test_held_heads_are_passed_over_as_before(
    postgres_server: PostgresServer, contended: bool, holding: int, missed: bool
) -> None:
    """Quiet, the statement locks no head when another transaction holds it: its check fails and
    the call runs again in a transaction the store still owns, the usual way, which passes over
    the held head. Among workers the window statement passes over it itself, unless every row of
    the window is held (then the usual way reads the full list)."""

    def scenario(run: Run) -> Any:
        attempts: list[tuple[bool, bool]] = []
        real_attempt = OwnedRunner._attempt

        def attempt(self: Any, operation: Any, begin: str, sample_clock: bool, **kwargs: Any) -> Any:
            attempts.append((kwargs["call"].may_run_again, kwargs["call"].as_one_statement))
            return real_attempt(self, operation, begin, sample_clock, **kwargs)

        with (
            held(postgres_server.engine, run.schema, run.made[:holding]),
            patch.object(OwnedRunner, "_attempt", attempt),
        ):
            return claim(run.store), run.made, attempts

    runs = both_ways(postgres_server, holding + 2, scenario, contended=contended)
    (claimed, made, attempts), tried, tables = runs[0]
    assert (claimed, made) == runs[1][0][:2] and tables == runs[1][2]
    assert claimed.id == made[holding]
    assert tried == ["claim"]
    assert attempts == ([(True, True), (True, False)] if missed else [(True, True)])
    assert runs[1][0][2] == [(True, True)]


@pytest.mark.parametrize("max_attempts", [3, 1], ids=["reclaimed", "swept"])
def test_an_expired_lease_ahead_is_acted_on_as_before(
    postgres_server: PostgresServer, max_attempts: int
) -> None:
    def scenario(run: Run) -> Any:
        other = claim(run.store, owner="v", lease_ms=1)
        claim(run.store, owner="u")
        run.clock.now += 10  # v's lease expired (after the last queued row came due)
        return other, claim(run.store), claim(run.store), run.made

    done, tried, tables = assert_same(both_ways(postgres_server, 3, scenario, max_attempts=max_attempts))
    other, first, second, made = done
    assert tried == ["claim"] * 4
    statuses = {row["occurrence_id"]: row["status"] for row in tables["occurrences"]}
    if max_attempts == 1:  # swept first, then the queued row claimed
        assert statuses[other.id] == "dead_letter" and first.id == made[2] and second is None
    else:  # the queued row, then v's occurrence claimed again
        assert first.id == made[2] and (second.id, second.fence) == (other.id, 2)


def test_heads_that_are_not_plain_are_claimed_as_before(postgres_server: PostgresServer) -> None:
    """A requeued dead letter (its pending request consumed by the claim, the attempt kept) and a
    row of a disabled job at the head: the statement claims neither, and the call claims (or
    passes over) them the usual way."""

    def scenario(run: Run) -> Any:
        retried = claim(run.store, owner="u")
        first = claim(run.store, owner="v")
        failed = settle(run.store, first.id, owner="v", outcome="failed", retryable=False, error=ERROR)
        run.store.requeue_dead_letter(
            occurrence_id=first.id, expected_fence=1, expected_error_code=ERROR["code"], request_id="rq-1"
        )
        again = claim(run.store)
        retry = settle(run.store, retried.id, owner="u", outcome="failed", error=ERROR)  # due at once
        job = run.store.get_job("job-1")
        assert job is not None
        run.store.update_job("job-1", job.revision, enabled=False)
        return failed, again, retry, claim(run.store)

    done, tried, tables = assert_same(both_ways(postgres_server, 2, scenario))
    failed, again, retry, disabled = done
    assert failed.status == "dead_letter" and retry.status == "retry_wait" and disabled is None
    assert (again.id, again.attempt, again.fence) == (failed.id, 1, 2)
    assert tried == ["claim"] * 4  # failures are never tried as one statement
    (request,) = tables["scheduler_occurrence_retries"]
    assert request["claimed_at"] is not None


@pytest.mark.parametrize(
    ("name", "how"),
    [
        ("lease lost: another fence", {"fence": 2}),
        ("lease lost: another owner", {"owner": "v"}),
        ("lease lost: expired", {"advance": LEASE}),
        ("lease lost: settled already", {"twice": True}),
        ("lease lost: no such occurrence", {"missing": True}),
        ("a failure", {"outcome": "failed", "retryable": False, "error": ERROR}),
        ("a retry", {"outcome": "failed", "error": ERROR}),
        ("a retry due later", {"outcome": "failed", "error": ERROR, "retry_at": T0 + 5}),
    ],
)
def test_what_the_settle_statement_does_not_decide_ends_as_before(
    postgres_server: PostgresServer, name: str, how: dict[str, Any]
) -> None:
    def scenario(run: Run) -> Any:
        held_now = claim(run.store)
        run.clock.now += how.get("advance", 0)
        outcome = {key: how[key] for key in ("outcome", "retryable", "error", "retry_at") if key in how}
        settled_id = "occ_missing" if how.get("missing") else held_now.id
        results = [settle(run.store, settled_id, how.get("fence", 1), how.get("owner", "w"), **outcome)]
        if how.get("twice"):
            results.append(settle(run.store, held_now.id))
        return results, claim(run.store)

    done, tried, _tables = assert_same(both_ways(postgres_server, 3, scenario))
    results, _next = done
    if name.startswith("lease lost"):
        assert results[-1] == "SCHEDULER_LEASE_LOST"
        assert tried[:2] == ["claim", "settle"]  # tried, missed, and run again the usual way
    else:
        assert tried == ["claim", "claim"]


def test_a_pause_requested_on_the_settled_row_is_terminalized_as_before(
    postgres_server: PostgresServer,
) -> None:
    def scenario(run: Run) -> Any:
        held_now = claim(run.store)
        run.store.request_occurrence_pause(
            occurrence_id=held_now.id, expected_fence=1, request_id="pause-1", capability=CAPABILITY
        )
        return settle(run.store, held_now.id), run.store.get_occurrence_control(held_now.id)

    done, tried, _tables = assert_same(both_ways(postgres_server, 2, scenario))
    settled, control = done
    assert settled.status == "succeeded" and control.state == "terminal"
    assert tried == ["claim", "settle"]


def test_a_result_is_written_as_its_canonical_json(postgres_server: PostgresServer) -> None:
    result = {"b": [1, "ü", None, "it's"], "a": {"z": 1.5, "y": "\u2028"}}

    def scenario(run: Run) -> Any:
        held_now = claim(run.store)
        return settle(run.store, held_now.id, result=result), settle(run.store, run.made[1], result=None)

    (settled, other), tried, _tables = assert_same(both_ways(postgres_server, 2, scenario))
    assert settled.result == result and other == "SCHEDULER_LEASE_LOST"
    assert tried == ["claim", "settle", "settle"]


def test_an_unrepresentable_lease_expiry_is_refused_as_before(postgres_server: PostgresServer) -> None:
    def scenario(run: Run) -> Any:
        run.clock.now = MAX_SAFE_INTEGER - LEASE + 1
        return claim(run.store), claim(run.store, lease_ms=1)

    done, tried, _tables = assert_same(both_ways(postgres_server, 2, scenario))
    assert done[0] == "SCHEDULER_INVALID_ARGUMENT" and done[1] is not None
    assert tried == ["claim", "claim"]


def test_the_statements_are_not_used_where_events_are_logged(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    def scenario(run: Run) -> Any:
        with caplog.at_level("INFO", logger="scheduler.events"):
            held_now = claim(run.store)
            return held_now, settle(run.store, held_now.id)

    _done, tried, _tables = assert_same(both_ways(postgres_server, 2, scenario))
    assert tried == []


def test_with_the_server_clock_one_reading_serves_each_call(postgres_server: PostgresServer) -> None:
    schema = unique_name("t_single_clock")
    seen: Recorded = []
    engine = create_engine(postgres_server.url, connect_args={"cursor_factory": recording_cursor(seen)})
    store = open_store(engine, schema=schema)
    try:
        enqueue(store, 6)
        sent = []
        for _ in range(5):
            before = len(seen)
            held_now = store.claim_next(owner_id="w", lease_ms=LEASE)
            middle = len(seen)
            assert held_now is not None
            settled = store.settle(occurrence_id=held_now.id, owner_id="w", fence=1, outcome="succeeded")
            sent.append((middle - before, len(seen) - middle))
            assert held_now.lease_expires_at == held_now.updated_at + LEASE
            assert settled.settled_at == settled.updated_at >= held_now.updated_at
        assert sent[-1] == (1, 1)
        tables = dump_tables(store)
        occurrences = {row["occurrence_id"]: row for row in tables["occurrences"]}
        settled_events = [row for row in tables["events"] if row["event_type"] == "occurrence_succeeded"]
        assert len(settled_events) == 5
        for event in settled_events:
            assert event["occurred_at"] == occurrences[event["occurrence_id"]]["settled_at"]
    finally:
        store.close()
        engine.dispose()
        postgres_server.drop_schema(schema)


def _slowed(name: str, before: str) -> Prepared:
    """The statement ``name`` of ``queries.sql`` sleeping 2 s once its snapshot is taken, where its
    clock is read (before it locks or writes a row)."""
    sql = queries.SQL[name]
    clock = "::bigint) AS now )"
    assert sql.count(clock) == 1 and before in sql
    return queries.prepared(name, sql.replace(clock, "::bigint) AS now FROM pg_sleep(2) )"))


def _wait_event(connection: Connection, pid: int) -> str | None:
    try:
        event = connection.exec_driver_sql(
            "SELECT wait_event FROM pg_stat_activity WHERE pid = %(pid)s", {"pid": pid}
        ).scalar()
        return None if event is None else str(event)
    finally:
        connection.rollback()


def _while_asleep(postgres_server: PostgresServer, store: SchedulerStore, call: Callable[[], Any]) -> Any:
    """``call`` in a thread; returns once the store's statement sleeps (``_slowed``), with the
    thread and where its result goes."""
    pid = store.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    store.connection.rollback()
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(call()))
    with postgres_server.engine.connect() as watcher:
        thread.start()
        while _wait_event(watcher, pid) != "PgSleep":
            assert thread.is_alive(), results
    return thread, results


def test_a_head_changed_under_the_claim_statement_is_claimed_as_it_is_now(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another transaction changes the head and commits after the statement's snapshot was taken:
    the statement locks the newest version, which its version check refuses; the call runs again
    the usual way and claims the head as it is now."""
    monkeypatch.setattr(queries, "CLAIM", _slowed("claim", "FOR UPDATE OF o SKIP LOCKED"))
    schema = unique_name("t_single_race")
    store = open_store(postgres_server.engine, schema=schema, clock=lambda: T0)
    try:
        first, second = enqueue(store, 2)
        thread, results = _while_asleep(postgres_server, store, lambda: claim(store))
        with postgres_server.engine.begin() as other:
            other.exec_driver_sql(
                f'UPDATE "{schema}".occurrences SET fence = 1 WHERE occurrence_id = %(id)s', {"id": first}
            )
        thread.join(30)
        (claimed,) = results
        assert (claimed.id, claimed.fence) == (first, 2)
        assert store.get_occurrence(second).status == "queued"
    finally:
        store.close()
        postgres_server.drop_schema(schema)


@pytest.mark.parametrize("lead", [True, False])
def test_a_pause_request_committed_after_the_settle_statement_began_is_never_left_on_a_settled_row(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch, lead: bool
) -> None:
    """As the cycle's (``test_postgresql_cycle_statement``): the row is locked by a lead statement in
    the same round trip (``PendingSettle.lead``), so a pause request sent while the statement
    sleeps waits for the settlement and finds the occurrence settled. With the lead turned off
    the statement's snapshot misses the request (``lead=False`` documents the race it closes)."""
    monkeypatch.setattr(queries, "SETTLE", _slowed("settle", "UPDATE"))
    if not lead:
        monkeypatch.setattr(settle_statement.PendingSettle, "lead", property(lambda _self: None))
    schema = unique_name("t_single_pause")
    store = open_store(postgres_server.engine, schema=schema, clock=lambda: T0)
    pauser = open_store(postgres_server.engine, schema=schema, clock=lambda: T0)
    try:
        (made,) = enqueue(store, 1)
        assert claim(store).id == made
        thread, results = _while_asleep(postgres_server, store, lambda: settle(store, made))
        try:
            pauser.request_occurrence_pause(
                occurrence_id=made, expected_fence=1, request_id="pause-1", capability=CAPABILITY
            )
            paused = "requested"
        except SchedulerKernelError as error:
            paused = error.code
        thread.join(30)
        (settled,) = results
        control = store.get_occurrence_control(made)
        state = None if control is None else control.state
        if lead:
            assert (paused, state, settled.status) == ("SCHEDULER_OCCURRENCE_NOT_RUNNING", None, "succeeded")
        else:
            assert (paused, state, settled.status) == ("requested", "pause_requested", "succeeded")
    finally:
        pauser.close()
        store.close()
        postgres_server.drop_schema(schema)
