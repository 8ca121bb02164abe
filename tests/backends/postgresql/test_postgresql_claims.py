"""Claims among concurrent workers on PostgreSQL: SKIP LOCKED, no waits, never a double claim.

Every store here has ``busy_timeout_ms=1`` (``lock_timeout = 1ms``): a call that waits on another
transaction's row lock fails with ``SCHEDULER_STORAGE_UNAVAILABLE`` (55P03, retryable). The
workers retry such a call and count it. A design where contending claimers wait for each other
(the candidate's UPDATE waiting for another worker's claim to commit) fails on nearly every
contended claim; this one waits only in PostgreSQL's own corner (see
``scheduler.backends.postgresql.claim_locks``): a claim whose lock statement meets a row that another worker
claimed and committed microseconds earlier locks that row's new version before it can see the
change, and holds it until it rolls the attempt back, one round trip later; that worker's settle
or next lock of the row waits meanwhile. So the tests allow a few retries in a run of hundreds of
calls: at most one call attempt in :data:`LOCK_TIMEOUT_SHARE` (the tests with a held row show a
claim never waits for it, exactly). Rows another worker is in the middle of claiming are held by
a second connection's open ``SELECT … FOR UPDATE`` transaction.
"""

from __future__ import annotations

import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from sqlalchemy import Connection, Engine, text
from test_postgresql_races import AUTHORITY, T0

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.backends.postgresql import claim_locks, claim_statement, queries
from scheduler.backends.postgresql.claim_tactics import CONTENDED_EXTRA
from scheduler.bench.pg_depth import explain, fill_queue, plan_nodes
from scheduler.store.capabilities import claim_query
from scheduler.store.capabilities.claim_eligibility import NO_FILTER, ClaimFilter
from scheduler.testing import dump_tables

T = TypeVar("T")
LEASE = 60_000
WORKERS = 8


class Clock:
    """A clock the test moves (shared by every store of a test)."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


StoreMaker = Callable[..., list[SchedulerStore]]


@pytest.fixture
def open_stores(pg_engine: Engine, pg_schema: str, clock: Clock) -> Iterator[StoreMaker]:
    """``open_stores(n, busy_timeout_ms=1)``: ``n`` stores on one fresh schema, one connection each."""
    opened: list[SchedulerStore] = []

    def open_one(busy_timeout_ms: int) -> SchedulerStore:
        # Opening verifies the catalog under the same 1 ms lock_timeout; on a loaded machine a
        # catalog lock held for a moment by another test's DDL can exceed it. Only the open is
        # retried: the claims under test never are.
        for attempt in range(5):
            try:
                return open_store(pg_engine, schema=pg_schema, clock=clock, busy_timeout_ms=busy_timeout_ms)
            except SchedulerKernelError as error:
                if (error.details or {}).get("storageCode") != "55P03" or attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def make(count: int, busy_timeout_ms: int = 1) -> list[SchedulerStore]:
        stores = [open_one(busy_timeout_ms) for _ in range(count)]
        opened.extend(stores)
        return stores

    yield make
    for store in opened:
        store.close()


def enqueue(store: SchedulerStore, count: int, *, job_id: str = "job-1", max_attempts: int = 3) -> list[str]:
    """``count`` occurrences of one job, due one ms apart from ``T0 - count`` (the first is oldest).

    The enqueue's COMMIT sends a NOTIFY, which takes the server's notification queue lock, one
    committing transaction of the cluster at a time: another test's may hold it past the 1 ms lock
    timeout, and the refused COMMIT (committed nothing, retryable) is made again."""
    store.create_job(id=job_id, kind="agenda", authority=AUTHORITY, max_attempts=max_attempts)
    requests = [
        {"job_id": job_id, "scheduled_for": T0 - count + i, "trigger_key": f"t{i:05d}"} for i in range(count)
    ]
    return [occurrence.id for occurrence in retried(lambda: store.enqueue_many(requests), Calls())]


@contextmanager
def held(engine: Engine, schema: str, occurrence_ids: list[str]) -> Iterator[Connection]:
    """Another transaction holding these occurrences' rows (``FOR UPDATE``) until the block ends."""
    with engine.connect() as connection, connection.begin() as transaction:
        connection.exec_driver_sql(
            f'SELECT occurrence_id FROM "{schema}".occurrences WHERE occurrence_id = ANY(%(ids)s) FOR UPDATE',
            {"ids": occurrence_ids},
        ).all()
        yield connection
        transaction.rollback()


LOCK_TIMEOUT_SHARE = 8
"""At most one call attempt in this many (a retried call counts each attempt) may end in a lock
timeout in the worker tests.

Measured on this project's 2-core machines, 15 runs with both cores also busy: 0 to 4.4% of calls
(mostly a settle waiting for a claimer that locked its just-claimed row, see the module
docstring); the same runs with the claim's ``SKIP LOCKED`` removed, so contending claimers wait
for each other: 73 to 81%."""


class Calls:
    """Calls the workers made and lock timeouts among them (shared by the workers of one run)."""

    def __init__(self) -> None:
        self.made = 0
        self.timeouts = 0
        self.lock = threading.Lock()

    def count(self, *, timeout: bool) -> None:
        with self.lock:
            self.made += 1
            self.timeouts += timeout

    def too_many_timeouts(self) -> bool:
        return self.timeouts * LOCK_TIMEOUT_SHARE > max(self.made, 100)


def retried(call: Callable[[], T], calls: Calls) -> T:
    """``call()``, again after each lock timeout (counted in ``calls``; at most 50 in a row)."""
    for _ in range(50):
        try:
            result = call()
        except SchedulerKernelError as error:
            if error.details.get("storageCode") != "55P03" or error.details.get("retryable") is not True:
                raise
            calls.count(timeout=True)
        else:
            calls.count(timeout=False)
            return result
    raise AssertionError("50 lock timeouts in a row: the call waits for another worker")


def run_workers(open_stores: StoreMaker, count: int = WORKERS) -> list[str]:
    """``count`` workers at once (one thread and store each) claiming and settling until nothing
    is left; the errors they raised. More lock timeouts than one call attempt in
    ``LOCK_TIMEOUT_SHARE`` fail."""
    stores = open_stores(count)
    barrier = threading.Barrier(count)
    failures: list[str] = []
    calls = Calls()

    def run(index: int) -> None:
        barrier.wait()
        try:
            work(stores[index], f"w{index}", index % 3, calls)
        except SchedulerKernelError as error:
            failures.append(f"{error.code} {error.details}")
        except Exception:  # reported, so the assertion shows it
            failures.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(index,), daemon=True) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), ("a worker did not finish", failures)
    assert not calls.too_many_timeouts(), (calls.timeouts, calls.made, failures)
    return failures


def work(store: SchedulerStore, owner: str, style: int, calls: Calls) -> None:
    """Claim and settle until nothing is left: two calls, one-commit cycles, or batches of 5."""
    if style == 0:
        while (
            claimed := retried(lambda: store.claim_next(owner_id=owner, lease_ms=LEASE), calls)
        ) is not None:
            settle = {
                "occurrence_id": claimed.id,
                "owner_id": owner,
                "fence": claimed.fence,
                "outcome": "succeeded",
            }
            retried(lambda settle=settle: store.settle(**settle), calls)
    elif style == 1:
        held_now = retried(lambda: store.claim_next(owner_id=owner, lease_ms=LEASE), calls)
        while held_now is not None:
            cycle = {"occurrence_id": held_now.id, "owner_id": owner, "fence": held_now.fence}
            held_now = retried(
                lambda cycle=cycle: store.settle_and_claim(**cycle, outcome="succeeded", lease_ms=LEASE),
                calls,
            ).claimed
    else:
        while batch := retried(lambda: store.claim_batch(owner_id=owner, lease_ms=LEASE, limit=5), calls):
            settlements = [
                {"occurrence_id": one.id, "owner_id": owner, "fence": one.fence, "outcome": "succeeded"}
                for one in batch
            ]
            retried(lambda settlements=settlements: store.settle_many(settlements), calls)


def test_eight_workers_claim_every_occurrence_exactly_once_without_waiting(
    open_stores: StoreMaker,
) -> None:
    (store,) = open_stores(1)
    made = enqueue(store, 400)

    assert run_workers(open_stores) == []

    tables = dump_tables(store)
    assert {row["occurrence_id"]: row["status"] for row in tables["occurrences"]} == dict.fromkeys(
        made, "succeeded"
    )
    claims = Counter(
        (row["occurrence_id"], row["fence"])
        for row in tables["events"]
        if row["event_type"] == "occurrence_claimed"
    )
    assert claims == Counter({(occurrence_id, 1): 1 for occurrence_id in made})
    settled = Counter(
        row["occurrence_id"] for row in tables["events"] if row["event_type"] == "occurrence_succeeded"
    )
    assert settled == Counter(made)
    owners = {row["owner_id"] for row in tables["events"] if row["event_type"] == "occurrence_claimed"}
    assert len(owners) > 1  # the workers really ran side by side


def test_a_held_candidate_is_passed_over_at_once_and_claimable_once_released(
    open_stores: StoreMaker, pg_engine: Engine, pg_schema: str
) -> None:
    (store,) = open_stores(1)
    first, second, third = enqueue(store, 3)
    with held(pg_engine, pg_schema, [first]):
        claimed = store.claim_next(owner_id="w", lease_ms=LEASE)  # lock_timeout 1ms: no wait
        assert claimed is not None and claimed.id == second
    again = store.claim_next(owner_id="w", lease_ms=LEASE)
    assert again is not None and again.id == first
    last = store.claim_next(owner_id="w", lease_ms=LEASE)
    assert last is not None and last.id == third


def test_claims_read_past_every_candidate_others_hold(
    open_stores: StoreMaker, pg_engine: Engine, pg_schema: str
) -> None:
    """More held rows than one read returns: the claim reads again instead of returning None."""
    (store,) = open_stores(1)
    made = enqueue(store, 40)
    with held(pg_engine, pg_schema, made[:30]):
        claimed = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert claimed is not None and claimed.id == made[30]
        batch = store.claim_batch(owner_id="w", lease_ms=LEASE, limit=20)
        assert [one.id for one in batch] == made[31:]
        assert store.claim_next(owner_id="w", lease_ms=LEASE) is None  # only held rows are left
    assert [one.id for one in store.claim_batch(owner_id="w", lease_ms=LEASE, limit=50)] == made[:30]


def test_the_sweep_passes_over_held_rows_and_keeps_its_limit(
    open_stores: StoreMaker, pg_engine: Engine, pg_schema: str, clock: Clock
) -> None:
    """Expired final attempts: the sweep dead-letters at most 100 per claim, skipping a held one."""
    (store,) = open_stores(1)
    made = enqueue(store, 130, max_attempts=1)
    assert len(store.claim_batch(owner_id="old", lease_ms=1000, limit=130)) == 130
    clock.now += 5000  # every lease expired, on its final attempt
    first = min(made)  # the sweep's order: (lease_expires_at, occurrence_id), all leases alike
    with held(pg_engine, pg_schema, [first]):
        assert store.claim_next(owner_id="w", lease_ms=LEASE) is None
        statuses = Counter(row["status"] for row in dump_tables(store)["occurrences"])
        assert statuses == Counter({"dead_letter": 99, "running": 31})  # 100 tried, the held one passed over
        assert store.claim_next(owner_id="w", lease_ms=LEASE) is None
        rows = {row["occurrence_id"]: row["status"] for row in dump_tables(store)["occurrences"]}
        assert rows[first] == "running"
        assert Counter(rows.values()) == Counter({"dead_letter": 129, "running": 1})
    assert store.claim_next(owner_id="w", lease_ms=LEASE) is None
    assert {row["status"] for row in dump_tables(store)["occurrences"]} == {"dead_letter"}


def test_eight_workers_sweep_and_claim_side_by_side(open_stores: StoreMaker, clock: Clock) -> None:
    """Expired final attempts and queued work, 8 workers: each expired row swept exactly once."""
    (store,) = open_stores(1)
    expired = enqueue(store, 150, job_id="job-expired", max_attempts=1)
    store.claim_batch(owner_id="old", lease_ms=1000, limit=150)
    clock.now += 5000
    queued = enqueue(store, 200, job_id="job-queued")

    assert run_workers(open_stores) == []

    tables = dump_tables(store)
    status = {row["occurrence_id"]: row["status"] for row in tables["occurrences"]}
    assert status == {**dict.fromkeys(expired, "dead_letter"), **dict.fromkeys(queued, "succeeded")}
    swept = Counter(
        row["occurrence_id"] for row in tables["events"] if row["event_type"] == "occurrence_dead_lettered"
    )
    assert swept == Counter(expired)
    claimed = Counter(
        row["occurrence_id"] for row in tables["events"] if row["event_type"] == "occurrence_claimed"
    )
    assert claimed == Counter(expired) + Counter(queued)


def test_expired_leases_are_reclaimed_once_among_workers(open_stores: StoreMaker, clock: Clock) -> None:
    (store,) = open_stores(1)
    made = enqueue(store, 120)
    store.claim_batch(owner_id="old", lease_ms=1000, limit=120)
    clock.now += 5000

    assert run_workers(open_stores) == []

    events = dump_tables(store)["events"]
    reclaimed = Counter(
        (row["occurrence_id"], row["fence"]) for row in events if row["event_type"] == "occurrence_reclaimed"
    )
    assert reclaimed == Counter({(occurrence_id, 2): 1 for occurrence_id in made})


def _lock_waiters(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(
            connection.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).scalar_one()
        )


def test_a_targeted_claim_waits_for_a_claim_in_flight_and_runs_after_it(
    pg_engine: Engine, pg_schema: str, clock: Clock
) -> None:
    """``claim_occurrence`` of a row another worker holds waits (plain FOR UPDATE), then decides
    on the row that worker left: claimed by it (None here) or released (claimed here)."""
    store = open_store(pg_engine, schema=pg_schema, clock=clock, busy_timeout_ms=30_000)
    other = open_store(pg_engine, schema=pg_schema, clock=clock, busy_timeout_ms=30_000)
    try:
        first, second = enqueue(store, 2)
        results: list[Any] = []
        with other.transaction() as tx:
            taken = tx.claim_next(owner_id="other", lease_ms=LEASE)
            assert taken is not None and taken.id == first
            thread = threading.Thread(
                target=lambda: results.append(
                    store.claim_occurrence(occurrence_id=first, owner_id="w", lease_ms=LEASE)
                )
            )
            thread.start()
            while _lock_waiters(pg_engine) == 0:  # the targeted claim is waiting for the row
                assert thread.is_alive(), results
        thread.join(30)
        assert results == [None]  # serially after the other claim: running under a live lease
        with pg_engine.connect() as connection, connection.begin():
            connection.exec_driver_sql(
                f'SELECT 1 FROM "{pg_schema}".occurrences WHERE occurrence_id = %(id)s FOR UPDATE',
                {"id": second},
            ).all()
            thread = threading.Thread(
                target=lambda: results.append(
                    store.claim_occurrence(occurrence_id=second, owner_id="w", lease_ms=LEASE)
                )
            )
            thread.start()
            while _lock_waiters(pg_engine) == 0:
                assert thread.is_alive(), results
        thread.join(30)
        assert results[1] is not None and results[1].id == second and results[1].fence == 1
    finally:
        store.close()
        other.close()


def test_no_claim_statement_scans_the_occurrences_table(
    open_stores: StoreMaker, pg_engine: Engine, pg_schema: str, clock: Clock
) -> None:
    """Claim cost does not grow with the queue: on 20k queued rows (analyzed) every statement of
    the claim path reaches ``occurrences`` through an index (the bench measures 1k vs 1M)."""
    (store,) = open_stores(1)
    enqueue(store, 150)
    store.claim_batch(owner_id="old", lease_ms=1000, limit=100)  # running rows, expired below
    with pg_engine.begin() as connection:
        fill_queue(connection, pg_schema, "job-1", 20_000, due_at=T0, prefix="deep")
    now = T0 + 5000
    keys = [("occ_bulk_deep_000000001", 0, "queued"), ("occ_bulk_deep_000000002", 0, "queued")]
    ids = [key[0] for key in keys]
    statements = {
        "claim_next": (claim_query.claim_next_statement(NO_FILTER), None),
        "claim_next(job_kind)": (
            claim_query.claim_next_statement(ClaimFilter(("agenda",))),
            None,
        ),
        "claim_occurrence": (
            claim_query.CLAIM_OCCURRENCE,
            {"now": now, "occurrence_id": ids[0], "expired_limit": 100},
        ),
        "lock candidates": (
            claim_locks.LOCK_CANDIDATES.statement,
            {"p_ids": ids, "p_versions": [claim_locks.version(*key) for key in keys], "p_limit": 1},
        ),
        "lock expired": (claim_locks.LOCK_EXPIRED.statement, {"p_ids": ids, "p_now": now}),
        "lock target": (claim_locks.LOCK_TARGET.statement, {"p_id": ids[0]}),
        "re-read": (claim_query.LOCKED_ROWS.statement, {"p_ids": ids}),
    }
    with pg_engine.connect() as connection:
        for name, (statement, params) in statements.items():
            if params is None:
                kinds = ClaimFilter(("agenda",)) if "job_kind" in name else NO_FILTER
                params = claim_query.claim_next_params(now, 1 + CONTENDED_EXTRA, kinds)
            nodes = [
                node
                for node in plan_nodes(explain(connection, pg_schema, statement, params))
                if node.get("Relation Name") == "occurrences"
            ]
            assert nodes, name
            assert all(node["Node Type"] != "Seq Scan" for node in nodes), (name, nodes)
    claimed = store.claim_next(owner_id="w", lease_ms=LEASE)  # the oldest due row: the first bulk one
    assert claimed is not None and claimed.id == "occ_bulk_deep_000000001"


def test_a_candidate_committed_while_the_lock_statement_runs_is_returned_as_it_is_now(
    open_stores: StoreMaker, pg_engine: Engine, pg_schema: str
) -> None:
    """PostgreSQL locks the newest version of a row another transaction updated and committed
    after the lock statement's snapshot was taken, then re-checks the ``WHERE`` clause on it
    (EvalPlanQual). The claim's lock statement checks the version it read through a second
    reference to the table, so such a row is returned (as it is now: the claim sees the change
    and rolls the attempt back) instead of staying locked unseen. The statement is slowed here
    (``pg_sleep`` on each row before it is locked) so the other commit lands in between."""
    (store,) = open_stores(1)
    first, second = enqueue(store, 2)
    slowed = claim_locks.LOCK_CANDIDATES.statement.where(text("EXISTS (SELECT FROM pg_sleep(0.2))"))
    params = {
        "p_ids": [first, second],
        "p_versions": [claim_locks.version(key, 0, "queued") for key in (first, second)],
        "p_limit": 1,
    }
    results: list[Any] = []
    with pg_engine.connect() as locker:
        locker = locker.execution_options(schema_translate_map={None: pg_schema})
        pid = locker.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        locker.commit()

        def lock() -> None:
            with locker.begin():
                results.extend(tuple(row) for row in locker.execute(slowed, params))
                results.append(_row_lock_free(pg_engine, pg_schema, first))

        thread = threading.Thread(target=lock)
        thread.start()
        while _wait_event(pg_engine, pid) != "PgSleep":
            assert thread.is_alive(), results
        with pg_engine.begin() as claimer:  # another worker changes the first row meanwhile
            claimer.exec_driver_sql(
                f'UPDATE "{pg_schema}".occurrences SET fence = 1 WHERE occurrence_id = %(id)s',
                {"id": first},
            )
        thread.join(30)
    assert results == [(first, 1, "queued"), False]  # returned as it is now, and locked by the claim


def _wait_event(engine: Engine, pid: int) -> str | None:
    with engine.connect() as connection:
        return connection.exec_driver_sql(
            "SELECT wait_event FROM pg_stat_activity WHERE pid = %(pid)s", {"pid": pid}
        ).scalar()


def _row_lock_free(engine: Engine, schema: str, occurrence_id: str) -> bool:
    """Whether another transaction could lock the row at once (``FOR UPDATE SKIP LOCKED``)."""
    with engine.connect() as connection, connection.begin():
        return bool(
            connection.exec_driver_sql(
                f'SELECT 1 FROM "{schema}".occurrences WHERE occurrence_id = %(id)s FOR UPDATE SKIP LOCKED',
                {"id": occurrence_id},
            ).all()
        )


def test_a_claim_takes_the_first_free_candidate_with_one_lock_statement(
    open_stores: StoreMaker, pg_engine: Engine, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers reading the same head of the queue do not pay a statement per row another holds:
    one lock statement over the candidates passes over the held ones and locks the first free
    row, and nothing is rolled back. A single claim first reads and tries only the head of the
    queue; once a head was held, the store's claims read the first ``claim_query.HEAD_WINDOW``
    due rows of each status (the window) and lock the first free one, and read the full list
    only when the window holds none, until ``ClaimContention.QUIET_CLAIMS`` claims in a row
    took their first candidate. (The claims run the usual way here, their one statement,
    ``claim_statement``, turned off: it would take the same rows, or miss and run them so.)"""
    monkeypatch.setattr(claim_statement, "claim_in_one_statement", lambda *_args: None)
    (store,) = open_stores(1)
    made = enqueue(store, 20)
    seen: list[str] = []
    real_all, real_sql = claim_locks.Tx.all, claim_locks.Tx.driver_sql
    names = {
        id(claim_locks.LOCK_CANDIDATES): "lock",
        id(claim_locks.LOCK_CANDIDATE_ROWS): "lock",
        id(claim_query.head_probe_prepared(NO_FILTER)): "head",
        id(queries.CLAIM_HEAD): "head+lock",
        id(claim_query.claim_next_prepared(NO_FILTER)): "list",
        id(claim_query.head_window_prepared(NO_FILTER)): "window",
    }

    def all_(tx: Any, statement: Any, parameters: Any = None) -> Any:
        if id(statement) in names:
            seen.append(names[id(statement)])
        return real_all(tx, statement, parameters)

    def driver_sql(tx: Any, sql: str) -> None:
        seen.append(sql.split()[0])
        real_sql(tx, sql)

    monkeypatch.setattr(claim_locks.Tx, "all", all_)
    monkeypatch.setattr(claim_locks.Tx, "driver_sql", driver_sql)

    def claim() -> list[str]:
        seen.clear()
        claimed = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert claimed is not None
        return [claimed.id, *seen]

    # A store-owned claim reads the heads and locks the head in one statement, and takes no
    # SAVEPOINT (it restarts instead: test_kept_writes.py).
    assert claim_query.HEAD_WINDOW == 8
    with held(pg_engine, pg_schema, made[:8]):
        assert claim() == [made[8], "head+lock", "list", "lock"]
        # the window (made[0:8]) is all held: the full list is read
        assert claim() == [made[9], "window", "lock", "list", "lock"]
    with held(pg_engine, pg_schema, made[:2]):
        assert claim() == [made[2], "window", "lock"]  # the window's first free row
    quiet = [claim() for _ in range(claim_locks.ClaimContention.QUIET_CLAIMS)]
    assert quiet == [[made[index], "window", "lock"] for index in (0, 1, 3, 4, 5, 6, 7, 10)]
    assert claim() == [made[11], "head+lock"]
    with store.transaction() as tx:  # a caller's transaction cannot restart: savepoints, as before
        seen.clear()
        claimed = tx.claim_next(owner_id="w", lease_ms=LEASE)
        assert claimed is not None and [claimed.id, *seen] == [made[12], "head", "SAVEPOINT", "lock"]
