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
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from sqlalchemy import Connection
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from scheduler.backends import backend_named, is_supported
from scheduler.cli import pg_target
from scheduler.cli.readonly import readonly_snapshot
from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema.catalog import list_user_tables, read_pragma_int
from scheduler.schema.ddl import SCHEDULER_APPLICATION_ID, SCHEDULER_STORE_SCHEMA_VERSION
from scheduler.schema.sqlite_file import NOT_A_DATABASE, is_stray_file
from scheduler.schema.upgrade import inspect_database
from scheduler.store import SchedulerStore, default_database_path, open_store
from scheduler.store.opening import parse_url
from scheduler.store.plumbing.failures import find_contention_code, find_storage_failure_code
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
SharedOption = Annotated[
    bool,
    typer.Option(
        "--shared",
        help="SQLite: the file is shared with an application (open_store(path, exclusive=False)): the "
        "scheduler's tables beside the application's. Detected for a file that already holds them; "
        "needed to create them in an application's file, or to leave a dedicated file's journal "
        "mode alone (the kernel file of the attached layout).",
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

    def __init__(
        self, message: str, *, exit_code: int = EXIT_FAILURE, code: str = "CLI_FAILURE", details: Any = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.code = code
        self.details = details


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
    takes ``--db`` and lacks ``--schema`` or ``--shared`` of its own is given them
    (:func:`_with_database_options`)."""
    injected = _missing_database_options(function)

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        as_json = bool(kwargs.get("as_json", False))
        schema = kwargs.pop("schema", None) if "schema" in injected else None
        shared = bool(kwargs.pop("shared", False)) if "shared" in injected else False
        schema_token = _ROOT_SCHEMA.set(str(schema)) if schema is not None else None
        shared_token = _ROOT_SHARED.set(True) if shared else None
        try:
            return function(*args, **kwargs)
        except CliFailure as failure:
            _report_error(failure.code, failure.message, failure.details, as_json)
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
            if schema_token is not None:
                _ROOT_SCHEMA.reset(schema_token)
            if shared_token is not None:
                _ROOT_SHARED.reset(shared_token)

    if injected:
        _with_database_options(wrapper, function, injected)
    return wrapper


def _missing_database_options(function: Callable[..., Any]) -> list[str]:
    """``schema``/``shared``: the options a command that takes ``--db`` has no parameter for."""
    parameters = inspect.signature(function).parameters
    if "db" not in parameters:
        return []
    return [name for name in ("schema", "shared") if name not in parameters]


def _with_database_options(
    wrapper: Callable[..., Any], function: Callable[..., Any], names: list[str]
) -> None:
    """Give ``wrapper`` (Typer reads its signature) the ``--schema``/``--shared`` options it lacks,
    after ``--db``: the global ``scheduler --schema``/``--shared`` work as well, as ``--db`` does
    (the command's own wins)."""
    signature = inspect.signature(function)
    hints = typing.get_type_hints(function, include_extras=True)
    keyword = inspect.Parameter.KEYWORD_ONLY  # Typer passes every value by name
    parameters = [
        parameter.replace(kind=keyword, annotation=hints.get(parameter.name, parameter.annotation))
        for parameter in signature.parameters.values()
    ]
    after_db = [parameter.name for parameter in parameters].index("db") + 1
    annotations = {"schema": CommandSchemaOption, "shared": SharedOption}
    defaults: dict[str, Any] = {"schema": None, "shared": False}
    added = [
        inspect.Parameter(name, keyword, default=defaults[name], annotation=annotations[name])
        for name in names
    ]
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*parameters[:after_db], *added, *parameters[after_db:]]
    )
    wrapper.__annotations__ = {**hints, **{name: annotations[name] for name in names}}


# ----------------------------------------------------------------- database resolution


_ROOT_DB: ContextVar[str | None] = ContextVar("scheduler_cli_root_db", default=None)
_ROOT_SCHEMA: ContextVar[str | None] = ContextVar("scheduler_cli_root_schema", default=None)
_ROOT_SHARED: ContextVar[bool] = ContextVar("scheduler_cli_root_shared", default=False)


def set_root_db(db: str | None, schema: str | None = None, shared: bool = False) -> None:
    """Remember the global ``scheduler --db``, ``--schema`` and ``--shared`` of the current invocation."""
    _ROOT_DB.set(db)
    _ROOT_SCHEMA.set(schema)
    _ROOT_SHARED.set(shared)


def shared_requested() -> bool:
    """Whether ``--shared`` (the command's or the global one) was given."""
    return _ROOT_SHARED.get()


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
        name = url.get_backend_name()
        if not is_supported(name) or backend_named(name).own_schema:
            raise _usage("only SQLite and PostgreSQL (postgresql+psycopg://) databases are supported")
        database = url.database
    if database in (None, "", ":memory:"):
        raise _usage("an in-memory database has nothing to inspect")
    return Path(str(database)).expanduser().resolve()


def describe_target(target: str) -> str:
    """A database as output names it: a PostgreSQL URL without its password, with the schema."""
    if pg_target.has_own_schema(target):
        return pg_target.label(make_url(target), resolve_schema() or "scheduler")
    return target


def cli_invocation(target: str) -> str:
    """``scheduler --db … [--schema …]`` naming the database ``target`` (and the chosen schema), for
    hints to copy; a PostgreSQL URL's password is shown as ``***``."""
    shown = target
    if pg_target.has_own_schema(target):
        shown = make_url(target).render_as_string(hide_password=True)
    words = ["scheduler", "--db", shlex.quote(shown)]
    schema = resolve_schema()
    if schema is not None:
        words += ["--schema", shlex.quote(schema)]
    return " ".join(words)


def require_database(db: str | None) -> None:
    """A write command acts on an existing database: it never creates one (exit 1 otherwise)."""
    target = resolve_target(db)
    if pg_target.has_own_schema(target):
        pg_target.require_existing(target, resolve_schema())
    else:
        existing_file(target)


def existing_file(target: str) -> Path:
    path = database_file(target)
    if not path.is_file():
        raise CliFailure(f"no database at {path} (run `scheduler init`)", code="SCHEDULER_NOT_FOUND")
    return path


# ----------------------------------------------------------------- read-only access


@contextmanager
def readonly_connection(target: str) -> Iterator[tuple[Path, Connection]]:
    """``(path, connection)``: the existing SQLite file of ``target`` read inside one deferred read
    transaction, never written (:func:`scheduler.cli.readonly.readonly_snapshot`)."""
    path = existing_file(target)
    with readonly_snapshot(path) as connection:
        yield path, connection


# ----------------------------------------------------------------- SQLite layouts


def file_is_shared(connection: Connection) -> bool:
    """Whether a SQLite file holds the scheduler's tables beside an application's (API §8,
    ``exclusive=False``): ``--shared`` was given, or the file is not the scheduler's own (its
    ``application_id`` is not the scheduler's) and a ``migrations`` history of the scheduler's
    is in it. A dedicated file, an empty one or a foreign one is not."""
    if shared_requested():
        return True
    try:
        if read_pragma_int(connection, "application_id") == SCHEDULER_APPLICATION_ID:
            return False
        return "migrations" in list_user_tables(connection) and _shared_file_version(connection) > 0
    except DBAPIError:  # not a readable database: the command reports what it finds
        return False


def target_is_shared(target: str) -> bool:
    """:func:`file_is_shared` for a SQLite ``--db`` (read-only; a missing file: ``--shared``)."""
    if shared_requested():
        return True
    path = database_file(target)
    if not path.is_file():
        return False
    with readonly_snapshot(path) as connection:
        return file_is_shared(connection)


def refuse_stray_file(path: Path) -> None:
    """A stray 1-byte file, which SQLite reads as an empty database, is reported as SQLite reports
    any other file that is not a database (``CLI_DATABASE_ERROR``)."""
    if is_stray_file(path):
        raise CliFailure(f"database error: {NOT_A_DATABASE}", code="CLI_DATABASE_ERROR")


def require_current_schema(connection: Connection, path: Path) -> None:
    """Refuse anything but a scheduler database at the current schema version (a dedicated file,
    or a shared one whose ``migrations`` history is at the current version)."""
    refuse_stray_file(path)
    if file_is_shared(connection):
        version = inspect_database(connection, exclusive=False)
        if version == 0:
            raise CliFailure(
                f"{path} holds no scheduler tables (run `scheduler init --shared`)",
                code="SCHEDULER_SCHEMA_UNKNOWN",
            )
        if version != SCHEDULER_STORE_SCHEMA_VERSION:
            raise _behind(path, version)
        return
    application_id = read_pragma_int(connection, "application_id")
    version = read_pragma_int(connection, "user_version")
    if application_id == 0 and not list_user_tables(connection):
        raise CliFailure(f"{path} is empty (run `scheduler init`)", code="SCHEDULER_SCHEMA_UNKNOWN")
    if application_id != SCHEDULER_APPLICATION_ID:
        raise CliFailure(
            f"{path} is not a scheduler database (run `scheduler verify`; for an application's "
            "file, `scheduler init --shared` creates the scheduler's tables beside its own)",
            code="SCHEDULER_SCHEMA_UNKNOWN",
        )
    if version != SCHEDULER_STORE_SCHEMA_VERSION:
        raise _behind(path, version)


def _behind(path: Path, version: int) -> CliFailure:
    return CliFailure(
        f"{path} is at schema v{version}, not v{SCHEDULER_STORE_SCHEMA_VERSION} (run `scheduler upgrade`)",
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
    current schema, never creates or upgrades. SQLite: a dedicated or a shared file."""
    target, schema = resolve_target(db), resolve_schema()
    if pg_target.has_own_schema(target):
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
def write_store(db: str | None, *, default_schema: str | None = None) -> Iterator[SchedulerStore]:
    """A store for write commands (``open_store``: creates or upgrades to the current schema);
    a shared SQLite file (:func:`target_is_shared`) is opened with ``exclusive=False``.
    ``default_schema``: the PostgreSQL schema when ``--schema`` names none (else ``scheduler``)."""
    target, schema = resolve_target(db), resolve_schema()
    if pg_target.has_own_schema(target):
        schema = schema or default_schema
        with open_store(target, schema=schema) as store:
            yield store
        return
    sqlite_schema(schema)
    with open_store(target, exclusive=not target_is_shared(target)) as store:
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
