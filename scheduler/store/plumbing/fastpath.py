"""Compile-once execution of the hot Core statements on the driver connection.

The store's queries stay SQLAlchemy Core expressions over :mod:`scheduler.schema.tables`. The
statements of the hot paths (claims, settlement, enqueue, events) are module-level constants
wrapped in :class:`~scheduler.store.plumbing.statement_plans.Prepared`. For pysqlite and (sync) psycopg,
:class:`FastPath` compiles each one once per dialect and schema (``statement_plans.compile_plan``)
— the same SQL text and binds SQLAlchemy itself would execute,
positional ``?`` for pysqlite, named ``%(name)s`` for psycopg — and runs it with a reused DBAPI
cursor, skipping the per-call cache key, execution context and result set-up (about 40 µs a
statement on SQLite, 60–100 µs on PostgreSQL). Rows are light named tuples that support what the
store uses of a SQLAlchemy ``Row``: attribute access, indexing and ``_mapping``.

Expanding ``IN`` lists and literal-execute binds (the claims' ``LIMIT``/``OFFSET``) are expanded
by SQLAlchemy's own post-compile step once per list length and value; that SQL is then reused.

SQLAlchemy's own execution is used instead whenever it could behave differently: another
dialect or driver (aiosqlite, asyncpg, async psycopg), a statement the fast path cannot
reproduce exactly (type processors, callable binds, executemany with RETURNING or with expanding
or literal-execute binds, prefetched defaults), and any connection that is instrumented —
connection, engine or dialect events (so ``before_cursor_execute`` listeners see every
statement), echo, or execution options other than the isolation level (and a
``schema_translate_map`` the store's own map does not override). Driver errors go through
SQLAlchemy's own error handling, so they surface wrapped exactly as ``Connection.execute`` wraps
them. The SQLAlchemy and psycopg internals all this reads are read through
:mod:`~scheduler.store.plumbing.library_internals`; where it reports them unavailable (an untested
version, or ``SCHEDULER_PUBLIC_PATH=1``) there is no fast path, or no plan for the statement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from typing import Any, Final, NoReturn

from sqlalchemy import Connection, Table
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import SQLAlchemyError

from scheduler.backends import backend_for, backend_named, is_supported
from scheduler.backends.interface import NamedStatements
from scheduler.store.plumbing import library_internals as internals
from scheduler.store.plumbing import statement_plans
from scheduler.store.plumbing.library_internals import InternalsUnavailable
from scheduler.store.plumbing.restart import RestartTransaction
from scheduler.store.plumbing.statement_plans import STATEMENTS_LOCK, Plan, Prepared, SchemaMap

# Connection-level execution options that do not change how a statement executes.
_NEUTRAL_OPTIONS: Final = frozenset({"isolation_level", "logging_token"})
# A connection's ``schema_translate_map`` is overridden by the one the store passes with every
# statement when its schema is not SQLite's ``main``; for ``main`` the store passes none, and the
# connection's map applies (so only SQLAlchemy's execution can follow it).
_TRANSLATE_MAP: Final = "schema_translate_map"
# psycopg's transaction status values (psycopg.pq.TransactionStatus), and the keys of the pool's
# record of a connection (``conn.connection.info``) for its own prepare_threshold and for the
# statements a store named on it.
_IDLE: Final = 0
_IN_ERROR: Final = 3
_THRESHOLD_KEPT: Final = "scheduler.prepare_threshold"
_NAMED: Final = "scheduler.named_statements"


class FastPath:
    """The compiled plans of one store connection's dialect and schema, and a reused driver cursor."""

    __slots__ = (
        "_backend",
        "_cursor",
        "_dbapi",
        "_dialect",
        "_owned",
        "_plans",
        "_server",
        "_server_dbapi",
        "_threshold_kept",
        "_translate_map",
        "commit_sent",
    )

    def __init__(self, dialect: Dialect, translate_map: SchemaMap | None = None) -> None:
        self._dialect = dialect
        self._backend = backend_for(dialect)
        self._translate_map = translate_map
        self._plans: dict[tuple[Prepared, tuple[str, ...] | None, bool], Plan | None] = {}
        self._dbapi: Any = None
        self._cursor: Any = None
        self._server: NamedStatements | None = None
        """Named server-side statements of the bound psycopg connection (``serve_named``)."""
        self._server_dbapi: Any = None
        self._threshold_kept: Any = None
        self._owned = False
        self.commit_sent = False
        """A ``COMMIT`` went out with a statement in this transaction (it may have been applied,
        whatever was heard back; reset by :meth:`defer_begin`)."""

    @staticmethod
    def for_connection(conn: Connection, translate_map: SchemaMap | None = None) -> FastPath | None:
        """A fast path for a pysqlite or (sync) psycopg connection (``None`` for any other
        driver) whose plans address the scheduler's tables through ``translate_map`` (``None``:
        unqualified)."""
        dialect = conn.dialect
        if not is_supported(dialect.name):
            return None
        if (dialect.driver, dialect.paramstyle) != backend_named(dialect.name).fast_path_driver:
            return None
        try:
            internals.connection_supported(conn)
        except InternalsUnavailable:  # SQLAlchemy's public path (library_internals)
            return None
        return FastPath(dialect, translate_map)

    def usable(self, conn: Connection) -> bool:
        """False while anything observes or alters statement execution on ``conn``.

        Called once per transaction; it also (re)binds the cursor to the current driver connection.
        """
        try:
            if internals.observed(conn, self._dialect):
                return False
        except InternalsUnavailable:
            return False
        if conn.dialect is not self._dialect or not self._neutral(conn.get_execution_options()):
            return False
        dbapi = conn.connection.dbapi_connection
        if dbapi is not self._dbapi or self._cursor is None:
            self._cursor = dbapi.cursor()  # type: ignore[union-attr]
            self._dbapi = dbapi
        if self._owned and dbapi is not self._server_dbapi:
            self._bind_server_statements(conn, dbapi)
        return True

    def serve_named(self) -> None:
        """Use named server-side statements on the connections of a store-owned runner
        (``Backend.names_statements``: PostgreSQL's psycopg)."""
        self._owned = self._backend.names_statements

    def _bind_server_statements(self, conn: Connection, dbapi: Any) -> None:
        """A driver connection the store has not named statements on yet (on an idle connection).

        psycopg's own statement cache is emptied and turned off (its ``rollback()`` would
        ``DEALLOCATE ALL``, these names too), and so are the statements a store that had this
        pooled connection before left; the connection's own ``prepare_threshold`` is kept in the
        pool's record of it and given back when the store closes (:meth:`release`). A connection
        made with ``prepare_threshold=None`` (no prepared statements, as behind PgBouncer's
        transaction pooling) keeps psycopg's unnamed statements and its own ``BEGIN``/``COMMIT``.
        """
        if getattr(dbapi, "info", None) is None or dbapi.info.transaction_status != _IDLE:
            return  # a caller left a transaction open on it: try again at the next transaction
        self._server_dbapi = dbapi
        self._server = None
        record = conn.connection.info
        threshold = record.setdefault(_THRESHOLD_KEPT, getattr(dbapi, "prepare_threshold", None))
        server = None if threshold is None else self._backend.named_statements(dbapi)
        if server is None:
            return
        try:
            held = internals.psycopg_prepared_count(dbapi)
        except InternalsUnavailable:
            return  # psycopg's own prepared statements, unnamed BEGIN and COMMIT
        # Deallocated with the first PREPAREs, in autocommit (FastPath.defer_begin).
        server.deallocate_first = bool(held or record.get(_NAMED))
        dbapi.prepare_threshold = None
        internals.forget_psycopg_prepared(dbapi)
        record[_NAMED] = True
        self._threshold_kept = threshold
        self._server = server

    def _give_back_threshold(self) -> None:
        dbapi = self._server_dbapi
        self._server_dbapi, self._server = None, None
        if dbapi is not None:
            with suppress(Exception):
                dbapi.prepare_threshold = self._threshold_kept

    @property
    def sends_commit(self) -> bool:
        """Whether a statement may carry the transaction's ``COMMIT`` (named statements are on)."""
        return self._server is not None

    def defer_begin(self, conn: Connection, begin: str | None) -> bool:
        """Start a store-owned transaction whose ``begin`` goes out with its first statement
        (psycopg in autocommit until it ends: :meth:`end_transaction`); whether it does.
        ``None``: no ``BEGIN`` (a read of one statement, in autocommit: nothing to commit).

        The connection is idle here, so the statements noted since are prepared first.
        """
        server = self._server
        self.commit_sent = False
        if server is None or self._dbapi is None or self._dbapi.info.transaction_status != _IDLE:
            return False
        try:
            self._dbapi.autocommit = True
            server.prepare_wanted(self._cursor)
        except BaseException as error:
            self._failed(conn, error, "PREPARE", (), self._cursor)
        server.pending_begin = begin
        return True

    def ensure_begun(self, conn: Connection) -> None:
        """Send the transaction's ``BEGIN`` now if it still waits for a first statement (before
        anything the fast path does not send itself)."""
        server = self._server
        if server is not None and server.pending_begin is not None:
            begin, server.pending_begin = server.pending_begin, None
            try:
                self._cursor.execute(begin, prepare=False)
            except BaseException as error:
                self._failed(conn, error, begin, (), self._cursor)

    def end_transaction(self) -> None:
        """The store-owned transaction ended (committed or rolled back): psycopg leaves autocommit."""
        server = self._server
        if server is not None:
            server.pending_begin = None
            with suppress(Exception):  # a broken connection: the next transaction reconnects
                if self._dbapi.autocommit:
                    self._dbapi.autocommit = False

    def _neutral(self, options: Mapping[str, Any]) -> bool:
        """Whether a connection's execution options leave its statements as the plans run them."""
        for name, value in options.items():
            if name in _NEUTRAL_OPTIONS:
                continue
            if name == _TRANSLATE_MAP and (not value or self._translate_map is not None):
                continue
            return False
        return True

    def release(self) -> None:
        """Close the reused cursor, so no statement of it keeps the connection from closing.

        (A pysqlite cursor keeps its last statement; an unfinalized statement turns
        ``sqlite3_close`` into a "zombie" close that leaves the file, its locks and its WAL open.)
        The next :meth:`usable` opens a new cursor.
        """
        self._give_back_threshold()
        cursor, self._cursor, self._dbapi = self._cursor, None, None
        if cursor is not None:
            with suppress(Exception):  # the connection is already gone: nothing left to finalize
                cursor.close()

    def in_transaction(self) -> bool:
        """Whether the driver connection bound by :meth:`usable` is inside a transaction."""
        return bool(self._dbapi.in_transaction)

    def _plan(self, prepared: Prepared, first: Mapping[str, Any], many: bool) -> Plan | None:
        key = (prepared, tuple(first) if prepared.dml else None, many)
        try:
            return self._plans[key]
        except KeyError:
            with STATEMENTS_LOCK:
                dialect, translate_map = self._dialect, self._translate_map
                plan = statement_plans.compile_plan(prepared, dialect, key[1], many, translate_map)
            self._plans[key] = plan
            return plan

    def _failed(
        self, conn: Connection, error: BaseException, sql: str, arguments: Any, cursor: Any
    ) -> NoReturn:
        """SQLAlchemy's handling of a driver error (wrapping, events, invalidation); it raises.

        The handler is not given the cursor, which it would close: the store's one cursor stays
        usable after an error (a ``ROLLBACK`` and the call run again go through it), and after an
        invalidation the connection is a new one, for which :meth:`usable` opens a new cursor."""
        if cursor is not self._cursor:
            with suppress(Exception):
                cursor.close()  # a cursor of its own (``run_driver_sql`` before the first use)
        if not conn.in_transaction():
            # A driver transaction the Connection did not begin (``OwnedRunner``): joined, so
            # the handler does not roll it back behind the store's back (its "autorollback").
            with suppress(Exception):
                conn.begin()
        try:
            internals.raise_dbapi_error(conn, error, sql, arguments)
        finally:
            if conn.invalidated:
                self._cursor = self._dbapi = None  # the dead connection's; usable() binds the new one

    def run_driver_sql(self, conn: Connection, sql: str) -> None:
        """``conn.exec_driver_sql(sql)`` for a statement without parameters or rows (``BEGIN …``,
        ``SAVEPOINT …``, ``ROLLBACK TO SAVEPOINT …``).

        On psycopg the statement bypasses the connection's prepared-statement cache: psycopg
        forgets every statement it prepared when a statement it has not seen before reports
        ``ROLLBACK``, and ``ROLLBACK TO SAVEPOINT`` reports ``ROLLBACK``; after a rare rollback
        (a claim's lock round that met a row changed under it) each hot statement was planned
        again five times (the ~10 KB claim statement ~1 ms each). A savepoint rollback leaves the
        server's prepared statements valid, and none of these utility statements gains from being
        prepared.
        """
        dbapi: Any = conn.connection.dbapi_connection
        cursor = self._cursor or dbapi.cursor()
        driver: Any = conn.connection.driver_connection  # psycopg's own (async) Connection
        threshold = getattr(driver, "prepare_threshold", None)
        server = self._server
        if server is not None and server.pending_begin is not None:
            sql, server.pending_begin = f"{server.pending_begin}; {sql}", None
        try:
            if threshold is not None:
                driver.prepare_threshold = None
            cursor.execute(sql)
        except BaseException as error:
            self._failed(conn, error, sql, (), cursor)
        else:
            if cursor is not self._cursor:
                cursor.close()  # one of its own, opened before the first use of the store's
        finally:
            if threshold is not None:
                driver.prepare_threshold = threshold

    def rollback_keeping_prepared(self, conn: Connection) -> bool:
        """On psycopg, ROLLBACK the driver's transaction as a statement, past its prepared-statement
        cache; whether it did (``False`` on other drivers, or if the statement failed).

        psycopg's own ``rollback()`` forgets (and deallocates) every statement it prepared, so
        that the next five executions of each hot statement are planned again before it is
        prepared anew (the ~10 KB claim statement ~2 ms each): with 4 workers, whose store-owned
        claims restart in ~3 % of cycles (``CallMode.may_run_again``), that was ~0.7 ms of server CPU per
        cycle. A rollback leaves the server's prepared statements valid (the store runs no DDL
        in its transactions); ``rollback()`` afterwards finds the transaction ended and does
        nothing.
        """
        server = self._server
        if server is not None and server.pending_begin is not None:
            server.pending_begin = None  # nothing was sent: there is no transaction to end
            return True
        driver: Any = conn.connection.driver_connection  # psycopg's own (async) Connection
        if not hasattr(driver, "prepare_threshold"):
            return False
        threshold = driver.prepare_threshold
        dbapi: Any = conn.connection.dbapi_connection  # SQLAlchemy's adapter on async psycopg
        if server is not None and dbapi is self._dbapi and dbapi.info.transaction_status == _IDLE:
            return True  # no transaction (a read of one statement, in autocommit): nothing to end
        reused = self._cursor is not None and dbapi is self._dbapi
        try:
            driver.prepare_threshold = None
            cursor = self._cursor if reused else dbapi.cursor()
            try:
                cursor.execute("ROLLBACK")
            finally:
                if not reused:
                    cursor.close()
            return True
        except Exception:  # the connection is gone or unusable: the caller's rollback handles it
            return False
        finally:
            with suppress(Exception):
                driver.prepare_threshold = threshold

    def _run_named(
        self,
        conn: Connection,
        server: NamedStatements,
        cursor: Any,
        text: str,
        plan: Plan,
        commit: bool,
        *,
        led: bool = False,
    ) -> tuple[list[Any], int]:
        """Send ``EXECUTE`` text (with the pending ``BEGIN`` and the ``COMMIT`` asked for) as one
        simple-protocol query; the rows and count of its ``EXECUTE`` results (``led``: of its
        second ``EXECUTE``, see :meth:`run_led`)."""
        begins = server.pending_begin is not None
        server.pending_begin = None
        if commit:
            self.commit_sent = True
        try:
            cursor.execute(text, prepare=False)
            for _ in range(int(begins) + int(led)):
                cursor.nextset()
            rows = [] if plan.row_type is None else list(map(plan.row_type._make, cursor.fetchall()))
            count = cursor.rowcount
            if not commit:
                while cursor.nextset():  # one result per parameter set (``executemany``)
                    count += cursor.rowcount
        except BaseException as error:
            self._named_failed(conn, server, error, text, cursor)
        return rows, count

    def _named_failed(
        self, conn: Connection, server: NamedStatements, error: BaseException, text: str, cursor: Any
    ) -> NoReturn:
        """A named statement's failure: a server error leaves the transaction open and aborted, so
        a ``COMMIT`` sent after it was not run; a statement name the session lost runs the call
        again."""
        sqlstate = getattr(error, "sqlstate", None)
        if sqlstate is not None and self._dbapi.info.transaction_status == _IN_ERROR:
            self.commit_sent = False
        if server.lost(error):
            server.forget()
            if self._dbapi.autocommit:  # a store-owned transaction: nothing of it is kept
                raise RestartTransaction from error
        self._failed(conn, error, text, (), cursor)

    def transaction_failed(self) -> bool:
        """Whether the bound psycopg connection's transaction is aborted (a statement in it failed:
        a ``COMMIT`` now would roll it back and report no error)."""
        info = getattr(self._dbapi, "info", None)
        return info is not None and info.transaction_status == _IN_ERROR

    def commit(self, conn: Connection) -> None:
        """COMMIT the driver's transaction (errors wrapped as ``Connection.commit`` wraps them)."""
        try:
            self._dbapi.commit()
        except BaseException as error:
            internals.raise_dbapi_error(conn, error, None, None)

    @property
    def copies_rows(self) -> bool:
        """Whether :meth:`copy_rows` can stream rows: the backend has a ``COPY`` and the driver's
        cursor takes one (psycopg's)."""
        return self._backend.copies_rows and hasattr(self._cursor, "copy")

    def copy_rows(
        self, conn: Connection, table: Table, columns: Sequence[str], rows: Iterable[Sequence[Any]]
    ) -> bool:
        """Stream ``rows`` into ``table`` with the backend's ``copy_statement`` on the store's
        cursor, in the transaction; whether it did (``False``: nothing was sent, the driver or
        the database has no such statement: :attr:`copies_rows`). Errors are wrapped as ``run``'s."""
        if not self.copies_rows:
            return False
        cursor = self._cursor
        schema = None if self._translate_map is None else self._translate_map.get(table.schema)
        sql = self._backend.copy_statement(schema, table.name, columns)
        self.ensure_begun(conn)
        try:
            with cursor.copy(sql) as copy:
                for row in rows:
                    copy.write_row(row)
        except BaseException as error:
            self._failed(conn, error, sql, (), cursor)
        return True

    def run(
        self, conn: Connection, prepared: Prepared, parameters: Any, *, commit: bool = False
    ) -> tuple[list[Any], int] | None:
        """(rows, rowcount) of executing ``prepared``; ``None`` if SQLAlchemy must execute it.

        ``parameters`` is ``None``, a dict, or a non-empty list of dicts (``executemany``).
        With ``commit``, the transaction's ``COMMIT`` goes out with the statement where it is a
        named server-side statement (:attr:`commit_sent`); elsewhere the caller commits as usual.
        """
        done = self._run(conn, prepared, parameters, commit)
        if done is None:
            self.ensure_begun(conn)  # SQLAlchemy sends the statement: it needs the transaction
        return done

    def run_led(
        self,
        conn: Connection,
        lead: tuple[Prepared, dict[str, Any]],
        prepared: Prepared,
        parameters: dict[str, Any],
        *,
        commit: bool,
    ) -> tuple[list[Any], int] | None:
        """``run`` of ``prepared`` preceded by ``lead`` (a statement and its parameters, whose rows
        are dropped) in the same simple-protocol query, each the ``EXECUTE`` of a named statement
        (with the pending ``BEGIN`` first and the ``COMMIT`` asked for last): ``prepared`` then
        runs on a snapshot taken after ``lead`` ran, at no round trip of its own. ``None`` when
        either is not named yet: nothing was sent."""
        server = self._server
        if server is None or prepared.planned_per_call or (self._cursor is None and not self.usable(conn)):
            return None
        texts: list[str] = []
        plan: Plan | None = None
        for index, (statement, values) in enumerate((lead, (prepared, parameters))):
            plan = self._plan(statement, values, False)
            if plan is None:
                return None
            try:
                sql, arguments = (
                    (plan.sql, plan.arguments(values)) if plan.compiled is None else plan.bind(values)
                )
            except (KeyError, TypeError, SQLAlchemyError):
                return None
            named = server.named(sql)
            if named is None:
                return None
            last = index == 1
            begin = None if last else server.pending_begin
            text = server.execute_text(*named, arguments, begin, commit and last)
            if text is None:
                return None
            texts.append(text)
        assert plan is not None
        return self._run_named(conn, server, self._cursor, "; ".join(texts), plan, commit, led=True)

    def _run(
        self, conn: Connection, prepared: Prepared, parameters: Any, commit: bool
    ) -> tuple[list[Any], int] | None:
        if parameters is None:
            parameters = {}
        elif type(parameters) is list:
            if not parameters:
                return None
            if len(parameters) == 1:
                parameters = parameters[0]
        if type(parameters) is list:
            plan = self._plan(prepared, parameters[0], True)
        elif isinstance(parameters, dict):
            plan = self._plan(prepared, parameters, False)
        else:
            return None
        if plan is None:
            return None
        sql = plan.sql
        try:
            if type(parameters) is list:
                build = plan.arguments
                arguments: Any = [build(item) for item in parameters]
            elif plan.compiled is None:
                arguments = plan.arguments(parameters)
            else:
                sql, arguments = plan.bind(parameters)
        except (KeyError, TypeError, SQLAlchemyError):
            return None  # a required value is missing (or not a list): SQLAlchemy raises its own error
        cursor = self._cursor
        if cursor is None:
            if not self.usable(conn):
                return None
            cursor = self._cursor
        server = self._server
        if server is not None:
            named = None if prepared.planned_per_call else server.named(sql)
            if named is not None:
                text = server.execute_text(*named, arguments, server.pending_begin, commit)
                if text is not None:
                    return self._run_named(conn, server, cursor, text, plan, commit)
            self.ensure_begun(conn)
        try:
            if type(arguments) is list:
                cursor.executemany(sql, arguments)
            else:
                cursor.execute(sql, arguments)
            rows = [] if plan.row_type is None else list(map(plan.row_type._make, cursor.fetchall()))
        except BaseException as error:
            self._failed(conn, error, sql, arguments, cursor)
        return rows, cursor.rowcount
