"""The claim stays a bounded index walk on PostgreSQL before and after ``occurrences`` is analyzed.

Right after a burst of ``enqueue_many`` (no ANALYZE yet: the suite's server runs without
autovacuum, so the table here is never analyzed) the planner estimates a handful of due rows.
With its default settings it then reads every due row (a bitmap scan) and sorts them for each
window probe of the claim statement. The statement the store ran is captured and EXPLAINed
(ANALYZE) on the store's own connection with the same parameters, as a custom and as a generic
plan (psycopg prepares a statement after five executions): no node may read more than the window.
The cycle in one statement (``cycle_statement``) runs only on an engine without listeners, so its
statement is recorded by the driver's cursor and sent again by hand (rolled back) to be EXPLAINed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from backends import PostgresServer
from claim_seed import as_among_workers
from governance_support import ALICE_AUTHORITY, CHECKPOINT_CAPABILITY
from psycopg import Connection as DriverConnection
from psycopg import sql
from sqlalchemy import Engine, create_engine, event
from test_fastpath_postgresql import recording_cursor
from test_kept_writes import named_statement
from test_postgresql_claims import enqueue
from test_postgresql_races import AUTHORITY, T0

from scheduler import SchedulerStore, open_store
from scheduler.backends.postgresql.claim_tactics import CONTENDED_EXTRA
from scheduler.bench.pg_depth import fill_queue, plan_nodes
from scheduler.store.capabilities import claim_query
from scheduler.store.records import Occurrence

DEPTH = 3000
DEEP = 200_000
CHURNED = 1200
CHURN_CYCLES = 200
WINDOW_ROWS = claim_query.WINDOW + 1 + CONTENDED_EXTRA
"""What one probe of a claim (``1 + CONTENDED_EXTRA`` candidates) may read: its window."""
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


@contextmanager
def captured_claim(engine: Engine, marker: str) -> Iterator[list[tuple[Any, str, dict[str, Any]]]]:
    """(driver connection, SQL, parameters) of each claim statement naming ``marker`` run meanwhile."""
    captured: list[tuple[Any, str, dict[str, Any]]] = []

    def grab(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if marker in statement:
            captured.append((cursor.connection, statement, dict(parameters)))

    event.listen(engine, "before_cursor_execute", grab)
    try:
        yield captured
    finally:
        event.remove(engine, "before_cursor_execute", grab)


def executed_plans(
    driver: DriverConnection[Any], statement: str, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """``EXPLAIN ANALYZE`` of the statement prepared on ``driver``: its custom, then its generic plan."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = _PLACEHOLDER.sub(number, statement).replace("%%", "%")
    arguments = sql.SQL(", ").join(sql.Literal(params[name]) for name in names)
    plans = []
    driver.execute(sql.SQL("PREPARE stale_stats_claim AS {}").format(sql.SQL(text)))  # type: ignore[arg-type]
    try:
        for mode in ("force_custom_plan", "force_generic_plan"):
            driver.execute(f"SET LOCAL plan_cache_mode = {mode}")
            explained = driver.execute(
                sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE stale_stats_claim({})").format(arguments)
            ).fetchone()
            assert explained is not None
            plans.append(explained[0][0]["Plan"])
    finally:
        driver.execute("DEALLOCATE stale_stats_claim")
        driver.rollback()  # ends the EXPLAINs' transaction (and the SET LOCALs) on the store's connection
    return plans


def assert_reads_within_window(plans: list[dict[str, Any]], window: int = WINDOW_ROWS) -> None:
    """No node of any plan reads more ``occurrences`` rows than one probe's ``window``."""
    for plan in plans:
        reads = {
            node.get("Alias"): node["Actual Rows"] * node["Actual Loops"]
            for node in plan_nodes(plan)
            if node.get("Relation Name") == "occurrences"
        }
        assert reads and max(reads.values()) <= window, reads


CLAIMS = [
    pytest.param("due_queued", id="candidate-list"),  # claim_batch; a window that cannot decide
    pytest.param("head_plain", id="head-probe"),  # claim_next while its heads were free (claim_head)
    pytest.param("window", id="window-of-heads"),  # claim_next among workers
]


def _statement_marker(marker: str) -> str:
    """Text that names the claim's statement (the window is claim_query's head probe with a larger
    limit; the quiet head probe is ``claim_head`` of queries.sql)."""
    return {"window": "head_queued", "head_queued": "WITH heads AS ("}.get(marker, marker)


def claim(store: SchedulerStore, marker: str) -> Occurrence | None:
    """One claim through the statement named by ``marker``."""
    if marker == "window":
        as_among_workers(store)
    if marker in ("head_plain", "window"):
        return store.claim_next(owner_id="w", lease_ms=60_000)
    claimed = store.claim_batch(owner_id="w", lease_ms=60_000, limit=1)
    return claimed[0] if claimed else None


@pytest.mark.parametrize("marker", CLAIMS)
def test_claim_walks_a_bounded_window_of_an_unanalyzed_queue(
    private_engine: Engine, pg_schema: str, marker: str
) -> None:
    store = open_store(private_engine, schema=pg_schema, clock=lambda: T0)
    try:
        ids = enqueue(store, DEPTH)
        with captured_claim(private_engine, _statement_marker(marker)) as captured:
            claimed = claim(store, marker)
        assert claimed is not None and claimed.id == ids[0]
        (driver, statement, params), *_ = captured
        assert_reads_within_window(executed_plans(driver, statement, params))
    finally:
        store.close()


@pytest.mark.parametrize("marker", CLAIMS)
def test_the_claims_generic_plan_walks_a_bounded_window_of_an_analyzed_deep_queue(
    private_engine: Engine, pg_schema: str, marker: str
) -> None:
    """psycopg prepares the claim statement; PostgreSQL's plan cache keeps replanning it (custom
    plans, ~1 ms of server CPU a claim) unless its generic plan costs about what a custom one
    does. The claim's ``LIMIT``/``OFFSET`` values are written into the SQL
    (``claim_query._count``), so the generic plan knows them: as parameters, its estimate assumed
    a tenth of the due rows (cost 132,001 against 639 at 200k queued), which also crossed
    ``jit_above_cost`` (100,000): JIT compilation took 92 ms per claim when that plan ran."""
    store = open_store(private_engine, schema=pg_schema, clock=lambda: T0)
    try:
        store.create_job(id="job-1", kind="agenda", authority=AUTHORITY)
        with private_engine.begin() as connection:
            fill_queue(connection, pg_schema, "job-1", DEEP, due_at=T0, prefix="deep")  # and ANALYZE
        with captured_claim(private_engine, _statement_marker(marker)) as captured:
            claimed = claim(store, marker)
        assert claimed is not None
        (driver, statement, params), *_ = captured
        plans = executed_plans(driver, statement, params)
        custom, generic = (plan["Total Cost"] for plan in plans)
        assert generic <= 2 * custom, (custom, generic)
        assert_reads_within_window(plans)
    finally:
        store.close()


@pytest.mark.parametrize("among_workers", [False, True], ids=["head", "window-of-heads"])
def test_the_cycles_first_statement_walks_a_bounded_window_of_a_churned_unanalyzed_queue(
    private_engine: Engine, pg_schema: str, among_workers: bool
) -> None:
    """``settle_and_claim`` on the server clock, once cycles have churned the unanalyzed table (as
    the bench's workers do), quiet and among workers: among workers the first statement reads
    the window of heads from ``occurrences`` before joining the control, requeue and job rows
    (``claim_query._due_head``). With the limit and the joins in one query the planner,
    estimating fewer due rows than the window, joined and sorted every due row on every cycle
    (998 rows read here; with 1,200 queued, 1,160–1,210 µs of server CPU per cycle against
    860–940, ``benchmarks/pg_cycle_cpu.py --contended``)."""
    store = open_store(private_engine, schema=pg_schema)
    try:
        enqueue(store, CHURNED)
        if among_workers:
            as_among_workers(store)
        held = store.claim_next(owner_id="w", lease_ms=60_000)
        for _ in range(CHURN_CYCLES + 1):
            assert held is not None
            with captured_claim(private_engine, "cycle_clock") as captured:
                held = store.settle_and_claim(
                    occurrence_id=held.id,
                    owner_id="w",
                    fence=held.fence,
                    outcome="succeeded",
                    lease_ms=60_000,
                ).claimed
        (driver, statement, params), *_ = captured
        assert_reads_within_window(executed_plans(driver, statement, params))
    finally:
        store.close()


@pytest.mark.parametrize("among_workers", [False, True], ids=["head", "window-of-heads"])
def test_the_cycle_in_one_statement_walks_a_bounded_window_of_a_churned_unanalyzed_queue(
    postgres_server: PostgresServer, pg_schema: str, among_workers: bool
) -> None:
    """The same churn through the one-statement cycle (``cycle_statement``), which the test
    above cannot see (an engine with a listener has no fast path): the statements are recorded
    by the driver's cursor instead. The next cycle's round trip is then sent again by hand on the
    store's connection, with its statement EXPLAINed (ANALYZE, custom and generic plan) and
    rolled back: it settles one row and claims one, reading no more rows of ``occurrences`` in
    any node than the window of heads (``HEAD_WINDOW``; the head probe reads one per arm)."""
    seen: list[tuple[str, Any]] = []
    engine = create_engine(postgres_server.url, connect_args={"cursor_factory": recording_cursor(seen)})
    store = open_store(engine, schema=pg_schema)
    try:
        enqueue(store, CHURNED)
        if among_workers:
            as_among_workers(store)
        settled, held = _churn(store, seen)
        assert held.fence == settled.fence == 1
        (sent, _), *_ = seen
        begin, lead, statement, commit = sent.split("; ")
        assert begin.startswith("BEGIN") and commit == "COMMIT", sent
        assert ("arm_rank" in named_statement(store, statement)) is among_workers
        plans = _explained_cycle(store, lead, statement, settled.id, held.id)
        for plan in plans:
            updated = [node for node in plan_nodes(plan) if node.get("Operation") == "Update"]
            assert [node["Actual Rows"] for node in updated] == [1, 1]  # settled one, claimed one
        assert_reads_within_window(plans, claim_query.HEAD_WINDOW)  # the window of heads at most
    finally:
        store.close()
        engine.dispose()


def _churn(store: SchedulerStore, seen: list[tuple[str, Any]]) -> tuple[Occurrence, Occurrence]:
    """``CHURN_CYCLES`` successful cycles from a first claim, on the server clock: (the occurrence
    the last cycle settled, the one it claimed); ``seen`` then holds the last cycle's statements."""
    settled = held = store.claim_next(owner_id="w", lease_ms=60_000)
    for _ in range(CHURN_CYCLES):
        assert held is not None
        seen.clear()
        cycle = store.settle_and_claim(
            occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=60_000
        )
        settled, held = held, cycle.claimed
    assert held is not None and settled is not None
    return settled, held


def _driver(store: SchedulerStore) -> DriverConnection[Any]:
    """The psycopg connection of the store's own connection."""
    driver: DriverConnection[Any] | None = store.connection.connection.driver_connection
    assert driver is not None
    return driver


def _explained_cycle(
    store: SchedulerStore, lead: str, cycle: str, settled_id: str, held_id: str
) -> list[dict[str, Any]]:
    """The recorded cycle's lead and statement with the occurrence it settled replaced by the one
    now held (every value else is the same: the owner, fence 1, the lease, the server clock):
    ``EXPLAIN (ANALYZE)`` of the statement, as a custom and as a generic plan, each rolled back."""
    driver = _driver(store)
    assert not driver.autocommit  # the statements below run in a transaction rolled back
    lead, cycle = (part.replace(f"'{settled_id}'", f"'{held_id}'") for part in (lead, cycle))
    plans = []
    for mode in ("force_custom_plan", "force_generic_plan"):
        try:
            driver.execute(lead, prepare=False)
            driver.execute(f"SET LOCAL plan_cache_mode = {mode}", prepare=False)
            explained = driver.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {cycle}", prepare=False).fetchone()
            assert explained is not None
            plans.append(explained[0][0]["Plan"])
        finally:
            driver.rollback()
    return plans


def _running_walks(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(index, index condition) of each node that looks running rows up by an index condition
    on ``status`` or ``lease_expires_at``."""
    return [
        (node["Index Name"], node["Index Cond"])
        for node in plan_nodes(plan)
        if "Index Name" in node
        and ("'running'" in node.get("Index Cond", "") or "lease_expires_at" in node.get("Index Cond", ""))
    ]


def _nodes_reading_occurrences(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of ``plan`` that read ``occurrences`` (not the ``ModifyTable`` writing it)."""
    return [
        node
        for node in plan_nodes(plan)
        if node.get("Relation Name") == "occurrences" and node["Node Type"] != "ModifyTable"
    ]


def _reads_by_key(plan: dict[str, Any], keys: set[str]) -> set[str]:
    """The index (or ``Seq Scan``) of each node reading ``occurrences`` by an equality on
    ``occurrence_id`` with one of ``keys`` (as the plan prints it)."""
    return {
        node.get("Index Name", node["Node Type"])
        for node in _nodes_reading_occurrences(plan)
        if any(key in node.get("Index Cond", "") + node.get("Filter", "") for key in keys)
    }


def _occurrences_scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(index or node type, index condition) of each node reading ``occurrences``."""
    return [
        (node.get("Index Name", node["Node Type"]), node.get("Index Cond", ""))
        for node in _nodes_reading_occurrences(plan)
    ]


@pytest.mark.parametrize("among_workers", [False, True], ids=["head", "window-of-heads"])
def test_a_cycle_walks_no_running_entries_whatever_the_statistics_say(
    postgres_server: PostgresServer, pg_schema: str, among_workers: bool
) -> None:
    """Statistics taken while no row ran (``ANALYZE`` of a freshly enqueued queue: ``status`` is
    all ``queued``, ``lease_expires_at`` all NULL) made the planner estimate one running row, and
    it reached running rows through ``scheduler_occurrences_claim`` (``status, available_at``
    lead it) twice per cycle: the settle's row (instead of its primary key) and the expired-lease
    probe (instead of ``scheduler_pg_occurrences_expired``). That walk steps over every running
    entry, including the dead one each settle leaves behind, which no scan marks dead while its
    lease lies ahead (the lease is checked in the index), so a cycle grew with the settles of the
    last lease (``docs/design/postgresql-statements.md``). Now the settle checks ``status`` on the
    row it found by key (``dialect.row_check``) and the probe is ordered by lease expiry
    (``dialect.expiry_order``), which only ``scheduler_pg_occurrences_expired`` yields without a
    sort (the store's connection plans with ``enable_sort = off``)."""
    seen: list[tuple[str, Any]] = []
    engine = create_engine(postgres_server.url, connect_args={"cursor_factory": recording_cursor(seen)})
    store = open_store(engine, schema=pg_schema)
    try:
        enqueue(store, CHURNED)
        with engine.begin() as connection:
            connection.exec_driver_sql(f'ANALYZE "{pg_schema}".occurrences')
        if among_workers:
            as_among_workers(store)
        settled, held = _churn(store, seen)
        (sent, _), *_ = seen
        _, lead, statement, _ = sent.split("; ")
        for plan in _explained_cycle(store, lead, statement, settled.id, held.id):
            walks = _running_walks(plan)
            assert walks and {index for index, _ in walks} == {"scheduler_pg_occurrences_expired"}, walks
            by_key = _reads_by_key(plan, keys={held.id, "($1)::text"})
            assert by_key and by_key <= {"occurrences_pkey"}, by_key  # the settle's row: by its key
    finally:
        store.close()
        engine.dispose()


BY_KEY_WRITES = ("renew", "retry_wait", "dead_letter", "requeue", "sweep", "park", "resume")


def test_the_other_writes_of_one_occurrence_find_it_by_key_whatever_the_statistics_say(
    postgres_server: PostgresServer, pg_schema: str
) -> None:
    """The same statistics (taken while no row ran) after the same churn: every statement that a
    renew, a failed settle (to ``retry_wait`` and to ``dead_letter``), a dead letter's requeue,
    the expired-final-attempt sweep, a pause's acknowledgement (park) and a resume run on
    ``occurrences`` by key reads it through the primary key
    (``dialect.row_check`` on the status), never by walking ``scheduler_occurrences_claim`` or
    ``scheduler_pg_occurrences_expired``. Each is EXPLAINed as a custom and a generic plan."""
    engine = create_engine(postgres_server.url)
    store = open_store(engine, schema=pg_schema)
    try:
        enqueue(store, CHURNED)
        store.create_job(id="job-final", kind="final", authority=AUTHORITY, max_attempts=1)
        store.enqueue_many(
            [{"job_id": "job-final", "scheduled_for": T0 - 9 + i, "trigger_key": f"f{i}"} for i in range(3)]
        )
        store.create_job(id="job-pause", kind="pausable", authority=ALICE_AUTHORITY)
        (pausable,) = store.enqueue_many([{"job_id": "job-pause", "scheduled_for": T0, "trigger_key": "p"}])
        with engine.begin() as connection:
            connection.exec_driver_sql(f'ANALYZE "{pg_schema}".occurrences')
        _, held = _churn(store, [])
        paused = store.claim_occurrence(occurrence_id=pausable.id, owner_id="w", lease_ms=60_000)
        assert paused is not None
        store.request_occurrence_pause(
            occurrence_id=paused.id,
            expected_fence=paused.fence,
            request_id="pause-1",
            capability=CHECKPOINT_CAPABILITY,
        )
        final = store.claim_next(owner_id="w", lease_ms=60_000, job_kind="final")
        expiring = store.claim_next(owner_id="w", lease_ms=1, job_kind="final")
        assert final is not None and expiring is not None
        statements: dict[str, list[tuple[Any, str, dict[str, Any]]]] = {}
        with captured_claim(engine, "occurrences") as captured:
            store.renew(occurrence_id=held.id, owner_id="w", fence=held.fence, lease_ms=60_000)
            statements["renew"], captured[:] = captured[:], []
            store.settle(occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="failed")
            statements["retry_wait"], captured[:] = captured[:], []
            error = {"code": "HANDLER_FAILED", "message": "m"}
            dead = store.settle(
                occurrence_id=final.id,
                owner_id="w",
                fence=final.fence,
                outcome="failed",
                retryable=False,
                error=error,
            )
            statements["dead_letter"], captured[:] = captured[:], []
            store.requeue_dead_letter(
                occurrence_id=dead.id,
                expected_fence=dead.fence,
                expected_error_code="HANDLER_FAILED",
                request_id="rq1",
            )
            statements["requeue"], captured[:] = captured[:], []
            time.sleep(0.05)  # the 1 ms lease of ``expiring`` (its final attempt) has expired
            store.claim_next(owner_id="w", lease_ms=60_000, job_kind="final")
            statements["sweep"], captured[:] = [e for e in captured if "max_attempts FOR UPDATE" in e[1]], []
            control = store.get_occurrence_control(paused.id)
            assert control is not None
            store.ack_occurrence_pause(
                occurrence_id=paused.id,
                owner_id="w",
                fence=paused.fence,
                request_id="pause-1",
                expected_revision=control.revision,
                safe_point="adapter_checkpoint",
            )
            statements["park"], captured[:] = captured[:], []
            control = store.get_occurrence_control(paused.id)
            assert control is not None and control.state == "paused"
            store.resume_occurrence(
                occurrence_id=paused.id, expected_revision=control.revision, request_id="r1"
            )
            statements["resume"] = captured[:]
        swept = store.get_occurrence(expiring.id)
        assert swept is not None and swept.status == "dead_letter"
        keys = (held.id, final.id, expiring.id, paused.id)
        for write in BY_KEY_WRITES:
            by_key = [entry for entry in statements[write] if any(key in str(entry[2]) for key in keys)]
            assert by_key, (write, statements[write])
            for driver, statement, params in by_key:
                for plan in executed_plans(driver, statement, params):
                    scans = _occurrences_scans(plan)
                    assert scans and {index for index, _ in scans} == {"occurrences_pkey"}, (write, scans)
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("among_workers", [False, True], ids=["head", "window-of-heads"])
def test_the_claim_in_one_statement_walks_a_bounded_window_of_a_churned_unanalyzed_queue(
    postgres_server: PostgresServer, pg_schema: str, among_workers: bool
) -> None:
    """The same churn through ``claim_next`` then ``settle``, each one statement
    (``claim_statement``, ``settle_statement``): the last claim's round trip is sent again by hand
    with its statement EXPLAINed (ANALYZE, custom and generic plan) and rolled back. It claims one
    row, reading no more rows of ``occurrences`` in any node than the window of heads."""
    seen: list[tuple[str, Any]] = []
    engine = create_engine(postgres_server.url, connect_args={"cursor_factory": recording_cursor(seen)})
    store = open_store(engine, schema=pg_schema)
    try:
        enqueue(store, CHURNED)
        if among_workers:
            as_among_workers(store)
        for _ in range(CHURN_CYCLES):
            seen.clear()
            held = store.claim_next(owner_id="w", lease_ms=60_000)
            assert held is not None
            claimed = list(seen)
            store.settle(occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded")
        (sent, _), *_ = claimed
        begin, statement, commit = sent.split("; ")
        assert begin.startswith("BEGIN") and commit == "COMMIT", sent
        assert ("arm_rank" in named_statement(store, statement)) is among_workers
        driver = _driver(store)
        plans = []
        for mode in ("force_custom_plan", "force_generic_plan"):
            try:
                driver.execute(f"SET LOCAL plan_cache_mode = {mode}", prepare=False)
                explained = driver.execute(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", prepare=False
                ).fetchone()
                assert explained is not None
                plans.append(explained[0][0]["Plan"])
            finally:
                driver.rollback()
        for plan in plans:
            updated = [node for node in plan_nodes(plan) if node.get("Operation") == "Update"]
            assert [node["Actual Rows"] for node in updated] == [1]  # claimed one
        assert_reads_within_window(plans, claim_query.HEAD_WINDOW)
    finally:
        store.close()
        engine.dispose()
