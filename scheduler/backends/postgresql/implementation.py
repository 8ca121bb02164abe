"""``PostgreSQLBackend``: the :class:`~scheduler.backends.interface.Backend` of a PostgreSQL
schema (psycopg 3; asyncpg under ``scheduler.aio``).

READ COMMITTED writers run at once: a claim locks each candidate it read before claiming it
(``claim_tactics``, ``claim_locks``), a settlement locks or checks the row it read, and a write
the store owns is run again from the start where a row changed under it. Several writes go as
one statement (``write_batch``, ``cycle_statement``, ``enqueue_statement``, ``claim_statement``,
``settle_statement``); ``clock=None`` is the server's ``clock_timestamp()``; committed work
notifies idle workers (``wakeups``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import Connection, Table, Text, TypeDecorator, bindparam, func, select, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.sql import ColumnElement, Select

from scheduler.backends.interface import Backend, CycleRead, EnqueueCall, NamedStatements, SettleTactic
from scheduler.backends.postgresql import backend as postgresql
from scheduler.backends.postgresql import (
    claim_locks,
    claim_statement,
    claim_tactics,
    cycle_read,
    cycle_statement,
    enqueue_statement,
    settle_statement,
    wakeups,
)
from scheduler.backends.postgresql.server_statements import ServerStatements, connection_fits, counts_differed
from scheduler.schema.target import SchemaTarget, quote_identifier

if TYPE_CHECKING:
    from scheduler.store.capabilities.claim_eligibility import ClaimFilter
    from scheduler.store.capabilities.claim_plan import ClaimContention
    from scheduler.store.capabilities.claim_writes import Claims
    from scheduler.store.capabilities.settle_request import SettleRequest
    from scheduler.store.plumbing.fastpath import FastPath
    from scheduler.store.plumbing.statement_plans import StoredRow
    from scheduler.store.plumbing.tx import CallMode, Tx

_KEEP_ROWCOUNT: Final[Mapping[str, Any]] = MappingProxyType({"preserve_rowcount": True})
"""SQLAlchemy drops the driver's row count of an INSERT unless asked (``Tx.changes``)."""


class PostgreSQLBackend:
    """PostgreSQL (see the module)."""

    name: Final = postgresql.NAME
    display_name: Final = "PostgreSQL"
    place_description: Final = "scheduler schema"
    own_schema: Final = True
    serializes_writers: Final = False
    bookkeeping_tables: Final[tuple[Table, ...]] = ()
    has_server_clock: Final = True
    reruns_owned_writes: Final = True
    lazy_read_begin: Final = None
    combines_writes: Final = True
    copies_rows: Final = True
    multi_row_inserts: Final = True
    fast_path_driver: Final = ("psycopg", "pyformat")
    names_statements: Final = True
    statement_options: Final = _KEEP_ROWCOUNT

    def in_memory(self, url: URL) -> bool:
        return False

    def database_file(self, url: URL) -> str | None:
        return None

    def text_values(self, name: str) -> ColumnElement[Any]:
        """``unnest(:name) AS wanted(value)`` over a text array."""
        values = func.unnest(bindparam(name, type_=_TextArray()))
        return values.table_valued("value").render_derived(name="wanted").c.value

    def text_values_parameter(self, values: list[str]) -> Any:
        return values

    def copy_statement(self, schema: str | None, table: str, columns: Sequence[str]) -> str:
        """``COPY "schema"."table" ("column", …) FROM STDIN``: rows in the text format, parsed by
        the server as one statement (an ``INSERT`` of 64 rows binds 1,280 parameters)."""
        target = (
            quote_identifier(table)
            if schema is None
            else f"{quote_identifier(schema)}.{quote_identifier(table)}"
        )
        return f"COPY {target} ({', '.join(map(quote_identifier, columns))}) FROM STDIN"

    def rows_of_jobs(
        self, occurrences: Any, job_ids: Select[Any], columns: Sequence[str], limit: Any
    ) -> Select[Any]:
        """Each job's rows in a ``LATERAL`` subquery in ``scheduler_occurrences_job``'s order,
        with a ``LIMIT`` of its own: an ordered walk of the job's index entries (a plan that
        sorts is costed as disabled on the store's connection). With statistics the planner
        estimates a job's rows as the average job's: asked for ``job_id IN (…)`` it scanned the
        whole table or index (a hash or merge join), and for one job with a ``LIMIT`` but no
        order a table scan expected to stop early, even when the job holds a few hundred of
        100,000 rows at the table's end."""
        ids = job_ids.subquery("eligible_ids")
        per_job = (
            select(*(occurrences.c[name] for name in columns))
            .where(occurrences.c.job_id == ids.c.job_id)
            .order_by(occurrences.c.created_at, occurrences.c.occurrence_id)
            .limit(limit)
            .lateral("per_job")
        )
        return select(*per_job.c).select_from(ids.join(per_job, true())).limit(limit)

    def begin(
        self, conn: Connection, *, write: bool, fast: FastPath | None, one_statement: bool = False
    ) -> None:
        postgresql.begin(conn, write=write, fast=fast, one_statement=one_statement)

    def ensure_transaction(self, conn: Connection) -> None:
        postgresql.ensure_transaction(conn)

    def driver_in_transaction(self, conn: Connection) -> bool | None:
        return postgresql.driver_in_transaction(conn)

    def storage_condition(self, errors: list[BaseException]) -> tuple[str, bool] | None:
        return postgresql.storage_condition(errors)

    def rolled_back(self, errors: list[BaseException]) -> bool:
        return postgresql.rolled_back(errors)

    def missing_table(self, errors: list[BaseException]) -> bool:
        return postgresql.missing_table(errors)

    def named_statements(self, driver: Any) -> NamedStatements | None:
        """:class:`~scheduler.backends.postgresql.server_statements.ServerStatements` where the
        session writes strings as psycopg binds them (``server_statements.connection_fits``)."""
        return ServerStatements() if connection_fits(driver) else None

    def counts_differed(self, error: BaseException) -> bool:
        return counts_differed(error)

    def server_now(self, conn: Connection, fast: FastPath | None = None) -> int:
        return postgresql.server_now(conn, fast)

    def key_locks(self, target: SchemaTarget) -> Callable[[Connection, str, list[str]], None] | None:
        return postgresql.key_locks(target)

    def claim(
        self,
        tx: Tx,
        claims: Claims,
        claim_filter: ClaimFilter,
        limit: int,
        contention: ClaimContention | None,
        probed: Sequence[StoredRow] | None,
    ) -> None:
        claim_tactics.claim(tx, claims, claim_filter, limit, contention, probed)

    def lock_target(self, tx: Tx, occurrence_id: str) -> None:
        claim_locks.lock_target(tx, occurrence_id)

    def lock_sweep(self, tx: Tx, batch: Sequence[StoredRow]) -> Sequence[StoredRow]:
        return claim_locks.locked_sweep(tx, batch)

    def settle_tactic(self, call: CallMode, rows: int) -> SettleTactic:
        """A single settle in a call the store may run again checks its row as it writes it
        (``settlement._SETTLE_GUARDED``), saving the lock's statement; others lock first."""
        return "check_on_write" if rows == 1 and call.may_run_again else "lock_first"

    def read_cycle(
        self,
        tx: Tx,
        request: SettleRequest,
        claim_filter: ClaimFilter,
        contention: ClaimContention | None,
    ) -> CycleRead | None:
        """In a call the store may run again (a long lock wait runs it again): the window of
        heads among workers, the head probe and its lock while the queue is quiet."""
        if not tx.call.may_run_again or contention is None:
            return None
        window = not contention.probe_first
        return cycle_read.read_cycle(
            tx, request.occurrence_id, request.owner_id, request.fence, claim_filter, window
        )

    def leave_cycle_to_writes(
        self,
        tx: Tx,
        request: SettleRequest,
        lease_ms: int,
        claim_filter: ClaimFilter,
        contention: ClaimContention | None,
    ) -> bool:
        """Where the call's writes may carry the cycle (:meth:`_writes_may_carry`)."""
        if not self._writes_may_carry(tx):
            return False
        pending = cycle_statement.cycle_in_one_statement(tx, request, lease_ms, claim_filter, contention)
        return pending is not None

    def leave_enqueue_to_writes(self, tx: Tx, request: EnqueueCall, lock: tuple[str, str]) -> bool:
        """Where the call's writes may carry the enqueue (:meth:`_writes_may_carry`)."""
        if not self._writes_may_carry(tx):
            return False
        return enqueue_statement.enqueue_in_one_statement(tx, request, lock) is not None

    def leave_claim_to_writes(
        self,
        tx: Tx,
        owner: str,
        lease_ms: int,
        claim_filter: ClaimFilter,
        contention: ClaimContention | None,
    ) -> bool:
        """As :meth:`leave_cycle_to_writes`: a ``claim_next`` while the queue is quiet, or among
        workers from the window of heads (``claim_statement``)."""
        if not self._writes_may_carry(tx):
            return False
        pending = claim_statement.claim_in_one_statement(tx, owner, lease_ms, claim_filter, contention)
        return pending is not None

    def leave_settle_to_writes(self, tx: Tx, request: SettleRequest) -> bool:
        """As :meth:`leave_cycle_to_writes`: a ``settle`` that succeeds (``settle_statement``)."""
        if not self._writes_may_carry(tx):
            return False
        return settle_statement.settle_in_one_statement(tx, request) is not None

    def _writes_may_carry(self, tx: Tx) -> bool:
        """Whether the call's writes may carry its whole work (``Tx.pick_later``: the store may run
        the call again, and its writes go as one statement through the fast path) and the call
        was not run again after such a statement missed (``CallMode.as_one_statement``)."""
        call = tx.call
        return call.may_run_again and self.combines_writes and tx.uses_fast_path and call.as_one_statement

    def schema_header(self, conn: Connection, target: SchemaTarget) -> tuple[int, int | None]:
        return postgresql.schema_header(conn, target)

    def wake_channel(self, schema: str) -> str | None:
        return wakeups.wake_channel(schema)

    def settle_channel(self, schema: str) -> str | None:
        return wakeups.settle_channel(schema)

    def send_wakeup(self, conn: Connection, channel: str) -> None:
        wakeups.send_wakeup(conn, channel)


BACKEND: Final[Backend] = PostgreSQLBackend()


class _TextArray(TypeDecorator[list[str]]):
    """``TEXT[]`` sent as psycopg sends a list of texts: without ``ARRAY``'s bind processor
    (which copies the list), so the fast path runs statements binding one as compiled."""

    impl = ARRAY(Text)
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> None:
        return None
