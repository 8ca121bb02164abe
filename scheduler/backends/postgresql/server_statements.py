"""The hot statements as named server-side statements, so ``BEGIN`` and ``COMMIT`` ride along.

psycopg sends ``BEGIN`` as a round trip of its own before a transaction's first statement, and
``COMMIT`` as another after its last, so a quiet worker cycle (two statements) cost four round
trips; each costs ~50 µs of client CPU, ~45 µs of server CPU and the wake-ups in between, about
as much as the statements themselves. On the store's own connection (``OwnedRunner``,
PostgreSQL, sync psycopg) the compile-once fast path (:mod:`scheduler.store.plumbing.fastpath`) instead
prepares each hot statement once per connection under a name of its own (``PREPARE
scheduler_<n> AS …``, parameters ``$1`` …) and sends it as ``EXECUTE scheduler_<n>(<literals>)``
in one simple-protocol query together with the transaction's ``BEGIN`` (its first statement) or
``COMMIT`` (the writes the call kept for its end, :mod:`scheduler.store.plumbing.write_batch`): the cycle is
two round trips.

* **Literals.** Only ``None``, ``bool``, ``int`` and ``str`` values are written as literals, a
  string as ``'…'`` with quotes doubled (exact while the connection has
  ``standard_conforming_strings`` on and a UTF-8 client encoding, which :func:`connection_fits`
  checks); a string with a NUL or a lone surrogate, or any other type, is bound by psycopg as
  before (the statement is sent on its own). ``EXECUTE`` coerces each literal to the parameter's
  type as a bound value is.
* **Preparing.** A statement seen for the first time runs as psycopg sends it (extended
  protocol, unnamed); its ``PREPARE`` is sent when the connection is next idle, before the next
  transaction's ``BEGIN``, outside any transaction, so a statement PostgreSQL cannot prepare
  without parameter types stays on psycopg's path and never aborts a transaction. psycopg's own
  statement cache is off on that connection (``prepare_threshold = None``): it would otherwise
  ``DEALLOCATE ALL`` (these names too) after a rollback.
* **Failure.** A statement that reports SQLSTATE 26000 (the name is gone: someone ran
  ``DEALLOCATE``/``DISCARD`` on the store's connection) forgets every name of the connection
  and the call runs again (``RestartTransaction``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from scheduler.store.plumbing.write_batch import KEPT_WRITES_CHANGED

_PLACEHOLDER: Final = re.compile(r"%\((\w+)\)s|%%")
NAME_PREFIX: Final = "scheduler_"
STATEMENT_GONE: Final = "26000"
"""SQLSTATE ``invalid_sql_statement_name``: an ``EXECUTE`` of a name the session no longer has."""
CANNOT_PREPARE: Final = "42"
"""SQLSTATE class of a statement PostgreSQL cannot prepare (syntax, types): it stays unnamed."""
MAX_NAMES: Final = 512
"""Named statements kept per connection (each expanded ``IN`` length is one)."""


def counts_differed(error: BaseException) -> bool:
    """Whether ``error`` (a driver error, or SQLAlchemy's wrapping of one) is a checked combined
    write's refusal (``write_batch.KEPT_WRITES_CHANGED``)."""
    driver_error = getattr(error, "orig", error)
    return getattr(driver_error, "sqlstate", None) == "22P02" and KEPT_WRITES_CHANGED in str(driver_error)


def numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """psycopg's ``%(name)s`` SQL as ``$n`` SQL (``%%`` as ``%``) and the names in ``$n`` order."""
    order: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        index = order.setdefault(name, len(order) + 1)
        return f"${index}"

    return _PLACEHOLDER.sub(number, sql), tuple(order)


def literal(value: Any) -> str | None:
    """``value`` as an SQL literal, or ``None`` where only a bound parameter is exact."""
    kind = type(value)
    if kind is str:
        if "\x00" in value or not (value.isascii() or _encodes(value)):
            return None
        return f"'{value.replace(chr(39), chr(39) * 2)}'" if "'" in value else f"'{value}'"
    if kind is int:
        return str(value)
    if value is None:
        return "NULL"
    if kind is bool:
        return "true" if value else "false"
    if kind is list and all(type(item) is str for item in value):  # a text[] (a claim's job kinds)
        items = [literal(item) for item in value]
        if any(item is None for item in items):
            return None
        return f"ARRAY[{','.join(items)}]::text[]" if items else "'{}'::text[]"  # type: ignore[arg-type]
    return None


def _encodes(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: psycopg refuses it when it binds the value
        return False
    return True


def connection_fits(driver: Any) -> bool:
    """Whether strings written as ``'…'`` mean on ``driver``'s session what psycopg binds."""
    pgconn = driver.pgconn
    return bool(
        pgconn.parameter_status(b"standard_conforming_strings") == b"on"
        and (pgconn.parameter_status(b"client_encoding") or b"").upper() in (b"UTF8", b"UNICODE")
    )


class ServerStatements:
    """The named statements of one driver connection and the ``BEGIN`` its transaction still owes."""

    __slots__ = ("_counter", "_failed", "_names", "_wanted", "deallocate_first", "pending_begin")

    def __init__(self) -> None:
        self._names: dict[str, tuple[str, tuple[str, ...]]] = {}
        """SQL -> (name, parameter names in ``$n`` order) of the statements prepared."""
        self._wanted: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        """SQL -> (name, ``$n`` SQL, parameter names) of the statements to prepare."""
        self._failed: set[str] = set()
        self._counter = 0
        self.pending_begin: str | None = None
        """``BEGIN …`` to send before the transaction's first statement (``None``: sent, or none)."""
        self.deallocate_first = False
        """The session may hold prepared statements of psycopg's or of a store that had this pooled
        connection before: ``DEALLOCATE ALL`` before the first ``PREPARE``."""

    def forget(self) -> None:
        """The session lost its statements (a new connection, or SQLSTATE 26000)."""
        self._names.clear()
        self._wanted.clear()
        self._failed.clear()

    def named(self, sql: str) -> tuple[str, tuple[str, ...]] | None:
        """(name, parameter names in ``$n`` order) of ``sql`` if it is prepared; else it is
        noted to be prepared at the next :meth:`prepare_wanted`."""
        found = self._names.get(sql)
        if found is None and sql not in self._failed and sql not in self._wanted and self._room():
            self._counter += 1
            self._wanted[sql] = (f"{NAME_PREFIX}{self._counter}", *numbered(sql))
        return found

    def _room(self) -> bool:
        return len(self._names) + len(self._wanted) < MAX_NAMES

    @staticmethod
    def execute_text(
        name: str,
        order: Sequence[str],
        arguments: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        begin: str | None,
        commit: bool,
    ) -> str | None:
        """The simple-protocol query running ``name`` once per parameter set, after ``begin`` and
        before ``COMMIT`` when given; ``None`` if a value cannot be a literal."""
        sets = [arguments] if isinstance(arguments, Mapping) else arguments
        parts = [] if begin is None else [begin]
        for values in sets:
            rendered: list[str] = []
            for key in order:
                text = literal(values[key])
                if text is None:
                    return None
                rendered.append(text)
            parts.append(f"EXECUTE {name}({','.join(rendered)})" if rendered else f"EXECUTE {name}")
        if commit:
            parts.append("COMMIT")
        return "; ".join(parts)

    def lost(self, error: BaseException) -> bool:
        """Whether ``error`` is SQLSTATE 26000 (:data:`STATEMENT_GONE`)."""
        return getattr(error, "sqlstate", None) == STATEMENT_GONE

    def prepare_wanted(self, cursor: Any) -> None:
        """``PREPARE`` each statement noted since, one at a time, on an idle connection in
        autocommit (a statement PostgreSQL cannot prepare stays on psycopg's path)."""
        if self.deallocate_first:
            cursor.execute("DEALLOCATE ALL", prepare=False)
            self.deallocate_first = False
        wanted = list(self._wanted.items())
        self._wanted = {}
        for index, (sql, (name, numbered_sql, order)) in enumerate(wanted):
            try:
                cursor.execute(f"PREPARE {name} AS {numbered_sql}", prepare=False)
            except Exception as error:
                sqlstate = getattr(error, "sqlstate", None)
                if sqlstate is None:
                    self._wanted.update(wanted[index:])
                    raise  # the connection failed: the caller's failure handling applies
                if not sqlstate.startswith(CANNOT_PREPARE):
                    self._wanted.update(wanted[index:])  # a lock or statement timeout: next time
                    return
                self._failed.add(sql)
            else:
                self._names[sql] = (name, order)
