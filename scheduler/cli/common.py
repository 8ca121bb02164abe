"""What every command shares: option types, database resolution, read-only access, output, errors.

Exit codes: 0 ok; 1 a failure (verification failed, not found, refused database, conflict);
2 a usage error (bad option, or an argument the store rejects as ``SCHEDULER_INVALID_ARGUMENT``).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import shlex
import sqlite3
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar
from urllib.parse import quote

import typer
from rich.console import Console
from rich.table import Table
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from scheduler.cli import pg_target
from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema.catalog import list_user_tables, read_pragma_int
from scheduler.schema.ddl import SCHEDULER_APPLICATION_ID, SCHEDULER_STORE_SCHEMA_VERSION
from scheduler.schema.upgrade import inspect_database
from scheduler.store import SchedulerStore, default_database_path, open_store
from scheduler.store.failures import find_contention_code, find_storage_failure_code, storage_unavailable
from scheduler.store.opening import parse_url
from scheduler.store.records import Record

log = logging.getLogger("scheduler.cli")

DATABASE_ENV = "SCHEDULER_DATABASE_URL"
EXIT_FAILURE = 1
EXIT_USAGE = 2

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help=f"Database file path, sqlite:/// URL or postgresql+psycopg:// URL (default: ${DATABASE_ENV}, "
        "else $SCHEDULER_HOME/kernel-v1.sqlite, SCHEDULER_HOME defaulting to ~/.scheduler).",
        show_default=False,
    ),
]
SchemaOption = Annotated[
    str | None,
    typer.Option(
        "--schema",
        help="PostgreSQL: the schema of the scheduler's tables (default scheduler). With --sql on "
        "SQLite: the attached database the script addresses (default main).",
        show_default=False,
    ),
]
CommandSchemaOption = Annotated[
    str | None,
    typer.Option(
        "--schema",
        help="PostgreSQL: the schema of the scheduler's tables (default: the global --schema, "
        "else scheduler). A SQLite file has only main.",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
LimitOption = Annotated[
    int, typer.Option("--limit", min=1, max=1000, help="At most this many rows (1..1000).")
]
StoreLimitOption = Annotated[
    int, typer.Option("--limit", min=1, max=200, help="At most this many rows (1..200, the store's bound).")
]

P = ParamSpec("P")
R = TypeVar("R")


class CliFailure(Exception):
    """A command failure with its exit code and an optional error code for ``--json``."""

    def __init__(self, message: str, *, exit_code: int = EXIT_FAILURE, code: str = "CLI_FAILURE") -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.code = code


def not_found(kind: str, identifier: str) -> CliFailure:
    return CliFailure(f"{kind} not found: {identifier}", code="SCHEDULER_NOT_FOUND")


# ----------------------------------------------------------------- output


def console() -> Console:
    """The rich console of the current command (stdout)."""
    return Console(highlight=False, soft_wrap=False)


def new_table(*headers: str, title: str | None = None) -> Table:
    """A rich table whose cells fold instead of being cut, so ids can be copied whole."""
    table = Table(title=title)
    for header in headers:
        table.add_column(header, overflow="fold")
    return table


def emit_json(data: Any) -> None:
    typer.echo(json.dumps(data, ensure_ascii=False, indent=2, default=str))


def emit_listing(
    key: str, records: Sequence[Record], *, limit: int, as_json: bool, table: Callable[[], Any]
) -> None:
    """A list command's output: ``{key: [...], count, limit}`` as JSON, else the rich table."""
    if as_json:
        emit_json({key: [record.to_dict() for record in records], "count": len(records), "limit": limit})
    else:
        console().print(table())


def fmt_ms(value: int | None) -> str:
    """Epoch milliseconds as an ISO-8601 UTC timestamp (``-`` for ``None``)."""
    if value is None:
        return "-"
    return (
        datetime.fromtimestamp(value / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def compact(value: Any, width: int = 60) -> str:
    """A JSON value on one line, shortened for a table cell."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 1] + "…"


def _report_error(code: str, message: str, details: Any, as_json: bool) -> None:
    if as_json:
        emit_json({"error": {"code": code, "message": message, "details": details}})
    else:
        typer.echo(f"error: {code}: {message}", err=True)
        if details is not None:
            typer.echo(f"details: {json.dumps(details, ensure_ascii=False, default=str)}", err=True)


def command(function: Callable[P, R]) -> Callable[P, R]:
    """Turn library and CLI failures into a message and the documented exit code. A command that
    takes ``--db`` and has no ``--schema`` of its own is given one (:func:`_with_schema_option`)."""
    takes_schema_option = _lacks_schema_option(function)

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        as_json = bool(kwargs.get("as_json", False))
        schema = kwargs.pop("schema", None) if takes_schema_option else None
        token = _ROOT_SCHEMA.set(str(schema)) if schema is not None else None
        try:
            return function(*args, **kwargs)
        except CliFailure as failure:
            _report_error(failure.code, failure.message, None, as_json)
            raise typer.Exit(failure.exit_code) from failure
        except pg_target.PgTargetError as failure:
            _report_error(failure.code, failure.message, None, as_json)
            raise typer.Exit(EXIT_USAGE if failure.usage else EXIT_FAILURE) from failure
        except SchedulerKernelError as error:
            log.debug("command failed", exc_info=True)
            _report_error(error.code, error.message, error.details, as_json)
            usage = error.code == "SCHEDULER_INVALID_ARGUMENT"
            raise typer.Exit(EXIT_USAGE if usage else EXIT_FAILURE) from error
        except DBAPIError as error:
            log.debug("database error", exc_info=True)
            storage_code = find_storage_failure_code(error) or find_contention_code(error)
            code = "SCHEDULER_STORAGE_UNAVAILABLE" if storage_code else "CLI_DATABASE_ERROR"
            details = {"storageCode": storage_code} if storage_code else None
            _report_error(code, f"database error: {error.orig}", details, as_json)
            raise typer.Exit(EXIT_FAILURE) from error
        finally:
            if token is not None:
                _ROOT_SCHEMA.reset(token)

    if takes_schema_option:
        _with_schema_option(wrapper, function)
    return wrapper


def _lacks_schema_option(function: Callable[..., Any]) -> bool:
    """A command that takes ``--db`` and has no ``--schema`` parameter of its own."""
    parameters = inspect.signature(function).parameters
    return "db" in parameters and "schema" not in parameters


def _with_schema_option(wrapper: Callable[..., Any], function: Callable[..., Any]) -> None:
    """Give ``wrapper`` (Typer reads its signature) a ``--schema`` option after ``--db``: the
    global ``scheduler --schema`` works as well, as ``--db`` does (the command's own wins)."""
    signature = inspect.signature(function)
    hints = typing.get_type_hints(function, include_extras=True)
    keyword = inspect.Parameter.KEYWORD_ONLY  # Typer passes every value by name
    parameters = [
        parameter.replace(kind=keyword, annotation=hints.get(parameter.name, parameter.annotation))
        for parameter in signature.parameters.values()
    ]
    after_db = [parameter.name for parameter in parameters].index("db") + 1
    schema = inspect.Parameter("schema", keyword, default=None, annotation=CommandSchemaOption)
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*parameters[:after_db], schema, *parameters[after_db:]]
    )
    wrapper.__annotations__ = {**hints, "schema": CommandSchemaOption}


# ----------------------------------------------------------------- database resolution


_ROOT_DB: ContextVar[str | None] = ContextVar("scheduler_cli_root_db", default=None)
_ROOT_SCHEMA: ContextVar[str | None] = ContextVar("scheduler_cli_root_schema", default=None)


def set_root_db(db: str | None, schema: str | None = None) -> None:
    """Remember the global ``scheduler --db`` and ``--schema`` of the current invocation."""
    _ROOT_DB.set(db)
    _ROOT_SCHEMA.set(schema)


def resolve_schema(schema: str | None = None) -> str | None:
    """The schema to use: the command's own ``--schema``, else the global one (``None``: the default)."""
    return schema if schema is not None else _ROOT_SCHEMA.get()


def sqlite_schema(schema: str | None) -> None:
    """Online commands on a SQLite file address its ``main`` database only."""
    if schema not in (None, "main"):
        raise _usage("--schema names a PostgreSQL schema (on SQLite it applies only to --sql scripts)")


def explicit_db(db: str | None) -> str | None:
    """``--db`` as given on the command line (the command's, then the global one), else ``None``."""
    return db or _ROOT_DB.get()


def resolve_target(db: str | None) -> str:
    """The database to use: ``--db`` (command, then global), ``$SCHEDULER_DATABASE_URL``, default path."""
    chosen = db or _ROOT_DB.get() or os.environ.get(DATABASE_ENV) or str(default_database_path())
    log.debug("database target: %s", chosen)
    if "://" in chosen:
        try:
            parse_url(chosen)
        except SchedulerKernelError as error:
            raise _usage(f"--db is not a valid database URL: {error.__cause__}") from error
    return chosen


def _usage(message: str) -> CliFailure:
    return CliFailure(message, exit_code=EXIT_USAGE, code="CLI_USAGE")


def database_file(target: str) -> Path:
    """The SQLite file behind a path or ``sqlite://`` URL (usage error for anything else)."""
    database: str | None = target
    if "://" in target:
        url = make_url(target)
        if url.get_backend_name() != "sqlite":
            raise _usage("only SQLite and PostgreSQL (postgresql+psycopg://) databases are supported")
        database = url.database
    if database in (None, "", ":memory:"):
        raise _usage("an in-memory database has nothing to inspect")
    return Path(str(database)).expanduser().resolve()


def describe_target(target: str) -> str:
    """A database as output names it: a PostgreSQL URL without its password, with the schema."""
    if pg_target.is_postgresql(target):
        return pg_target.label(make_url(target), resolve_schema() or "scheduler")
    return target


def cli_invocation(target: str) -> str:
    """``scheduler --db … [--schema …]`` naming the database ``target`` (and the chosen schema), for
    hints to copy; a PostgreSQL URL's password is shown as ``***``."""
    shown = target
    if pg_target.is_postgresql(target):
        shown = make_url(target).render_as_string(hide_password=True)
    words = ["scheduler", "--db", shlex.quote(shown)]
    schema = resolve_schema()
    if schema is not None:
        words += ["--schema", shlex.quote(schema)]
    return " ".join(words)


def require_database(db: str | None) -> None:
    """A write command acts on an existing database: it never creates one (exit 1 otherwise)."""
    target = resolve_target(db)
    if pg_target.is_postgresql(target):
        pg_target.require_existing(target, resolve_schema())
    else:
        existing_file(target)


def existing_file(target: str) -> Path:
    path = database_file(target)
    if not path.is_file():
        raise CliFailure(f"no database at {path} (run `scheduler init`)", code="SCHEDULER_NOT_FOUND")
    return path


# ----------------------------------------------------------------- read-only access


def readonly_engine(path: Path, *, immutable: bool = False) -> Engine:
    """An engine whose connections open ``file:PATH?mode=ro``: SQLite refuses every write.

    A reader of a WAL database may create the ``-wal``/``-shm`` sidecars; they are created
    owner-only. The database file itself is never written. ``immutable`` adds ``immutable=1``
    (no locks, no WAL): only for :func:`readonly_connection`'s read-only-media fallback.
    """
    uri = f"file:{quote(str(path))}?mode=ro" + ("&immutable=1" if immutable else "")

    def connect() -> sqlite3.Connection:
        previous = os.umask(0o077)
        try:
            connection = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        finally:
            os.umask(previous)
        connection.execute("PRAGMA query_only = ON")
        connection.execute("PRAGMA trusted_schema = OFF")
        return connection

    return create_engine("sqlite+pysqlite://", creator=connect, poolclass=NullPool)


_UNSHARED_SIDECARS = ("-wal", "-journal")
"""Sidecars that may hold committed data the main file does not (yet) have."""


def _file_state(path: Path) -> tuple[object, ...]:
    info = os.stat(path)
    sidecars = tuple(os.path.lexists(f"{path}{suffix}") for suffix in _UNSHARED_SIDECARS)
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, *sidecars)


def _needs_immutable_read(path: Path) -> bool:
    """Whether only an ``immutable=1`` read can read this file, and such a read is correct.

    True when the directory cannot be written (read-only media, or a directory this user may
    not write), so SQLite cannot create the ``-shm`` a WAL database needs and ``mode=ro`` fails
    with ``SQLITE_CANTOPEN``/``SQLITE_READONLY``, and no ``-wal``/``-journal`` lies beside the
    file, so the main file holds every committed write. With such a sidecar present the read is
    refused (``SCHEDULER_STORAGE_UNAVAILABLE``): ``immutable`` would ignore committed data.
    """
    if os.access(path.parent, os.W_OK):
        return False
    probe = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    try:
        probe.execute("SELECT count(*) FROM sqlite_master").fetchall()
        return False
    except sqlite3.Error as error:
        name = str(getattr(error, "sqlite_errorname", ""))
        if not name.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY")):
            return False  # not a read-only-media problem: the command reports it
        if any(os.path.lexists(f"{path}{suffix}") for suffix in _UNSHARED_SIDECARS):
            raise _sidecar_on_readonly_media(path, find_storage_failure_code(error) or name) from error
        return True
    finally:
        probe.close()


def _sidecar_on_readonly_media(path: Path, storage_code: str) -> SchedulerKernelError:
    error = storage_unavailable(phase="open", storage_code=storage_code, commit_state="not_committed")
    error.message = (
        f"{path} cannot be read here: its directory is not writable and a -wal/-journal beside it "
        "may hold committed writes; copy the database with its sidecars to writable storage"
    )
    error.args = (error.message,)
    return error


def stored_journal_mode(path: Path, reported: str) -> str:
    """The journal mode of the file: ``wal`` when its header says so (an ``immutable=1`` reader
    reports ``delete`` for a WAL database), else what the connection ``reported``."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(20)
    except OSError:
        return reported
    wal_format = len(header) == 20 and header[18] == 2 and header[19] == 2
    return "wal" if wal_format else reported


def _changed_while_read(path: Path) -> SchedulerKernelError:
    error = storage_unavailable(
        phase="read", storage_code="SQLITE_BUSY", commit_state="not_committed", retryable=True
    )
    error.message = (
        f"{path} changed while it was read without locks (read-only directory): the output above "
        "may be inconsistent; run the command again"
    )
    error.args = (error.message,)
    return error


@contextmanager
def readonly_connection(target: str) -> Iterator[tuple[Path, Connection]]:
    """A read-only connection inside one deferred read transaction (one consistent snapshot).

    On read-only media (a directory SQLite cannot create the ``-shm`` in) a WAL database cannot
    be opened with ``mode=ro``; when no ``-wal``/``-journal`` is beside it the main file is read
    with ``immutable=1`` instead, and afterwards the command fails (exit 1,
    ``SCHEDULER_STORAGE_UNAVAILABLE``, retryable) if the file or its sidecars changed meanwhile
    (a writer elsewhere, which ``immutable`` would not have seen).

    The snapshot is ended with ROLLBACK: it has nothing to commit, and on a damaged file SQLite's
    COMMIT can fail ("database disk image is malformed") after every read succeeded, which would
    throw away what the command found.
    """
    path = existing_file(target)
    immutable = _needs_immutable_read(path)
    before = _file_state(path) if immutable else None
    engine = readonly_engine(path, immutable=immutable)
    try:
        with engine.connect() as connection:
            snapshot = connection.begin()
            connection.exec_driver_sql("BEGIN")
            try:
                yield path, connection
            finally:
                with suppress(DBAPIError):
                    snapshot.rollback()
    finally:
        engine.dispose()
    if before is not None and _file_state(path) != before:
        raise _changed_while_read(path)


def require_current_schema(connection: Connection, path: Path) -> None:
    """Refuse anything but a scheduler database at the current schema version."""
    application_id = read_pragma_int(connection, "application_id")
    version = read_pragma_int(connection, "user_version")
    if application_id == 0 and not list_user_tables(connection):
        raise CliFailure(f"{path} is empty (run `scheduler init`)", code="SCHEDULER_SCHEMA_UNKNOWN")
    if application_id != SCHEDULER_APPLICATION_ID:
        if "migrations" in list_user_tables(connection) and _shared_file_version(connection) > 0:
            raise CliFailure(
                f"{path} holds the scheduler's tables beside another application's (a shared file, "
                "docs/embedding.md): the CLI reads dedicated scheduler files and PostgreSQL schemas; "
                "open a shared file from Python with open_store(path, exclusive=False)",
                code="SCHEDULER_SCHEMA_UNKNOWN",
            )
        raise CliFailure(
            f"{path} is not a scheduler database (run `scheduler verify`)", code="SCHEDULER_SCHEMA_UNKNOWN"
        )
    if version != SCHEDULER_STORE_SCHEMA_VERSION:
        raise CliFailure(
            f"{path} is at schema v{version}, not v{SCHEDULER_STORE_SCHEMA_VERSION} "
            "(run `scheduler upgrade`)",
            code="SCHEDULER_SCHEMA_UNKNOWN",
        )


def _shared_file_version(connection: Connection) -> int:
    """The scheduler's schema version in a file shared with an application (0: none there)."""
    try:
        return inspect_database(connection, exclusive=False)
    except SchedulerKernelError:
        return 0


@contextmanager
def read_store(db: str | None) -> Iterator[SchedulerStore]:
    """A store for read commands: read-only file (PostgreSQL: a read-only snapshot transaction),
    current schema, never creates or upgrades."""
    target, schema = resolve_target(db), resolve_schema()
    if pg_target.is_postgresql(target):
        with pg_target.readonly_connection(target, schema) as (name, connection, where):
            problem = pg_target.current_schema_problem(connection, where, name)
            if problem is not None:
                raise problem
            store = SchedulerStore.on_connection(connection, schema=where.schema)
            try:
                yield store
            finally:
                store.close()
        return
    sqlite_schema(schema)
    with readonly_connection(target) as (path, connection):
        require_current_schema(connection, path)
        store = SchedulerStore.on_connection(connection)
        try:
            yield store
        finally:
            store.close()


@contextmanager
def write_store(db: str | None) -> Iterator[SchedulerStore]:
    """A store for write commands (``open_store``: creates or upgrades to the current schema)."""
    target, schema = resolve_target(db), resolve_schema()
    if not pg_target.is_postgresql(target):
        sqlite_schema(schema)
        schema = None
    with open_store(target, schema=schema) as store:
        yield store


_VERBOSE_HANDLER = logging.StreamHandler()
_VERBOSE_HANDLER.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))


def configure_logging(verbose: bool) -> None:
    """``--verbose``: debug logs of the ``scheduler`` loggers on stderr (installed once)."""
    if verbose:
        _VERBOSE_HANDLER.setStream(sys.stderr)
        logger = logging.getLogger("scheduler")
        if _VERBOSE_HANDLER not in logger.handlers:
            logger.addHandler(_VERBOSE_HANDLER)
        logger.setLevel(logging.DEBUG)
