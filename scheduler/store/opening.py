"""``open_store``: resolve the target, secure the files, create or upgrade to v6, verify, set pragmas."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool, StaticPool

from scheduler.backends import Backend, backend_for, backend_named, is_supported
from scheduler.backends.postgresql import opening as opening_postgresql
from scheduler.backends.sqlite import files
from scheduler.backends.sqlite.backend import (
    CHECKPOINT_ON_CLOSE,
    DURABILITY_PRAGMAS,
    open_pragmas,
)
from scheduler.backends.sqlite.backend import driver_in_transaction as sqlite_driver_in_transaction
from scheduler.backends.sqlite.checkpoints import WalCheckpoints, journal_size_limit_pragma
from scheduler.backends.sqlite.opening import (
    OpenProgress,
    initialize_or_upgrade,
    pragma,
    pragma_value,
    switch_to_wal,
)
from scheduler.contract.constants import DEFAULT_BUSY_TIMEOUT_MS, MAX_BUSY_TIMEOUT_MS
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import normalize_epoch_ms
from scheduler.schema.target import SchemaTarget, quote_identifier, schema_target
from scheduler.store.clock import default_uuid, wall_clock
from scheduler.store.facade import SchedulerStore
from scheduler.store.plumbing.runner_base import SERVER_CLOCK
from scheduler.store.plumbing.session import OwnedRunner
from scheduler.store.plumbing.tx import Clock

log = logging.getLogger("scheduler.store")

MEMORY = ":memory:"
_PRIOR_ISOLATION = "scheduler_prior_isolation_level"
_PRIOR_BUSY_TIMEOUT = "scheduler_prior_busy_timeout"
_CHECKPOINT_SCHEMA = "scheduler_checkpoint_schema"
DEFAULT_FILE_NAME = "kernel-v1.sqlite"


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


def file_path(raw: str) -> Path:
    """The absolute path of a database file; a NUL byte cannot name a file on any platform."""
    if "\x00" in raw:
        raise invalid_argument("a database path must not contain a NUL character")
    return _absolute(Path(raw).expanduser())


@dataclass(frozen=True)
class Resolved:
    """What an ``open_store`` target names: a URL to open an engine for, or an engine.

    ``owned``: the store made ``engine`` (``scheduler.aio`` over an async engine it created), so
    it configures its connections like its own and disposes of it on close.
    """

    url: str | None
    path: Path | None
    engine: Engine | None
    owned: bool = False


def engine_file(engine: Engine) -> Path | None:
    """The absolute path of the engine's database file (``None``: memory, a server, or a database
    the store does not support, refused later)."""
    name = engine.dialect.name
    database = backend_named(name).database_file(engine.url) if is_supported(name) else None
    return _absolute(Path(database)) if database else None


ASYNC_HINT: Final = "use scheduler.aio.open_async_store for an async driver or AsyncEngine"
_SYNC_DRIVERS: Final = "open_store drives synchronous drivers (SQLite's pysqlite, PostgreSQL's psycopg 3)"


def _refuse_async(target: Any) -> None:
    """``SCHEDULER_INVALID_ARGUMENT`` for an ``AsyncEngine`` or an async driver's URL or Engine,
    before anything is created (``open_store`` drives synchronous DBAPI connections only)."""
    if isinstance(getattr(target, "sync_engine", None), Engine):
        raise invalid_argument(f"open_store does not take an AsyncEngine: {ASYNC_HINT}")
    if isinstance(target, Engine) and target.dialect.is_async:
        raise invalid_argument(f"{_SYNC_DRIVERS}, not the async {target.dialect.driver} driver: {ASYNC_HINT}")
    if isinstance(target, str) and "://" in target:
        try:
            url = make_url(target)
            is_async = bool(url.get_dialect().is_async)
        except Exception:  # an unknown or malformed URL is refused by _resolve
            return
        if is_async:
            raise invalid_argument(f"{_SYNC_DRIVERS}, not the async {url.drivername}: {ASYNC_HINT}")


def parse_url(target: str) -> URL:
    """``make_url(target)``; a malformed URL (SQLAlchemy's ``ArgumentError``, or the bare
    ``ValueError`` of a port that is no number) is ``SCHEDULER_INVALID_ARGUMENT``."""
    try:
        return make_url(target)
    except (ArgumentError, ValueError) as cause:
        raise invalid_argument("target is not a valid SQLAlchemy URL") from cause


def _resolve(target: Any) -> Resolved:
    """What an ``open_store`` target names (file path or ``None`` for memory/foreign)."""
    _refuse_async(target)
    if isinstance(target, Engine):
        opening_postgresql.check_engine(target)
        return Resolved(None, engine_file(target), target)
    if target is None:
        target = default_database_path()
    if isinstance(target, str) and target == MEMORY:
        return Resolved("sqlite+pysqlite://", None, None)
    if isinstance(target, str) and "://" in target:
        url = parse_url(target)
        if url.get_backend_name() in opening_postgresql.BACKEND_NAMES:
            psycopg = opening_postgresql.psycopg_url(url)
            return Resolved(psycopg.render_as_string(hide_password=False), None, None)
        if not is_supported(url.get_backend_name()):  # SQLite: PostgreSQL's names were taken above
            raise invalid_argument("the scheduler store supports SQLite and PostgreSQL databases")
        database = backend_named(url.get_backend_name()).database_file(url)
        return Resolved(target, None if database is None else file_path(database), None)
    if isinstance(target, (str, os.PathLike)):
        raw = os.fspath(target)
        path = file_path(raw if isinstance(raw, str) else os.fsdecode(raw))
        return Resolved(f"sqlite+pysqlite:///{path}", path, None)
    raise invalid_argument("target must be a path, ':memory:', an SQLAlchemy URL, an Engine or None")


def own_engine_options(path: Path | None, timeout_ms: int) -> dict[str, Any]:
    """``create_engine`` arguments of a store's own SQLite engine (also ``scheduler.aio``'s)."""
    return {
        "poolclass": NullPool if path is not None else StaticPool,
        "connect_args": {"timeout": timeout_ms / 1000, "check_same_thread": False},
    }


def driver_begins_nothing(engine: Engine) -> None:
    """Turn the driver's implicit BEGIN off on each new connection of a store's own engine: the
    store emits ``BEGIN IMMEDIATE`` / ``BEGIN`` itself."""

    @event.listens_for(engine, "connect")
    def _autocommit_driver(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None


def _own_engine(url: str, path: Path | None, timeout_ms: int) -> Engine:
    engine = create_engine(url, **own_engine_options(path, timeout_ms))
    driver_begins_nothing(engine)
    return engine


def owns_file(schema: str | None, exclusive: bool) -> bool:
    """Whether the store owns the connection's main file: the original's dedicated layout.

    A file shared with the application (``exclusive=False``) or a database attached to the
    application's connection (``schema`` other than ``main``) is the application's: the store
    changes no file property and no connection-wide setting of it (API §8).
    """
    return exclusive and (schema is None or schema.lower() == "main")


def _configure_shared(conn: Connection, target: SchemaTarget, given_engine: bool, timeout_ms: int) -> None:
    """Connection set-up of a shared or attached layout: nothing of the application's changes.

    The store's own connection (a path) gets ``foreign_keys``/``trusted_schema`` as usual: they
    are that connection's. An application's connection must already enforce foreign keys (the
    scheduler's tables rely on them) and keeps its ``trusted_schema``; its ``busy_timeout`` is
    restored on close. ``journal_mode`` is never set (an unqualified one would switch the
    attached files too); ``synchronous`` only for the scheduler's schema.
    """
    if given_engine:
        if int(pragma_value(conn, "PRAGMA foreign_keys")) != 1:
            raise invalid_argument(
                "The application's connection has foreign_keys off: the scheduler's tables need "
                "PRAGMA foreign_keys = ON on every connection (scheduler.sqlite_engine sets it)"
            )
        conn.info[_PRIOR_BUSY_TIMEOUT] = int(pragma_value(conn, "PRAGMA busy_timeout"))
    else:
        for statement in open_pragmas():
            pragma(conn, statement)
    pragma(conn, f"PRAGMA busy_timeout = {int(timeout_ms)}")
    conn.info[_CHECKPOINT_SCHEMA] = target.schema


def _connect(
    engine: Engine,
    path: Path | None,
    timeout_ms: int,
    now: int,
    progress: OpenProgress,
    schema: str | None,
    exclusive: bool,
    given_engine: bool,
) -> tuple[Connection, SchemaTarget]:
    """Check out the store's connection in driver-autocommit mode and bring the schema to v6.

    The previous driver isolation level (and, on an application's connection, busy timeout) is
    kept in ``conn.info`` and restored on close, so a caller's pooled connection goes back to the
    pool as it came.
    """
    conn = engine.connect()
    dbapi_connection: Any = conn.connection.dbapi_connection
    conn.info[_PRIOR_ISOLATION] = dbapi_connection.isolation_level
    dbapi_connection.isolation_level = None
    try:
        target = schema_target(conn, schema, exclusive)
        own = owns_file(target.schema, target.exclusive)
        if not own:
            _configure_shared(conn, target, given_engine, timeout_ms)
        else:
            for statement in open_pragmas():
                pragma(conn, statement)
            pragma(conn, f"PRAGMA busy_timeout = {int(timeout_ms)}")
        initialize_or_upgrade(conn, now, progress, target)
        if path is not None and own:
            switch_to_wal(conn, progress, timeout_ms)
            pragma(conn, journal_size_limit_pragma())  # per connection (checkpoints.py)
        for statement in DURABILITY_PRAGMAS:
            pragma(conn, statement if own else target.pragma(statement.removeprefix("PRAGMA ")))
    except BaseException:
        _release(conn, checkpoint=False)
        raise
    return conn, target


def _end_transaction(conn: Connection) -> None:
    if conn.in_transaction():
        conn.rollback()
    dbapi_connection: Any = conn.connection.dbapi_connection
    if dbapi_connection is not None and sqlite_driver_in_transaction(conn):
        dbapi_connection.rollback()


def _checkpoint(conn: Connection) -> None:
    """Copy the WAL into the main file and truncate it, without waiting for other connections.

    With ``busy_timeout`` 0 a TRUNCATE checkpoint that another connection blocks degrades to a
    passive one (as much as the readers allow) instead of making ``close()`` wait.
    """
    timeout = int(pragma_value(conn, "PRAGMA busy_timeout"))
    pragma(conn, "PRAGMA busy_timeout = 0")
    schema = conn.info.get(_CHECKPOINT_SCHEMA)
    statement = CHECKPOINT_ON_CLOSE
    if schema is not None:  # shared/attached: only the scheduler's database file
        statement = statement.replace("PRAGMA ", f"PRAGMA {quote_identifier(schema)}.", 1)
    try:
        pragma(conn, statement)
    finally:
        pragma(conn, f"PRAGMA busy_timeout = {timeout}")


def _restore_isolation(conn: Connection) -> None:
    dbapi_connection: Any = conn.connection.dbapi_connection
    if dbapi_connection is not None and _PRIOR_BUSY_TIMEOUT in conn.info:
        dbapi_connection.execute(f"PRAGMA busy_timeout = {int(conn.info.pop(_PRIOR_BUSY_TIMEOUT))}").close()
    conn.info.pop(_CHECKPOINT_SCHEMA, None)
    if dbapi_connection is not None and _PRIOR_ISOLATION in conn.info:
        dbapi_connection.isolation_level = conn.info.pop(_PRIOR_ISOLATION)


def _release(conn: Connection, *, checkpoint: bool) -> None:
    """Give the connection back: transaction ended, WAL checkpointed, original driver mode.

    Never raises: a step that fails is logged and the connection is still closed (or, if even
    that fails, invalidated so the pool never hands it out again).
    """
    steps = (
        (_end_transaction, _checkpoint, _restore_isolation)
        if checkpoint
        else (
            _end_transaction,
            _restore_isolation,
        )
    )
    for step in steps:
        try:
            step(conn)
        except Exception:
            log.debug("closing the store: %s failed", step.__name__, exc_info=True)
    opening_postgresql.close_quietly(conn)


def _open_failure(cause: BaseException, progress: OpenProgress) -> SchedulerKernelError:
    """The error ``open_store`` raises for ``cause``.

    Storage failures and lock contention are ``SCHEDULER_STORAGE_UNAVAILABLE`` even when the
    schema layer reported them as a check that "could not run" (a ``SCHEDULER_SCHEMA_*`` error
    caused by a driver error): ``SCHEDULER_SCHEMA_CORRUPT`` is kept for a catalog that really
    differs, or a file SQLite itself reports as damaged.
    """
    if isinstance(cause, SchedulerKernelError):
        driver_cause = cause.__cause__
        if cause.code.startswith("SCHEDULER_SCHEMA_") and driver_cause is not None:
            classified = progress.failure(driver_cause)
            if classified is not None:
                return classified
        return cause
    classified = progress.failure(cause)
    if classified is not None:
        return classified
    return SchedulerKernelError(
        "SCHEDULER_SCHEMA_CORRUPT", "Scheduler database could not be opened or verified"
    )


def open_store(
    target: Any = None,
    *,
    clock: Any = None,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    uuid_factory: Any = None,
    schema: str | None = None,
    exclusive: bool = True,
) -> SchedulerStore:
    """Open (creating or upgrading to schema v6) a scheduler store.

    ``target`` is a file path, ``":memory:"``, an SQLAlchemy URL, an ``Engine``, or ``None`` for
    the default path. ``schema`` is where the scheduler's tables live (SQLite: ``"main"``, the
    default, or an attached database of the engine's connections; PostgreSQL: a schema, default
    ``"scheduler"``); every statement of the store addresses them there. ``exclusive`` (SQLite):
    ``True`` (default) when the file holds the scheduler's catalog and nothing else; ``False``
    for a file shared with the application (scoped verification, version from ``migrations``).
    In a shared or attached layout the store changes no file property and no connection-wide
    setting of the application's (no ``journal_mode``, ``application_id``, ``user_version``,
    ``trusted_schema``, file mode), and refuses an application connection whose
    ``foreign_keys`` is off (``SCHEDULER_INVALID_ARGUMENT``). Refused databases are left
    byte-for-byte untouched, their mode included. An ``AsyncEngine`` or an async driver's URL
    (``sqlite+aiosqlite://``, ``postgresql+asyncpg://``, …) is ``SCHEDULER_INVALID_ARGUMENT``
    naming :func:`scheduler.aio.open_async_store`, and creates nothing.
    """
    options = OpenOptions.validate(clock, busy_timeout_ms, uuid_factory, exclusive)
    return open_resolved(_resolve(target), options, schema)


@dataclass(frozen=True)
class OpenOptions:
    """``open_store``'s validated options (``clock`` as given: ``None`` picks per backend)."""

    clock: Any
    valid_clock: Clock
    timeout_ms: int
    uuid_factory: Callable[[], str]
    exclusive: bool

    @classmethod
    def validate(cls, clock: Any, busy_timeout_ms: Any, uuid_factory: Any, exclusive: Any) -> OpenOptions:
        """``SCHEDULER_INVALID_ARGUMENT`` for a bad option, before anything is opened."""
        valid_clock, timeout_ms, valid_uuid = _validate_options(clock, busy_timeout_ms, uuid_factory)
        if not isinstance(exclusive, bool):
            raise invalid_argument("exclusive must be a boolean")
        return cls(clock, valid_clock, timeout_ms, valid_uuid, exclusive)


def open_resolved(place: Resolved, options: OpenOptions, schema: str | None) -> SchedulerStore:
    """``open_store`` on a resolved target (``scheduler.aio`` calls it inside a greenlet)."""
    given_engine = place.engine
    application_engine = given_engine if not place.owned else None
    name = given_engine.dialect.name if given_engine else make_url(str(place.url)).get_backend_name()
    backend = backend_named(name) if is_supported(name) else None
    if backend is not None and backend.own_schema:
        if not options.exclusive:
            raise invalid_argument(
                "exclusive=False applies to SQLite only: a PostgreSQL schema is the scheduler's"
            )
        return _open_postgresql(
            place,
            options.valid_clock if options.clock is not None else SERVER_CLOCK,
            options.timeout_ms,
            options.uuid_factory,
            schema,
            backend,
        )
    valid_clock, timeout_ms, valid_uuid = options.valid_clock, options.timeout_ms, options.uuid_factory
    exclusive, path = options.exclusive, place.path
    now = normalize_epoch_ms(valid_clock(), "clock result")
    secure_files = owns_file(schema, exclusive)
    progress = OpenProgress(backend=backend)
    engine: Engine | None = given_engine
    try:
        if path is not None:
            files.ensure_private_directory(path.parent)
            files.check_existing_files(path)  # modes change only once the file is accepted
            files.check_writable(path)
            files.create_private_file(path)
        engine = given_engine or _own_engine(str(place.url), path, timeout_ms)
        conn, schema_place = _connect(
            engine, path, timeout_ms, now, progress, schema, exclusive, application_engine is not None
        )
        if path is not None and secure_files:
            try:
                files.secure_existing_files(path)
            except BaseException:
                _release(conn, checkpoint=False)
                raise
    except BaseException as cause:
        if engine is not None and application_engine is None:
            _dispose(engine)
        failure = _open_failure(cause, progress)
        if failure is cause:
            raise
        raise failure from (cause.__cause__ if isinstance(cause, SchedulerKernelError) else cause)
    store_engine = engine

    def close() -> None:
        _release(conn, checkpoint=True)
        if application_engine is None:
            _dispose(store_engine)

    runner = OwnedRunner(conn, valid_clock, valid_uuid, target=schema_place, backend=backend_for(conn))
    if path is not None:
        runner.wal = WalCheckpoints(path)
    return SchedulerStore(runner, clock=valid_clock, uuid_factory=valid_uuid, on_close=close)


def _dispose(engine: Engine) -> None:
    with suppress(Exception):
        engine.dispose()


def _open_postgresql(
    place: Resolved,
    clock: Clock,
    timeout_ms: int,
    uuid_factory: Callable[[], str],
    schema: str | None,
    backend: Backend,
) -> SchedulerStore:
    """``open_store`` on PostgreSQL (``opening_postgresql``); ``clock`` may be ``SERVER_CLOCK``."""
    owns_engine = place.engine is None or place.owned
    engine = place.engine or opening_postgresql.own_engine(str(place.url))
    try:
        conn, schema_place = opening_postgresql.connect(engine, timeout_ms, clock, schema)
    except BaseException as cause:
        if owns_engine:
            _dispose(engine)
        failure = _open_failure(cause, OpenProgress(backend=backend))
        if failure is cause:
            raise
        raise failure from (cause.__cause__ if isinstance(cause, SchedulerKernelError) else cause)

    def close() -> None:
        opening_postgresql.release(conn)
        if owns_engine:
            _dispose(engine)

    runner = OwnedRunner(conn, clock, uuid_factory, target=schema_place, backend=backend_for(conn))
    runner.session_setup = opening_postgresql.session_setup(timeout_ms)
    runner._prepared_driver = conn.connection.dbapi_connection  # prepared by connect()
    return SchedulerStore(runner, clock=clock, uuid_factory=uuid_factory, on_close=close)
