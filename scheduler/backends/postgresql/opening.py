"""``open_store`` on PostgreSQL (psycopg 3): the URL or Engine, the store's connection, v6.

The store's connection runs READ COMMITTED with ``lock_timeout`` set from ``busy_timeout_ms`` and
without bitmap scans or JIT (``PLANNER_SQL``);
opening creates the schema (empty → v6 in one transaction, serialized between processes by the
schema layer's advisory lock) or upgrades it, and verifies the catalog every time. The
connection goes back to its pool as it came (isolation level by SQLAlchemy, settings reset).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import suppress
from typing import Final

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.pool import NullPool

from scheduler.backends.postgresql import backend as postgresql
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import normalize_epoch_ms
from scheduler.schema.target import SchemaTarget, schema_target
from scheduler.schema.upgrade import initialize_or_upgrade
from scheduler.store.plumbing.runner_base import SERVER_CLOCK
from scheduler.store.plumbing.tx import Clock

log = logging.getLogger("scheduler.store")

PSYCOPG_DRIVER: Final = "postgresql+psycopg"
BACKEND_NAMES: Final = ("postgresql", "postgres")

PLANNER_SQL: Final = ("SET enable_bitmapscan = off", "SET enable_sort = off", "SET jit = off")
"""The store's own connection plans without bitmap scans, without a sort an index can spare, and
never JIT-compiles.

Before ``occurrences`` is analyzed (or while its statistics predate a burst of enqueues), the
planner estimates a handful of due rows and serves the claim's ``ORDER BY … LIMIT`` probes with a
bitmap scan of every due row and a sort: cost grows with the queue's depth (20k due rows: ~14 ms a
claim). Without bitmap scans the cheapest plan for any row estimate is the ordered walk of
``scheduler_occurrences_claim`` that stops after the window (a sequential scan costs the whole
table), custom or generic. The store's statements reach rows through ordered walks and key
lookups (no OR over indexed columns), so they lose nothing else. A caller's connection
(``on_connection``) keeps its own settings.

No sort where an index yields the order: the expired-lease probe (``claim_query._expired``, run
on every claim) is ordered by lease expiry (``dialect.expiry_order``), which only
``scheduler_pg_occurrences_expired`` yields. With statistics taken while no row ran, the planner
otherwise walked ``scheduler_occurrences_claim`` and sorted: that walk steps over every running
entry, the dead one each settle leaves among them included (its lease, checked in the index,
lies ahead, so no scan marks it dead), and grew with the settles of the last lease (after 10,000
cycles of a 60 s lease, 1,445 and 1,960 µs of server CPU per cycle against 1,010 and 1,465).
Where every plan sorts (a ranking over a CTE, an order no index has) the setting changes
nothing; the store's other ordered reads have an index that both filters and orders
(``scheduler_occurrences_claim``, ``…_job``, ``scheduler_events_*``) or none that orders (dead
letters by ``settled_at``), so none becomes a long ordered walk instead of a short sort.

No JIT: the store's statements each touch a handful of rows, but a cost estimate over
``jit_above_cost`` (100,000; e.g. a generic plan guessing at an unknown ``LIMIT`` on a deep queue)
makes PostgreSQL compile the statement's ~200 expressions on every execution: 92 ms a claim at
200k queued rows, 1.4 s at 1M, for an execution of 0.2 ms."""
RESET_PLANNER_SQL: Final = ("RESET enable_bitmapscan", "RESET enable_sort", "RESET jit")


def psycopg_url(url: URL) -> URL:
    """``postgresql://`` is taken as psycopg 3; another PostgreSQL driver is refused
    (``SCHEDULER_INVALID_ARGUMENT``)."""
    driver = url.drivername.partition("+")[2]
    if driver not in ("", "psycopg"):
        raise invalid_argument(
            f"PostgreSQL is supported through psycopg 3 (postgresql+psycopg://), not {driver}"
        )
    return url.set(drivername=PSYCOPG_DRIVER)


def check_engine(engine: Engine) -> None:
    """Refuse a PostgreSQL engine with another driver than psycopg 3 (or its async variant)."""
    dialect = engine.dialect
    if dialect.name == "postgresql" and (dialect.driver != "psycopg" or dialect.is_async):
        driver = "async psycopg" if dialect.is_async else dialect.driver
        raise invalid_argument(f"PostgreSQL is supported through psycopg 3, not the {driver} driver")


def own_engine(url: str) -> Engine:
    """The engine of a store opened from a URL: one connection at a time, READ COMMITTED."""
    return create_engine(url, poolclass=NullPool, isolation_level=postgresql.ISOLATION_LEVEL)


def prepare_connection(conn: Connection, timeout_ms: int) -> None:
    """READ COMMITTED (reset by the pool on release), the lock timeout and the planner setting
    (:data:`PLANNER_SQL`), committed: on the store's connection when it opens, and on
    each new driver connection after a reconnect."""
    conn.execution_options(isolation_level=postgresql.ISOLATION_LEVEL)
    conn.exec_driver_sql(postgresql.lock_timeout_sql(timeout_ms))
    for statement in PLANNER_SQL:
        conn.exec_driver_sql(statement)
    conn.commit()


def session_setup(timeout_ms: int) -> Callable[[Connection], None]:
    """``OwnedRunner.session_setup`` of a PostgreSQL store."""
    return lambda conn: prepare_connection(conn, timeout_ms)


def connect(
    engine: Engine, timeout_ms: int, clock: Clock, schema: str | None
) -> tuple[Connection, SchemaTarget]:
    """Check out the store's connection and bring ``schema`` to v6 in one transaction.

    ``clock`` is the store's (``SERVER_CLOCK``: ``clock_timestamp()``, read inside the
    transaction) and stamps the ``migrations`` rows of a created or upgraded schema.
    """
    postgresql.cache_long_statements()
    conn = checkout(engine)
    try:
        prepare_connection(conn, timeout_ms)
        target = schema_target(conn, schema)
        with conn.begin():
            now = postgresql.server_now(conn) if clock is SERVER_CLOCK else clock()
            initialize_or_upgrade(conn, now=normalize_epoch_ms(now, "clock result"), schema=target.schema)
    except BaseException:
        release(conn)
        raise
    return conn, target


def checkout(engine: Engine) -> Connection:
    """``engine.connect()``; a connection parameter the driver refuses before it contacts the
    server is ``SCHEDULER_INVALID_ARGUMENT``, not a storage failure: psycopg's
    ``ProgrammingError`` without a SQLSTATE (``?connect_timeout=abc``, an unknown option), or the
    ``TypeError`` of a driver whose ``connect`` has no such keyword (asyncpg)."""
    try:
        return engine.connect()
    except ProgrammingError as error:
        if getattr(error.orig, "sqlstate", None) is not None:
            raise
        raise _refused_parameters(error.orig) from error
    except TypeError as error:
        raise _refused_parameters(error) from error


def _refused_parameters(error: BaseException | None) -> SchedulerKernelError:
    return invalid_argument(f"the PostgreSQL connection parameters were refused: {str(error).strip()}")


def release(conn: Connection) -> None:
    """End any transaction, reset the lock timeout and the planner settings and close; never
    raises. If any reset fails, the connection is invalidated instead of returned to the pool, so
    the store's session settings (``enable_sort = off`` …) never reach another of its users."""
    try:
        if conn.in_transaction():
            conn.rollback()
        conn.exec_driver_sql(postgresql.RESET_LOCK_TIMEOUT_SQL)
        for statement in RESET_PLANNER_SQL:
            conn.exec_driver_sql(statement)
        conn.commit()
    except Exception:
        log.debug("resetting the store's connection failed; discarding it", exc_info=True)
        with suppress(Exception):
            conn.invalidate()
    close_quietly(conn)


def close_quietly(conn: Connection) -> None:
    """Close the store's connection; if even that fails, invalidate it so the pool never hands
    it out again. Never raises (either backend)."""
    try:
        conn.close()
    except Exception:
        log.debug("closing the store's connection failed", exc_info=True)
        with suppress(Exception):
            conn.invalidate()
