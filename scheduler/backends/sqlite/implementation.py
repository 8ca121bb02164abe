"""``SQLiteBackend``: the :class:`~scheduler.backends.interface.Backend` of a SQLite database.

One writer at a time (``BEGIN IMMEDIATE``): what a write transaction read stays true until it
ends, so claims and settlements take no lock, nothing is run again, and every write runs when it
is asked for. No server clock (the local wall clock), no ``NOTIFY`` (workers poll).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import Column, Connection, Integer, MetaData, Table, Text, bindparam, func, select
from sqlalchemy.engine import URL
from sqlalchemy.sql import ColumnElement, Select

from scheduler.backends.interface import Backend, CycleRead, EnqueueCall, NamedStatements, SettleTactic
from scheduler.backends.sqlite import backend as sqlite
from scheduler.schema.target import SchemaTarget
from scheduler.store.capabilities.claim_writes import claim_serially
from scheduler.store.plumbing.failures import lost_connection

if TYPE_CHECKING:
    from scheduler.store.capabilities.claim_eligibility import ClaimFilter
    from scheduler.store.capabilities.claim_plan import ClaimContention
    from scheduler.store.capabilities.claim_writes import Claims
    from scheduler.store.capabilities.settle_request import SettleRequest
    from scheduler.store.plumbing.fastpath import FastPath
    from scheduler.store.plumbing.statement_plans import StoredRow
    from scheduler.store.plumbing.tx import CallMode, Tx

_NO_OPTIONS: Final[Mapping[str, Any]] = MappingProxyType({})
MEMORY: Final = ":memory:"
SQLITE_SEQUENCE: Final = Table("sqlite_sequence", MetaData(), Column("name", Text), Column("seq", Integer))
"""SQLite's own AUTOINCREMENT table (the ``events`` counter). A ``Table`` (not a ``table()``
clause) so that schema translation addresses it too (an attached database)."""


class SQLiteBackend:
    """SQLite (pysqlite, aiosqlite under ``scheduler.aio``)."""

    name: Final = sqlite.NAME
    display_name: Final = "SQLite"
    place_description: Final = "SQLite database"
    own_schema: Final = False
    serializes_writers: Final = True
    bookkeeping_tables: Final = (SQLITE_SEQUENCE,)
    has_server_clock: Final = False
    reruns_owned_writes: Final = False
    lazy_read_begin: Final = sqlite.BEGIN_READ
    combines_writes: Final = False
    copies_rows: Final = False
    multi_row_inserts: Final = False  # executemany measured as fast: one prepared statement stepped
    fast_path_driver: Final = ("pysqlite", "qmark")
    names_statements: Final = False
    statement_options: Final = _NO_OPTIONS

    def in_memory(self, url: URL) -> bool:
        return url.database in (None, "", MEMORY)

    def database_file(self, url: URL) -> str | None:
        return None if self.in_memory(url) else url.database

    def text_values(self, name: str) -> ColumnElement[Any]:
        """``json_each(:name) AS wanted``: its column ``value`` is ``json_each``'s own."""
        return func.json_each(bindparam(name, type_=Text)).table_valued("value").alias("wanted").c.value

    def text_values_parameter(self, values: list[str]) -> Any:
        return json.dumps(values)

    def copy_statement(self, schema: str | None, table: str, columns: Sequence[str]) -> str:
        raise NotImplementedError("SQLite has no COPY (copies_rows is False)")

    def rows_of_jobs(
        self, occurrences: Any, job_ids: Select[Any], columns: Sequence[str], limit: Any
    ) -> Select[Any]:
        """``job_id IN (…)`` in ``scheduler_occurrences_job``'s order: SQLite looks each job up in
        that index. Unordered, after ``ANALYZE`` it scanned the table for the few rows of one
        job among 100,000 of another."""
        rows = select(*(occurrences.c[name] for name in columns)).where(occurrences.c.job_id.in_(job_ids))
        order = (occurrences.c.job_id, occurrences.c.created_at, occurrences.c.occurrence_id)
        return rows.order_by(*order).limit(limit)

    def begin(
        self, conn: Connection, *, write: bool, fast: FastPath | None, one_statement: bool = False
    ) -> None:
        sqlite.begin(conn, write=write, fast=fast, one_statement=one_statement)

    def ensure_transaction(self, conn: Connection) -> None:
        sqlite.ensure_transaction(conn)

    def driver_in_transaction(self, conn: Connection) -> bool | None:
        return sqlite.driver_in_transaction(conn)

    def storage_condition(self, errors: list[BaseException]) -> tuple[str, bool] | None:
        """Only a lost connection: SQLite's own codes are the neutral storage codes."""
        return lost_connection(errors)

    def rolled_back(self, errors: list[BaseException]) -> bool:
        return False  # a busy COMMIT is told apart where the store commits (opening.py)

    def missing_table(self, errors: list[BaseException]) -> bool:
        return sqlite.missing_table(errors)

    def named_statements(self, driver: Any) -> NamedStatements | None:
        return None

    def counts_differed(self, error: BaseException) -> bool:
        return False  # no write is ever combined with another

    def server_now(self, conn: Connection, fast: FastPath | None = None) -> int:
        return sqlite.server_now(conn, fast)

    def key_locks(self, target: SchemaTarget) -> Callable[[Connection, str, list[str]], None] | None:
        return None  # BEGIN IMMEDIATE serializes every write transaction of the file

    def claim(
        self,
        tx: Tx,
        claims: Claims,
        claim_filter: ClaimFilter,
        limit: int,
        contention: ClaimContention | None,
        probed: Sequence[StoredRow] | None,
    ) -> None:
        claim_serially(tx, claims, claim_filter, limit)

    def lock_target(self, tx: Tx, occurrence_id: str) -> None:
        return None

    def lock_sweep(self, tx: Tx, batch: Sequence[StoredRow]) -> Sequence[StoredRow]:
        return batch

    def settle_tactic(self, call: CallMode, rows: int) -> SettleTactic:
        return "as_read"

    def read_cycle(
        self,
        tx: Tx,
        request: SettleRequest,
        claim_filter: ClaimFilter,
        contention: ClaimContention | None,
    ) -> CycleRead | None:
        return None

    def leave_cycle_to_writes(
        self,
        tx: Tx,
        request: SettleRequest,
        lease_ms: int,
        claim_filter: ClaimFilter,
        contention: ClaimContention | None,
    ) -> bool:
        return False

    def leave_enqueue_to_writes(self, tx: Tx, request: EnqueueCall, lock: tuple[str, str]) -> bool:
        return False

    def leave_claim_to_writes(
        self,
        tx: Tx,
        owner: str,
        lease_ms: int,
        claim_filter: ClaimFilter,
        contention: ClaimContention | None,
    ) -> bool:
        return False

    def leave_settle_to_writes(self, tx: Tx, request: SettleRequest) -> bool:
        return False

    def schema_header(self, conn: Connection, target: SchemaTarget) -> tuple[int, int | None]:
        return sqlite.schema_header(conn, target)

    def wake_channel(self, schema: str) -> str | None:
        return None

    def settle_channel(self, schema: str) -> str | None:
        return None

    def send_wakeup(self, conn: Connection, channel: str) -> None:
        raise NotImplementedError("SQLite has no NOTIFY")


BACKEND: Final[Backend] = SQLiteBackend()
