"""The SQLAlchemy and psycopg internals the store reads, all in ``library_internals``.

* Each internal, on the installed version, exists and means what the store assumes: checked
  against what SQLAlchemy's or psycopg's public behaviour shows on a real SQLite file or the
  real PostgreSQL server.
* The quarantine fails closed: on an untested minor version, when forced, or when its self-check
  fails, every function raises ``InternalsUnavailable`` and the store takes the public path,
  with identical results (the lifecycle workload and every recorded trace, on both backends).
* No module of the package but ``library_internals`` reads a private attribute of a library
  object (an AST scan with an allow-list of the project's own private names).

CI runs this file on the oldest and the newest supported SQLAlchemy and psycopg (``.ci/run``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import logging
import os
import pkgutil
import re
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import pytest
import sqlalchemy
from backends import POSTGRESQL, SQLITE, PostgresServer, sqlite_engine, unique_name
from fastpath_support import Clock, workload
from recorded import TRACES
from replay import REPLAY_BACKENDS, NotApplicable, replay
from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    DateTime,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    TypeDecorator,
    bindparam,
    create_engine,
    event,
    insert,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import TextClause

import scheduler
import scheduler.backends
import scheduler.store
from scheduler import open_store
from scheduler.store.plumbing import library_internals as internals
from scheduler.store.plumbing import statement_plans
from scheduler.store.plumbing.library_internals import InternalsUnavailable
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.testing import dump_tables

TESTS: Final = Path(__file__).resolve().parent
PACKAGE: Final = Path(scheduler.__file__).resolve().parent
QUARANTINE: Final = PACKAGE / "store" / "plumbing" / "library_internals.py"


def psycopg_dialect() -> Dialect:
    return postgresql.psycopg.dialect()  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def public_path() -> Iterator[None]:
    """The quarantine forced closed for the test (as ``SCHEDULER_PUBLIC_PATH=1`` does)."""
    before = internals.public_path_forced()
    internals.force_public_path(True)
    try:
        yield
    finally:
        internals.force_public_path(before)


def compiled(statement: Any, dialect: Dialect | None = None, **kwargs: Any) -> SQLCompiler:
    result = statement.compile(dialect=dialect or sqlite.dialect(), **kwargs)
    assert isinstance(result, SQLCompiler)
    return result


def hot_statements() -> dict[str, Prepared]:
    """Every module-level ``Prepared`` of the store and its backends, by dotted name."""
    found: dict[int, tuple[str, Prepared]] = {}
    for package in (scheduler.store, scheduler.backends):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if isinstance(value, Prepared):
                    found.setdefault(id(value), (f"{info.name}.{name}", value))
    return dict(found.values())


class Shout(TypeDecorator[str]):
    """A type whose binds SQLAlchemy converts (upper case) before the driver gets them."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else value.upper()


# -- versions and failing closed -----------------------------------------------------------------


def test_the_installed_sqlalchemy_is_a_tested_version() -> None:
    """A CI run on a minor version not in ``TESTED_ON`` fails here rather than quietly testing
    only the public path: check the internals on it, then add it."""
    assert internals.tested("sqlalchemy", sqlalchemy.__version__), sqlalchemy.__version__
    assert internals.sqlalchemy_available()


def test_the_installed_psycopg_is_a_tested_version(postgres_server: PostgresServer) -> None:
    import psycopg

    assert internals.tested("psycopg", psycopg.__version__), psycopg.__version__
    assert internals.psycopg_available()


def test_minor_versions_are_compared_as_major_dot_minor() -> None:
    assert internals.minor_version("2.0.28") == "2.0"
    assert internals.minor_version("2.1.0b2") == "2.1"
    assert internals.tested("sqlalchemy", "2.0.0") and internals.tested("sqlalchemy", "2.1.9")
    assert not internals.tested("sqlalchemy", "2.2.0") and not internals.tested("sqlalchemy", "1.4.54")
    assert internals.tested("psycopg", "3.2.1") and internals.tested("psycopg", "3.3.9")
    assert not internals.tested("psycopg", "3.1.20") and not internals.tested("psycopg", "3.4.0")
    assert not internals.tested("asyncpg", "0.30.0")  # none of its internals is read


def sqlalchemy_calls() -> list[tuple[str, Callable[[], Any]]]:
    """Each SQLAlchemy function of the quarantine, called on real arguments."""
    engine = sqlite_engine(":memory:")
    conn = engine.connect()
    table = Table("t", MetaData(), Column("a", Integer, primary_key=True))
    plain = compiled(select(table.c.a).where(table.c.a == bindparam("p")))
    return [
        ("connection_supported", lambda: internals.connection_supported(conn)),
        ("observed", lambda: internals.observed(conn, conn.dialect)),
        ("bind_processors", lambda: internals.bind_processors(plain)),
        ("result_columns", lambda: internals.result_columns(plain)),
        ("result_processor", lambda: internals.result_processor(Integer(), conn.dialect)),
        ("inserts_many_values", lambda: internals.inserts_many_values(plain)),
        ("collects_params", lambda: internals.collects_params(plain)),
        ("locks_rows", lambda: internals.locks_rows(select(table.c.a))),
    ]


def every_sqlalchemy_function_refuses() -> None:
    for name, call in sqlalchemy_calls():
        with pytest.raises(InternalsUnavailable):
            call()
        assert name  # (the name shows in the traceback of a function that answered)


def test_every_function_answers_on_the_installed_version() -> None:
    for _name, call in sqlalchemy_calls():
        call()


def test_forcing_the_public_path_closes_every_function(tmp_path: Path, public_path: None) -> None:
    every_sqlalchemy_function_refuses()
    assert not internals.psycopg_available()
    with pytest.raises(InternalsUnavailable):
        internals.psycopg_prepared_count(object())
    store = open_store(tmp_path / "public.sqlite")
    try:
        assert store._runner.fastpath is None  # type: ignore[attr-defined]
    finally:
        store.close()


def test_an_untested_sqlalchemy_minor_version_closes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlalchemy, "__version__", "2.2.0")
    every_sqlalchemy_function_refuses()
    assert (
        statement_plans.compile_plan(
            Prepared(select(Table("t", MetaData(), Column("a", Integer)).c.a)), sqlite.dialect(), None, False
        )
        is None
    )
    store = open_store(tmp_path / "untested.sqlite")
    try:
        assert store._runner.fastpath is None  # type: ignore[attr-defined]
    finally:
        store.close()


def test_an_untested_psycopg_minor_version_closes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """(psycopg's version as a module would report it: this runs without psycopg installed too.)"""
    monkeypatch.setitem(sys.modules, "psycopg", types.SimpleNamespace(__version__="3.4.0"))
    assert not internals.psycopg_available()
    with pytest.raises(InternalsUnavailable):
        internals.psycopg_prepared_count(object())
    with pytest.raises(InternalsUnavailable):
        internals.forget_psycopg_prepared(object())
    monkeypatch.setitem(sys.modules, "psycopg", types.SimpleNamespace(__version__="3.3.0"))
    assert internals.psycopg_available()
    with pytest.raises(InternalsUnavailable):  # a tested version, but no PrepareManager
        internals.psycopg_prepared_count(object())


def test_a_failed_self_check_closes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SQLAlchemy whose compiler no longer converts a processing bind in ``_bind_processors``
    (a changed meaning, not a missing attribute) fails the once-per-process self-check."""
    monkeypatch.setattr(internals, "_self_check", None)
    monkeypatch.setattr(SQLCompiler, "_bind_processors", property(lambda _self: {}))
    assert not internals.sqlalchemy_available()
    every_sqlalchemy_function_refuses()


def test_the_environment_variable_forces_the_public_path(tmp_path: Path) -> None:
    code = (
        "from scheduler import open_store; "
        "from scheduler.store.plumbing import library_internals as li; "
        f"store = open_store({str(tmp_path / 'env.sqlite')!r}); "
        "print(li.public_path_forced(), store._runner.fastpath is None); store.close()"
    )
    env = {**os.environ, internals.PUBLIC_PATH_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


# -- SQLAlchemy internals: what each one means ---------------------------------------------------


def test_observed_sees_listeners_and_echo_as_sqlalchemy_dispatches_them(tmp_path: Path) -> None:
    """``_has_events``/``_echo``: true exactly when SQLAlchemy would dispatch an event or log a
    statement the fast path would send unseen."""
    engine = create_engine(f"sqlite:///{tmp_path / 'o.sqlite'}")
    seen: list[str] = []
    try:
        with engine.connect() as conn:
            assert internals.observed(conn, conn.dialect) is False
            event.listen(conn, "before_cursor_execute", lambda *args: seen.append(args[2]))
            assert internals.observed(conn, conn.dialect) is True
            conn.exec_driver_sql("SELECT 1")
            assert seen == ["SELECT 1"]
        with engine.connect() as conn:  # a listener on the engine reaches its new connections
            event.listen(engine, "before_cursor_execute", lambda *args: None)
            assert internals.observed(conn, conn.dialect) is True
    finally:
        engine.dispose()
    echoing = create_engine(f"sqlite:///{tmp_path / 'e.sqlite'}", echo=True)
    try:
        with echoing.connect() as conn:
            assert internals.observed(conn, conn.dialect) is True
    finally:
        echoing.dispose()
    quiet = create_engine(f"sqlite:///{tmp_path / 'l.sqlite'}")
    logger = logging.getLogger("sqlalchemy.engine.Engine")
    level = logger.level
    try:
        logger.setLevel(logging.INFO)  # logging configured to show statements: SQLAlchemy echoes
        with quiet.connect() as conn:
            assert internals.observed(conn, conn.dialect) is True
    finally:
        logger.setLevel(level)
        quiet.dispose()


def test_connection_supported_requires_every_connection_internal(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = sqlite_engine(":memory:")
    with engine.connect() as conn:
        internals.connection_supported(conn)
        monkeypatch.setattr(internals, "CONNECTION_INTERNALS", (*internals.CONNECTION_INTERNALS, "_renamed"))
        with pytest.raises(InternalsUnavailable):
            internals.connection_supported(conn)
    engine.dispose()


def duplicate_key_errors(conn: Connection, driver: Any, sql: str) -> tuple[BaseException, BaseException]:
    """The error SQLAlchemy raises for ``sql`` (``exec_driver_sql``), and the one
    ``raise_dbapi_error`` makes of the driver's own error for the same statement."""
    with pytest.raises(IntegrityError) as public:
        conn.exec_driver_sql(sql)
    conn.rollback()
    cursor = driver.cursor()
    try:
        cursor.execute(sql)
    except Exception as error:
        driver_error = error
    else:
        raise AssertionError("the statement did not fail")
    finally:
        cursor.close()
    with pytest.raises(IntegrityError) as quarantined:
        internals.raise_dbapi_error(conn, driver_error, sql, ())
    return public.value, quarantined.value


def assert_wrapped_alike(public: BaseException, quarantined: BaseException) -> None:
    assert type(public) is type(quarantined)
    assert type(public.orig) is type(quarantined.orig)  # type: ignore[attr-defined]
    assert str(public.orig) == str(quarantined.orig)  # type: ignore[attr-defined]
    assert quarantined.statement == public.statement  # type: ignore[attr-defined]


def test_a_driver_error_is_wrapped_as_connection_execute_wraps_it(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'e.sqlite'}")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE t (a INTEGER PRIMARY KEY)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
            conn.commit()
            driver = conn.connection.dbapi_connection
            assert_wrapped_alike(*duplicate_key_errors(conn, driver, "INSERT INTO t VALUES (1)"))
    finally:
        engine.dispose()


def test_a_psycopg_error_is_wrapped_as_connection_execute_wraps_it(
    private_engine: Engine, pg_schema: str
) -> None:
    with private_engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{pg_schema}"')
        conn.exec_driver_sql(f'CREATE TABLE "{pg_schema}".t (a INTEGER PRIMARY KEY)')
        conn.exec_driver_sql(f'INSERT INTO "{pg_schema}".t VALUES (1)')
        conn.commit()
        sql = f'INSERT INTO "{pg_schema}".t VALUES (1)'
        conn.begin()
        driver = conn.connection.dbapi_connection
        public, quarantined = duplicate_key_errors(conn, driver, sql)
        assert_wrapped_alike(public, quarantined)
        assert getattr(quarantined.orig, "sqlstate", None) == "23505"  # type: ignore[attr-defined]


def driver_parameters(engine: Engine, statement: Any, values: dict[str, Any]) -> Any:
    """The parameters SQLAlchemy's own execution hands the driver for ``statement``."""
    sent: list[Any] = []
    with engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", lambda *args: sent.append(args[3]))
        conn.execute(statement, values).all()
    return sent[0]


def converting_statement() -> Any:
    return select(
        bindparam("shout", type_=Shout()).label("s"),
        bindparam("plain", type_=Integer()).label("p"),
        bindparam("when", type_=DateTime()).label("w"),
    )


def check_bind_processors(engine: Engine) -> None:
    """``_bind_processors``: a bind with a processor reaches the driver as the processor returns
    it, one without reaches it unchanged; so a plan (no processors) binds what SQLAlchemy binds."""
    statement = converting_statement()
    values = {"shout": "quiet", "plain": 7, "when": datetime(2026, 1, 2, 3, 4, 5)}
    form = compiled(statement, engine.dialect)
    processors = internals.bind_processors(form)
    sent = driver_parameters(engine, statement, values)
    by_name = dict(zip(form.positiontup or (), sent, strict=True)) if form.positional else dict(sent)
    for name, value in values.items():
        processor = processors.get(name)
        assert by_name[name] == (value if processor is None else processor(value)), name
    assert processors["shout"]("quiet") == "QUIET"
    assert processors.get("plain") is None
    assert statement_plans.compile_plan(Prepared(statement), engine.dialect, None, False) is None


def test_bind_processors_convert_as_sqlalchemy_does_on_sqlite(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'b.sqlite'}")
    try:
        check_bind_processors(engine)
        # pysqlite gets a datetime as SQLAlchemy's string, made by the DateTime bind processor
        assert internals.bind_processors(compiled(converting_statement(), engine.dialect)).get("when")
    finally:
        engine.dispose()


def test_bind_processors_convert_as_sqlalchemy_does_on_psycopg(private_engine: Engine) -> None:
    check_bind_processors(private_engine)


@pytest.mark.parametrize("backend", [SQLITE, POSTGRESQL])
def test_result_columns_are_the_keys_of_sqlalchemys_results_for_every_statement_run(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``_result_columns``: for every statement the lifecycle workload runs through SQLAlchemy,
    the keys, in order, are ``Result.keys()`` (which a plan's rows are built with)."""
    checked: list[str] = []
    hot = list(hot_statements().values())
    assert not any(isinstance(prepared.statement, TextClause) for prepared in hot)  # (no compiled columns)

    def after_execute(
        conn: Connection, clause: Any, _multi: Any, _params: Any, _options: Any, result: Any
    ) -> None:
        form = result.context.compiled
        if not isinstance(form, SQLCompiler) or not result.returns_rows:
            return
        if isinstance(clause, TextClause):  # columns read from the driver: never a Prepared
            assert all(prepared.statement is not clause for prepared in hot), form.string
            return
        columns = internals.result_columns(form)
        assert [key for key, _type in columns] == list(result.keys()), form.string
        checked.append(form.string)

    clock = Clock()
    if backend == SQLITE:
        engine = create_engine(f"sqlite:///{tmp_path / 'r.sqlite'}")
        schema = None
    else:
        engine = create_engine(request.getfixturevalue("postgres_server").url)
        schema = unique_name("t_keys")
    store = open_store(engine, schema=schema, clock=clock, uuid_factory=clock.uuid)
    event.listen(store.connection, "after_execute", after_execute)  # (the fast path steps aside)
    try:
        workload(store, clock)
    finally:
        store.close()
        if schema is not None:
            request.getfixturevalue("postgres_server").drop_schema(schema)
        engine.dispose()
    assert len(set(checked)) >= 20


@pytest.mark.parametrize("dialect_name", [SQLITE, POSTGRESQL])
def test_result_processors_are_the_conversions_of_sqlalchemys_results(
    dialect_name: str, tmp_path: Path
) -> None:
    """``_cached_result_processor``: for a type that converts (SQLite's DateTime and Boolean,
    stored as text and integers) it turns the driver's value into the public result's; a hot
    statement returning such a column is left to SQLAlchemy."""
    dialect = sqlite.dialect() if dialect_name == SQLITE else psycopg_dialect()
    for name, prepared in hot_statements().items():
        try:
            form = compiled(prepared.statement, dialect)
        except sqlalchemy.exc.CompileError:
            continue  # PostgreSQL-only (the server clock)
        if any(internals.result_processor(kind, dialect) for _key, kind in internals.result_columns(form)):
            assert statement_plans.compile_plan(prepared, dialect, None, False) is None, name
    if dialect_name != SQLITE:
        return
    engine = create_engine(f"sqlite:///{tmp_path / 'd.sqlite'}")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (w TEXT, b INTEGER, n INTEGER)")
            conn.exec_driver_sql("INSERT INTO t VALUES ('2026-01-02 03:04:05.000000', 1, 7)")
            table = Table(
                "t", MetaData(), Column("w", DateTime()), Column("b", Boolean()), Column("n", Integer())
            )
            public = conn.execute(select(table)).one()
            raw = conn.exec_driver_sql("SELECT w, b, n FROM t").one()
        for index, kind in enumerate((DateTime(), Boolean(), Integer())):
            processor = internals.result_processor(kind, engine.dialect)
            converted = raw[index] if processor is None else processor(raw[index])
            assert converted == public[index] and type(converted) is type(public[index])
        assert type(public[0]) is datetime and public[1] is True and raw[1] == 1
        assert internals.result_processor(Integer(), engine.dialect) is None
    finally:
        engine.dispose()


def test_inserts_many_values_is_set_where_sqlalchemy_batches_an_executemany(tmp_path: Path) -> None:
    """``_insertmanyvalues``: an ``executemany`` of an INSERT … RETURNING goes out as SQLAlchemy's
    own multi-row statement (which a plan would not send); a plain one as the driver's
    ``executemany``."""
    table = Table("t", MetaData(), Column("a", Integer, primary_key=True), Column("b", String))
    engine = create_engine(f"sqlite:///{tmp_path / 'm.sqlite'}")
    rows = [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}, {"a": 3, "b": "z"}]
    try:
        with engine.begin() as conn:
            table.create(conn)
            sent: list[tuple[str, Any]] = []
            event.listen(conn, "before_cursor_execute", lambda *args: sent.append((args[2], args[3])))
            returning = insert(table).returning(table.c.a)
            assert conn.execute(returning, rows).all() == [(1,), (2,), (3,)]
            form = compiled(returning, engine.dialect, column_keys=["a", "b"], for_executemany=True)
            assert internals.inserts_many_values(form) is True
            ((sql, arguments),) = sent  # one statement of three rows, not the driver's executemany
            assert sql.count("(?, ?)") == 3 and arguments == (1, "x", 2, "y", 3, "z")
            sent.clear()
            plain = insert(table)
            conn.execute(plain, [{"a": 4, "b": "x"}, {"a": 5, "b": "y"}])
            ((sql, arguments),) = sent
            assert sql.count("(?, ?)") == 1 and arguments == [(4, "x"), (5, "y")]
            plain_form = compiled(plain, engine.dialect, column_keys=["a", "b"], for_executemany=True)
            assert not (plain_form.returning and internals.inserts_many_values(plain_form))
            select_form = compiled(select(table.c.a), engine.dialect)
            assert internals.inserts_many_values(select_form) is False
    finally:
        engine.dispose()


def test_collected_params_carry_the_values_a_statement_was_given() -> None:
    """``_collected_params`` (2.1): values given with ``.params()`` are in it, and a plan is then
    refused; on 2.0 they are the binds' own values, which a plan binds as constants."""
    table = Table("t", MetaData(), Column("a", Integer))
    statement = select(table.c.a).where(table.c.a == bindparam("x")).params(x=5)
    form = compiled(statement)
    plan = statement_plans.compile_plan(Prepared(statement), sqlite.dialect(), None, False)
    if internals.minor_version(sqlalchemy.__version__) == "2.0":
        assert internals.collects_params(form) is False
        assert plan is not None and plan.arguments({}) == (5,)
    else:
        assert internals.collects_params(form) is True
        assert plan is None
    assert internals.collects_params(compiled(select(table.c.a).where(table.c.a == bindparam("x")))) is False


_TOP_LEVEL_LOCK: Final = re.compile(
    r"FOR (?:UPDATE|SHARE|NO KEY UPDATE|KEY SHARE)(?: OF [\w\"., ]+?)?(?: NOWAIT| SKIP LOCKED)?$"
)


def test_locks_rows_is_the_row_lock_a_statement_renders() -> None:
    """``_for_update_arg``: set exactly for the hot statements whose PostgreSQL SQL ends with a
    row lock; a statement that locks only inside a ``WITH`` declares ``locks`` itself."""
    dialect = psycopg_dialect()
    statements = hot_statements()
    assert len(statements) >= 30
    for name, prepared in statements.items():
        sql = compiled(prepared.statement, dialect).string
        assert internals.locks_rows(prepared.statement) == bool(_TOP_LEVEL_LOCK.search(sql)), name
        if " FOR UPDATE" in sql or " FOR SHARE" in sql:
            assert prepared.locks, name


# -- psycopg's prepared-statement cache ----------------------------------------------------------


def server_prepared(cursor: Any) -> set[str]:
    cursor.execute("SELECT name FROM pg_prepared_statements", prepare=False)
    return {row[0] for row in cursor.fetchall()}


def test_psycopg_forgets_its_prepared_statements_and_deallocates_nothing(
    postgres_server: PostgresServer,
) -> None:
    """``Connection._prepared``: what psycopg prepared is counted in ``_names``; once forgotten,
    its ``rollback()`` sends no ``DEALLOCATE ALL`` (a statement the store named survives), where
    without forgetting the same rollback deallocates everything."""
    import psycopg

    dsn = postgres_server.url.set(drivername="postgresql").render_as_string(hide_password=False)
    for forget in (False, True):
        with psycopg.connect(dsn) as driver:
            cursor = driver.cursor()
            cursor.execute("SELECT %s::int", (1,), prepare=True)
            assert internals.psycopg_prepared_count(driver) == 1
            (psycopg_name,) = server_prepared(cursor)
            cursor.execute("PREPARE scheduler_test AS SELECT 2", prepare=False)
            if forget:
                internals.forget_psycopg_prepared(driver)
                driver.prepare_threshold = None
                assert internals.psycopg_prepared_count(driver) == 0
            driver.rollback()
            left = server_prepared(cursor)
            if forget:
                assert left == {psycopg_name, "scheduler_test"}  # the caller deallocates them
            else:
                assert left == set()  # psycopg's rollback: DEALLOCATE ALL, the store's name too
            driver.rollback()


def test_psycopg_keeps_the_parsed_form_of_a_query_up_to_the_raised_limit(
    postgres_server: PostgresServer,
) -> None:
    """``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``: a query longer than psycopg's default
    limit (4,096) is converted once and then found in its cache, once the limit is raised."""
    import psycopg
    from psycopg import _queries

    internals.raise_psycopg_parse_cache_limit(32_768)
    assert _queries.MAX_CACHED_STATEMENT_LENGTH >= 32_768
    internals.raise_psycopg_parse_cache_limit(100)  # never lowered
    assert _queries.MAX_CACHED_STATEMENT_LENGTH >= 32_768
    query = "SELECT %(a)s::int AS " + "x" * 10 + " /* " + "y" * 6_000 + " */"
    dsn = postgres_server.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as driver:
        cursor = driver.cursor()
        cursor.execute(query, {"a": 1}, prepare=False)
        hits = _queries._query2pg.cache_info().hits
        cursor.execute(query, {"a": 2}, prepare=False)
        assert cursor.fetchone() == (2,)
        assert _queries._query2pg.cache_info().hits == hits + 1


# -- the public path gives the same results ------------------------------------------------------


def workload_outcome(target: str, schema: str | None) -> str:
    """The lifecycle workload's results and final tables on a fresh store at ``target`` (a SQLite
    path or a PostgreSQL URL), as JSON. Run here and in a process with the public path forced."""
    clock = Clock()
    engine = create_engine(target if "://" in target else f"sqlite:///{target}")
    store = open_store(engine, schema=schema, clock=clock, uuid_factory=clock.uuid)
    try:
        fast = store._runner.fastpath is not None  # type: ignore[attr-defined]
        results = workload(store, clock)
        return json.dumps({"fast": fast, "results": results, "tables": dump_tables(store)}, default=repr)
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("backend", [SQLITE, POSTGRESQL])
def test_the_public_path_gives_identical_results(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Claims, settlements, enqueues, controls, adjudication and history: the same results and
    tables with every internal refused (``SCHEDULER_PUBLIC_PATH=1``, a process of its own: also
    every statement's ``locks`` counted as locking) as with the internals read."""
    schemas: list[str] = []
    server: PostgresServer | None = None
    if backend == POSTGRESQL:
        server = request.getfixturevalue("postgres_server")
        schemas = [unique_name("t_internals"), unique_name("t_public")]
        target = server.url.render_as_string(hide_password=False)
        targets = [(target, schemas[0]), (target, schemas[1])]
    else:
        targets = [(str(tmp_path / "internals.sqlite"), None), (str(tmp_path / "public.sqlite"), None)]
    try:
        read = json.loads(workload_outcome(*targets[0]))
        code = (
            f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
            "from test_library_internals import workload_outcome; "
            f"print(workload_outcome({targets[1][0]!r}, {targets[1][1]!r}))"
        )
        env = {**os.environ, internals.PUBLIC_PATH_ENV: "1"}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        public = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for schema in schemas:
            assert server is not None
            server.drop_schema(schema)
    assert read["fast"] is True and public["fast"] is False
    assert public["results"] == read["results"]
    assert public["tables"] == read["tables"]


@pytest.mark.parametrize("backend", sorted(REPLAY_BACKENDS))
def test_every_trace_replays_identically_on_the_public_path(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, public_path: None
) -> None:
    if backend == POSTGRESQL:
        request.getfixturevalue("postgres_server")
    replayed = 0
    for path in sorted(TRACES.glob("*.json")):
        try:
            report = replay(path, REPLAY_BACKENDS[backend](tmp_path / path.stem))
        except NotApplicable:
            continue  # a trace that cannot start on this backend (tests/test_traces.py says which)
        assert report.failures == [] and report.dump_problems == [], path.stem
        assert report.identical == report.applicable, path.stem
        replayed += 1
    assert replayed >= 7


# -- no internal read anywhere else --------------------------------------------------------------

PUBLIC_UNDERSCORE_API: Final = frozenset({"_mapping", "_asdict", "_make", "_fields"})
"""Underscore names that are public API: SQLAlchemy's ``Row._mapping`` and ``namedtuple``'s."""

PROJECT_PRIVATE: Final = frozenset(
    {
        "_after_fork",
        "_after_settle",
        "_assert_open",
        "_clock",
        "_defer",
        "_defer_async",
        "_enclosing_rolled_back",
        "_group_claims",
        "_guarded",
        "_idle",
        "_keeper",
        "_log_abandoned",
        "_mark_lost",
        "_past_deadline",
        "_poll",
        "_prepared_driver",
        "_run",
        "_runner",
        "_settle_arguments",
        "_settle_once",
        "_settled_by_us",
        "_source",
        "_stopping",
        "_store",
        "_uuid_factory",
        "_verify_fingerprint",
        "_verify_foreign_keys",
        "_verify_history",
        "_verify_identity",
        "_verify_indexes",
        "_verify_table_shapes",
        "_verify_tables",
        "_wait_async",
    }
)
"""The project's own private names that one of its modules reads on another's object (none of
them appears in SQLAlchemy's, psycopg's or asyncpg's source)."""

PROJECT_PRIVATE_ON: Final = frozenset(
    {
        ("_read", "store"),
        ("_write", "store"),
        ("_execute", "worker"),
        ("_load", "METRICS"),
        ("_wait", "self._owner()"),
    }
)
"""The project's own private names that the libraries use too: allowed only on these objects."""

LIBRARIES: Final = ("sqlalchemy", "psycopg", "asyncpg")
_ACCESSORS: Final = frozenset({"getattr", "hasattr", "setattr", "delattr"})


def private_reads(tree: ast.AST) -> Iterator[tuple[int, str, str]]:
    """(line, name, receiver) of each private attribute read on something other than ``self`` or
    ``cls`` (``x._name`` or ``getattr(x, "_name")``), and of each private import from a library."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name, receiver = node.attr, node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _ACCESSORS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name, receiver = node.args[1].value, node.args[0]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES:
            module = node.module or ""
            for alias in node.names:
                if any(part.startswith("_") for part in (*module.split("."), alias.name)):
                    yield node.lineno, f"{module}.{alias.name}", "import"
            continue
        else:
            continue
        if not name.startswith("_") or name.startswith("__"):
            continue
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            continue
        yield node.lineno, name, ast.unparse(receiver)


def test_no_module_but_the_quarantine_reads_a_library_internal() -> None:
    offending = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == QUARANTINE:
            continue
        for line, name, receiver in private_reads(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                name in PUBLIC_UNDERSCORE_API
                or name in PROJECT_PRIVATE
                or (name, receiver) in PROJECT_PRIVATE_ON
            ):
                continue
            offending.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {receiver}.{name}")
    assert offending == [], "read through scheduler.store.plumbing.library_internals instead"


def test_the_quarantine_reads_library_internals() -> None:
    """(The scan above finds them: run on the quarantine module it reports its internals.)"""
    found = {
        name for _line, name, _receiver in private_reads(ast.parse(QUARANTINE.read_text(encoding="utf-8")))
    }
    assert {"_bind_processors", "_result_columns", "_has_events", "_handle_dbapi_exception"} <= found


def library_private_names() -> set[str]:
    names: set[str] = set()
    for library in LIBRARIES:
        spec = importlib.util.find_spec(library)
        if spec is None or spec.origin is None:
            continue
        for path in Path(spec.origin).parent.rglob("*"):
            if path.suffix in (".py", ".pyi", ".pyx", ".pxd"):
                names.update(
                    re.findall(r"(?<!\w)_[A-Za-z]\w*", path.read_text(encoding="utf-8", errors="ignore"))
                )
    return names


def project_definitions() -> set[str]:
    """Every name the package defines: functions, classes, assigned attributes and names, slots."""
    defined: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                defined.add(node.value)  # __slots__ entries
    return defined


def test_the_allow_list_holds_only_the_projects_own_private_names() -> None:
    defined = project_definitions()
    allowed = PROJECT_PRIVATE | {name for name, _receiver in PROJECT_PRIVATE_ON}
    assert sorted(allowed - defined) == []
    library = library_private_names()
    assert {"_bind_processors", "_has_events"} <= library  # the libraries were read
    # A name a library uses too is allowed on the named objects only (PROJECT_PRIVATE_ON).
    assert sorted(PROJECT_PRIVATE & library) == []
