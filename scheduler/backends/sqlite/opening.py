"""``open_store`` on SQLite: bring the file to v6 and switch it to WAL, safely beside other openers.

Several processes may open one older file at once; one upgrades it, the others must wait for
that upgrade and verify its result, never refuse a healthy file:

* The inspection (integrity, version, the catalog of that version) runs in ONE read transaction:
  another process's upgrade commits all at once, so the reads never see half the old catalog
  and half the new one.
* Creating or upgrading runs in ``BEGIN IMMEDIATE`` and inspects again under that lock.
* The switch to WAL waits for another connection's write lock: SQLite refuses it at once
  (``SQLITE_BUSY`` without calling the busy handler, since it upgrades a read lock), so it is
  retried until the busy timeout has passed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection

from scheduler.backends.interface import Backend
from scheduler.backends.sqlite.backend import BEGIN_READ, FILE_PRAGMAS, JOURNAL_MODE
from scheduler.backends.sqlite.backend import begin_transaction as begin_sqlite_transaction
from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema.catalog import verify_catalog, verify_schema
from scheduler.schema.ddl import SCHEDULER_STORE_SCHEMA_VERSION
from scheduler.schema.target import SchemaTarget
from scheduler.schema.upgrade import apply_upgrade, inspect_database
from scheduler.store.plumbing.failures import classify_storage_failure, find_contention_code

_RETRY_FIRST_S: Final = 0.001
_RETRY_MAX_S: Final = 0.05


def pragma(conn: Connection, sql: str) -> None:
    """Run a PRAGMA on the driver connection: outside any transaction (``foreign_keys`` and
    ``journal_mode`` are no-ops or errors inside one), untouched by an engine's "begin" hooks."""
    dbapi_connection: Any = conn.connection.dbapi_connection
    dbapi_connection.execute(sql).close()


def pragma_value(conn: Connection, sql: str) -> Any:
    """The first column of a PRAGMA's first row, read on the driver connection."""
    dbapi_connection: Any = conn.connection.dbapi_connection
    cursor = dbapi_connection.execute(sql)
    try:
        return cursor.fetchone()[0]
    finally:
        cursor.close()


@dataclass
class OpenProgress:
    """What an ``open_store`` has written so far, for a truthful ``commitState`` on failure."""

    committing: bool = False  # a COMMIT (or journal mode switch) is running: outcome unknown
    committed: bool = False  # something was committed (an upgrade, the WAL switch)
    backend: Backend | None = None  # the opened database's (None: one the store does not support)

    @contextmanager
    def commit(self) -> Iterator[None]:
        self.committing = True
        yield
        self.committing = False
        self.committed = True

    def failure(self, cause: BaseException) -> SchedulerKernelError | None:
        """``SCHEDULER_STORAGE_UNAVAILABLE`` (phase ``open``) for a storage failure or contention.

        Lock contention (``SQLITE_BUSY``, even at COMMIT) changes nothing, so it is retryable
        unless an earlier write of this open was committed.
        """
        written = self.committed or self.committing
        return classify_storage_failure(
            cause,
            self.backend,
            phase="open",
            commit_state="unknown" if written else "not_committed",
            contention_state="unknown" if self.committed else "not_committed",
        )


def _end_transaction(conn: Connection) -> None:
    if conn.in_transaction():
        conn.commit()


def _inspect_in_one_snapshot(conn: Connection, target: SchemaTarget) -> int:
    """The version to upgrade from, read (and a v6 catalog verified) in one read transaction.

    Ended with ROLLBACK: it has nothing to commit, and on a damaged file SQLite's COMMIT can fail
    after every read succeeded.
    """
    schema, exclusive = target.schema, target.exclusive
    _end_transaction(conn)  # SQLAlchemy's autobegin of an earlier read (nothing open in the driver)
    snapshot = conn.begin()
    try:
        begin_sqlite_transaction(conn, BEGIN_READ)
        version = inspect_database(conn, schema=schema, exclusive=exclusive)  # runs quick_check
        if version == SCHEDULER_STORE_SCHEMA_VERSION:
            verify_catalog(conn, version, schema=schema, exclusive=exclusive)  # quick_check just passed
    finally:
        with suppress(Exception):
            snapshot.rollback()
    return version


def initialize_or_upgrade(conn: Connection, now: int, progress: OpenProgress, target: SchemaTarget) -> None:
    """Create an empty database or upgrade v1..v5 to v6 in ONE ``BEGIN IMMEDIATE`` transaction."""
    schema, exclusive = target.schema, target.exclusive
    if _inspect_in_one_snapshot(conn, target) == SCHEDULER_STORE_SCHEMA_VERSION:
        return
    transaction = conn.begin()
    try:
        begin_sqlite_transaction(conn)
        # Re-inspect under the write lock: another process may have upgraded meanwhile.
        version = inspect_database(conn, schema=schema, exclusive=exclusive)
        if version == SCHEDULER_STORE_SCHEMA_VERSION:
            transaction.commit()
        else:
            apply_upgrade(conn, version, now, schema=schema, exclusive=exclusive)
            with progress.commit():
                transaction.commit()
    except BaseException:
        with suppress(Exception):
            transaction.rollback()
        raise
    verify_schema(conn, SCHEDULER_STORE_SCHEMA_VERSION, schema=schema, exclusive=exclusive)
    _end_transaction(conn)


def switch_to_wal(conn: Connection, progress: OpenProgress, timeout_ms: int) -> None:
    """Switch the store's own file to WAL (a no-op when it already is), waiting up to
    ``timeout_ms`` for another connection's write lock."""
    if str(pragma_value(conn, JOURNAL_MODE)).lower() == "wal":
        return
    deadline = time.monotonic() + timeout_ms / 1000
    pause = _RETRY_FIRST_S
    with progress.commit():  # switching to WAL rewrites the file header
        while True:
            try:
                for statement in FILE_PRAGMAS:
                    pragma(conn, statement)
                return
            except Exception as error:
                remaining = deadline - time.monotonic()
                if find_contention_code(error) != "SQLITE_BUSY" or remaining <= 0:
                    raise
                time.sleep(min(pause, remaining))
                pause = min(pause * 2, _RETRY_MAX_S)
