"""``open_store``: resolve the target, secure the files, create or upgrade to v6, verify, set pragmas."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool, StaticPool

from scheduler.contract.constants import DEFAULT_BUSY_TIMEOUT_MS, MAX_BUSY_TIMEOUT_MS
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import normalize_epoch_ms
from scheduler.schema.catalog import verify_catalog, verify_schema
from scheduler.schema.ddl import SCHEDULER_STORE_SCHEMA_VERSION
from scheduler.schema.upgrade import apply_upgrade, inspect_database
from scheduler.store import files
from scheduler.store.dialect import DURABILITY_PRAGMAS, FILE_PRAGMAS, open_pragmas
from scheduler.store.facade import SchedulerStore
from scheduler.store.failures import find_storage_failure_code, storage_unavailable
from scheduler.store.session import Clock, OwnedRunner, begin_sqlite_transaction

MEMORY = ":memory:"
_PRIOR_ISOLATION = "scheduler_prior_isolation_level"
DEFAULT_FILE_NAME = "kernel-v1.sqlite"


def wall_clock() -> int:
    """Epoch milliseconds from the system clock."""
    return time.time_ns() // 1_000_000


def default_uuid() -> str:
    return str(uuid.uuid4())


def default_database_path() -> Path:
    """``$SCHEDULER_HOME/kernel-v1.sqlite`` (``SCHEDULER_HOME`` defaults to ``~/.scheduler``)."""
    home = os.environ.get("SCHEDULER_HOME") or str(Path.home() / ".scheduler")
    return _absolute(Path(home).expanduser()) / DEFAULT_FILE_NAME


def _validate_options(
    clock: Any, busy_timeout_ms: Any, uuid_factory: Any
) -> tuple[Clock, int, Callable[[], str]]:
    if clock is None:
        clock = wall_clock
    if not callable(clock):
        raise invalid_argument("clock must be a function")
    if (
        isinstance(busy_timeout_ms, bool)
        or not isinstance(busy_timeout_ms, int)
        or not (0 <= busy_timeout_ms <= MAX_BUSY_TIMEOUT_MS)
    ):
        raise invalid_argument("busyTimeoutMs must be an integer between 0 and 60000")
    if uuid_factory is None:
        uuid_factory = default_uuid
    if not callable(uuid_factory):
        raise invalid_argument("uuid_factory must be a function")
    return clock, busy_timeout_ms, uuid_factory


def _absolute(path: Path) -> Path:
    """An absolute, normalized path that keeps symbolic links visible (like Node's path.resolve)."""
    return Path(os.path.abspath(path))


def _resolve(target: Any) -> tuple[str | None, Path | None, Engine | None]:
    """(url, file path or None for memory/foreign, engine) for an ``open_store`` target."""
    if isinstance(target, Engine):
        database = target.url.database
        is_file = target.dialect.name == "sqlite" and database not in (None, "", MEMORY)
        return None, _absolute(Path(database)) if is_file and database else None, target
    if target is None:
        target = default_database_path()
    if isinstance(target, str) and target == MEMORY:
        return "sqlite+pysqlite://", None, None
    if isinstance(target, str) and "://" in target:
        url = make_url(target)
        if url.get_backend_name() != "sqlite":
            raise invalid_argument("only SQLite databases are supported by this version")
        if url.database in (None, "", MEMORY):
            return target, None, None
        return target, _absolute(Path(url.database)), None
    if isinstance(target, (str, os.PathLike)):
        path = _absolute(Path(os.fspath(target)).expanduser())
        return f"sqlite+pysqlite:///{path}", path, None
    raise invalid_argument("target must be a path, ':memory:', an SQLAlchemy URL, an Engine or None")


def _own_engine(url: str, path: Path | None, timeout_ms: int) -> Engine:
    engine = create_engine(
        url,
        poolclass=NullPool if path is not None else StaticPool,
        connect_args={"timeout": timeout_ms / 1000, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _autocommit_driver(dbapi_connection: Any, _record: Any) -> None:
        # The store emits BEGIN IMMEDIATE / BEGIN itself (pysqlite's implicit BEGIN is off).
        dbapi_connection.isolation_level = None

    return engine


def _pragma(conn: Connection, sql: str) -> None:
    # On the driver connection: outside any transaction (foreign_keys and journal_mode are no-ops
    # or errors inside one), and untouched by an engine's own "begin" hooks.
    dbapi_connection: Any = conn.connection.dbapi_connection
    dbapi_connection.execute(sql).close()


def _initialize_or_upgrade(conn: Connection, now: int) -> None:
    """Create an empty database or upgrade v1..v5 to v6 in ONE ``BEGIN IMMEDIATE`` transaction."""
    version = inspect_database(conn)  # runs quick_check
    conn.commit()
    if version == SCHEDULER_STORE_SCHEMA_VERSION:
        verify_catalog(conn, SCHEDULER_STORE_SCHEMA_VERSION)  # quick_check just passed
    else:
        with conn.begin():
            begin_sqlite_transaction(conn)
            # Re-inspect under the write lock: another process may have upgraded meanwhile.
            version = inspect_database(conn)
            if version != SCHEDULER_STORE_SCHEMA_VERSION:
                apply_upgrade(conn, version, now)
        verify_schema(conn, SCHEDULER_STORE_SCHEMA_VERSION)
    conn.commit()


def _connect(engine: Engine, path: Path | None, timeout_ms: int, now: int) -> Connection:
    """Check out the store's connection in driver-autocommit mode and bring the schema to v6.

    The previous driver isolation level is kept in ``conn.info`` and restored on close, so a
    caller's pooled connection goes back to the pool as it came.
    """
    conn = engine.connect()
    dbapi_connection: Any = conn.connection.dbapi_connection
    conn.info[_PRIOR_ISOLATION] = dbapi_connection.isolation_level
    dbapi_connection.isolation_level = None
    try:
        for pragma in open_pragmas():
            _pragma(conn, pragma)
        _pragma(conn, f"PRAGMA busy_timeout = {int(timeout_ms)}")
        _initialize_or_upgrade(conn, now)
        for pragma in (FILE_PRAGMAS if path is not None else ()) + DURABILITY_PRAGMAS:
            _pragma(conn, pragma)
    except BaseException:
        _release(conn)
        raise
    return conn


def _release(conn: Connection) -> None:
    """Give the connection back with its original driver isolation level."""
    try:
        if conn.in_transaction():
            conn.rollback()
        dbapi_connection: Any = conn.connection.dbapi_connection
        if dbapi_connection is not None and _PRIOR_ISOLATION in conn.info:
            dbapi_connection.isolation_level = conn.info.pop(_PRIOR_ISOLATION)
    finally:
        conn.close()


def _open_failure(cause: BaseException) -> SchedulerKernelError:
    if isinstance(cause, SchedulerKernelError):
        return cause
    storage_code = find_storage_failure_code(cause)
    if storage_code:
        return storage_unavailable(phase="open", storage_code=storage_code, commit_state="unknown")
    error = SchedulerKernelError(
        "SCHEDULER_SCHEMA_CORRUPT", "Scheduler database could not be opened or verified"
    )
    return error


def open_store(
    target: Any = None,
    *,
    clock: Any = None,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    uuid_factory: Any = None,
) -> SchedulerStore:
    """Open (creating or upgrading to schema v6) a scheduler store.

    ``target`` is a file path, ``":memory:"``, an SQLAlchemy URL, an ``Engine``, or ``None`` for
    the default path. Refused databases are left byte-for-byte untouched.
    """
    valid_clock, timeout_ms, valid_uuid = _validate_options(clock, busy_timeout_ms, uuid_factory)
    now = normalize_epoch_ms(valid_clock(), "clock result")
    url, path, given_engine = _resolve(target)
    try:
        if path is not None:
            files.ensure_private_directory(path.parent)
            files.secure_existing_files(path)
            files.create_private_file(path)
        engine = given_engine or _own_engine(str(url), path, timeout_ms)
        conn = _connect(engine, path, timeout_ms, now)
        if path is not None:
            files.secure_existing_files(path)
    except BaseException as cause:
        failure = _open_failure(cause)
        if failure is cause:
            raise
        raise failure from cause

    def close() -> None:
        _release(conn)
        if given_engine is None:
            engine.dispose()

    runner = OwnedRunner(conn, valid_clock, valid_uuid)
    return SchedulerStore(runner, clock=valid_clock, uuid_factory=valid_uuid, on_close=close)
