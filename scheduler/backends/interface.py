"""``Backend``: everything the store asks of the database it runs on, as one interface.

Each supported database implements it with one class (``sqlite.implementation.SQLiteBackend``,
``postgresql.implementation.PostgreSQLBackend``); :func:`scheduler.backends.backend_for` picks the
instance for a connection, engine or dialect name. The neutral code (the store's capabilities and
plumbing, the CLI, the Tasks layer) asks the backend instead of testing the database's name, and
never imports a backend's own modules.

Two kinds of knowledge meet at a call, and the interface keeps them apart:

* facts of the backend: whether writers run at the same time, whether several writes go as one
  statement, whether it has a server clock or ``NOTIFY``: properties and methods here;
* facts of one call, which the runner knows (:class:`scheduler.store.plumbing.tx.CallMode`):
  whether the store owns the transaction and may run the call again from the start
  (``may_run_again``), whether the call may still be sent as one statement (``as_one_statement``,
  false once such a statement missed). The backend reads them where it chooses a tactic
  (:meth:`Backend.claim`, :meth:`Backend.settle_tactic`, :meth:`Backend.leave_cycle_to_writes`
  and its kin for ``enqueue_occurrence``, ``claim_next`` and ``settle``).

Where each decision is taken:

* whether rows read must be locked before they are written (other writers run at once): the
  tactics themselves — :meth:`Backend.claim`, :meth:`Backend.lock_target`,
  :meth:`Backend.lock_sweep`, :meth:`Backend.settle_tactic` (locking, or nothing, per backend);
* whether one-row writes wait for the next statement: :attr:`Backend.combines_writes`, read by
  ``Tx.write_later`` (the only neutral reader: it is the one that keeps them);
* whether a call may be run again from the start: the runner, from
  :attr:`Backend.reruns_owned_writes` and whether it owns the transaction, into
  ``CallMode.may_run_again``;
* whether a whole cycle, enqueue, claim or settle may be left to the call's writes statement
  (one statement): the backend (:meth:`Backend.leave_cycle_to_writes`,
  :meth:`Backend.leave_enqueue_to_writes`, :meth:`Backend.leave_claim_to_writes`,
  :meth:`Backend.leave_settle_to_writes`), from the call's mode and ``Tx.uses_fast_path``.

The renderings of the neutral Core constructs (:mod:`scheduler.store.plumbing.constructs`) are not
part of it: each backend registers them with SQLAlchemy's compiler when its ``backend`` module is
imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from sqlalchemy import Connection, Table
from sqlalchemy.engine import URL
from sqlalchemy.sql import ColumnElement, Select

if TYPE_CHECKING:
    from scheduler.schema.target import SchemaTarget
    from scheduler.store.capabilities.claim_eligibility import ClaimFilter
    from scheduler.store.capabilities.claim_plan import ClaimContention
    from scheduler.store.capabilities.claim_writes import Claims
    from scheduler.store.capabilities.settle_request import SettleRequest
    from scheduler.store.plumbing.fastpath import FastPath
    from scheduler.store.plumbing.statement_plans import StoredRow
    from scheduler.store.plumbing.tx import CallMode, Tx

KeyLocks = Callable[[Connection, str, list[str]], None]
"""How ``Tx.lock_keys`` holds keys of a scope until the transaction ends."""

SettleTactic = Literal["as_read", "lock_first", "check_on_write"]
"""How a settlement makes sure the rows it read are still the rows it writes:

* ``as_read`` — nothing to do: no other writer runs meanwhile (SQLite);
* ``lock_first`` — lock the settled rows before reading them (``settlement._LOCK_SETTLED``);
* ``check_on_write`` — read without a lock and write with a statement that checks the row is
  as read, running the call again (``RestartTransaction``) where it is not: one row, in a call
  the store may run again."""


class CycleRead(Protocol):
    """The first statement of a ``settle_and_claim`` that reads the settled row and the heads of
    the queue at once (:meth:`Backend.read_cycle`)."""

    @property
    def current(self) -> dict[str, Any] | None:
        """The settled row's columns (``settlement.CURRENT_ROWS``), ``None`` without such a row."""
        ...

    @property
    def heads(self) -> Sequence[StoredRow]:
        """The probe's rows, for :meth:`Backend.claim` (``probed``)."""
        ...


class EnqueueCall(Protocol):
    """One validated ``enqueue_occurrence`` (the store's ``EnqueueRequest``), as
    :meth:`Backend.leave_enqueue_to_writes` reads it."""

    @property
    def job_id(self) -> str: ...

    @property
    def scheduled_for(self) -> int: ...

    @property
    def trigger_key(self) -> str: ...

    @property
    def available_at(self) -> int: ...

    @property
    def payload(self) -> Any:
        """The caller's payload, or ``scheduler.contract.scalars.MISSING``: the job's."""
        ...


class NamedStatements(Protocol):
    """The named server-side statements of one driver connection and the ``BEGIN`` its
    transaction still owes, for the fast path (:meth:`Backend.named_statements`; PostgreSQL:
    ``server_statements.ServerStatements``)."""

    pending_begin: str | None
    """``BEGIN …`` to send before the transaction's first statement (``None``: sent, or none)."""
    deallocate_first: bool
    """The session may hold prepared statements of others: deallocate them before preparing."""

    def forget(self) -> None:
        """The session lost its statements."""
        ...

    def named(self, sql: str) -> tuple[str, tuple[str, ...]] | None:
        """(name, parameter names in order) of ``sql`` if it is prepared; else it is noted to be
        prepared at the next :meth:`prepare_wanted`."""
        ...

    def prepare_wanted(self, cursor: Any) -> None:
        """Prepare each statement noted since (on an idle connection in autocommit)."""
        ...

    def execute_text(
        self,
        name: str,
        order: Sequence[str],
        arguments: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        begin: str | None,
        commit: bool,
    ) -> str | None:
        """The query running ``name`` once per parameter set, after ``begin`` and before
        ``COMMIT`` when given; ``None`` if a value cannot be a literal."""
        ...

    def lost(self, error: BaseException) -> bool:
        """Whether ``error`` says the session no longer has a name (the call runs again)."""
        ...


class Backend(Protocol):
    """One database backend of the store (see the module)."""

    # ------------------------------------------------------------- identity

    @property
    def name(self) -> str:
        """SQLAlchemy's dialect name (``"sqlite"``, ``"postgresql"``)."""
        ...

    @property
    def display_name(self) -> str:
        """The database's name in messages (``"SQLite"``, ``"PostgreSQL"``)."""
        ...

    @property
    def place_description(self) -> str:
        """What holds a store, in messages (``"SQLite database"``, ``"scheduler schema"``)."""
        ...

    # ------------------------------------------------------------- where a store lives

    @property
    def own_schema(self) -> bool:
        """Whether the store's tables live in a schema of their own (PostgreSQL: ``schema=``), rather
        than in a database file the store has to itself or shares (SQLite: ``exclusive=``)."""
        ...

    def in_memory(self, url: URL) -> bool:
        """Whether ``url`` names a database that lives in the process's memory."""
        ...

    def database_file(self, url: URL) -> str | None:
        """The database file ``url`` names (as written in it), ``None`` for a server or memory."""
        ...

    @property
    def bookkeeping_tables(self) -> tuple[Table, ...]:
        """Tables the database keeps for itself beside the scheduler's, whose rows belong to a
        faithful dump of the store (SQLite's ``sqlite_sequence``)."""
        ...

    def text_values(self, name: str) -> ColumnElement[Any]:
        """The values of the bound list parameter ``name`` as a column of one row per value (a
        table-valued function), for :meth:`text_values_parameter`'s value of a list of texts."""
        ...

    def text_values_parameter(self, values: list[str]) -> Any:
        """How a list of texts is bound for :meth:`text_values`."""
        ...

    def rows_of_jobs(
        self, occurrences: Any, job_ids: Select[Any], columns: Sequence[str], limit: Any
    ) -> Select[Any]:
        """``columns`` of the ``occurrences`` (an alias) of the jobs ``job_ids`` (a one-column
        select of job ids), at most ``limit`` rows in no particular order, each job's read
        through ``scheduler_occurrences_job`` whatever the statistics say of it."""
        ...

    # ------------------------------------------------------------- transactions and statements

    def begin(
        self, conn: Connection, *, write: bool, fast: FastPath | None, one_statement: bool = False
    ) -> None:
        """Start a transaction the store owns (its first statements). ``one_statement``: a read
        that runs one statement, a snapshot of its own: the backend may begin no transaction."""
        ...

    def ensure_transaction(self, conn: Connection) -> None:
        """Make sure a caller's transaction is really open before a SAVEPOINT."""
        ...

    def driver_in_transaction(self, conn: Connection) -> bool | None:
        """Whether the driver connection is inside a transaction (``None``: cannot tell)."""
        ...

    @property
    def lazy_read_begin(self) -> str | None:
        """The driver statement that begins a read snapshot where the driver begins its
        transactions lazily (pysqlite: ``BEGIN``), so a caller's connection may hold no driver
        transaction although SQLAlchemy began one; ``None`` where the connection's own state
        tells."""
        ...

    @property
    def statement_options(self) -> Mapping[str, Any]:
        """Execution options every store statement runs with, beside the schema map."""
        ...

    def storage_condition(self, errors: list[BaseException]) -> tuple[str, bool] | None:
        """(``storageCode``, whether the cause is contention or a lost connection) for the first
        failure of the database's own in a cause chain (``errors``, the error first), or ``None``
        (:func:`scheduler.store.plumbing.failures.classify_storage_failure` then looks for storage
        codes and contention in it)."""
        ...

    def rolled_back(self, errors: list[BaseException]) -> bool:
        """Whether the server answered the transaction's last statement or its ``COMMIT`` with an
        error that rolled the transaction back (``errors``: a cause chain, the error first), so a
        failure after the ``COMMIT`` was sent is still known not to have committed."""
        ...

    def missing_table(self, errors: list[BaseException]) -> bool:
        """Whether a statement of the cause chain ``errors`` named a table that does not exist."""
        ...

    @property
    def fast_path_driver(self) -> tuple[str, str]:
        """(driver, parameter style) of the connections the compile-once fast path runs statements
        on (:class:`~scheduler.store.plumbing.fastpath.FastPath`); SQLAlchemy runs them on others."""
        ...

    @property
    def names_statements(self) -> bool:
        """Whether the fast path sends the hot statements as named server-side statements on the
        store's own connections, with the transaction's ``BEGIN`` and ``COMMIT``
        (:meth:`named_statements`)."""
        ...

    def named_statements(self, driver: Any) -> NamedStatements | None:
        """Fresh named statements for the fast path's driver connection ``driver``, ``None`` where
        its session cannot run them exactly (or the backend has none: :attr:`names_statements`)."""
        ...

    def counts_differed(self, error: BaseException) -> bool:
        """Whether ``error`` is a checked combined write's refusal (its counts were not the ones
        expected: ``Tx.flush_writes``); never on a backend that does not combine writes."""
        ...

    # ------------------------------------------------------------- clock

    @property
    def has_server_clock(self) -> bool:
        """Whether ``clock=None`` means the server's clock (:meth:`server_now`) rather than the
        local wall clock."""
        ...

    def server_now(self, conn: Connection, fast: FastPath | None = None) -> int:
        """The server's clock in epoch ms (only where :attr:`has_server_clock`)."""
        ...

    # ------------------------------------------------------------- locks and tactics

    def key_locks(self, target: SchemaTarget) -> KeyLocks | None:
        """How ``Tx.lock_keys`` holds keys in ``target`` (``None``: writers are serialized anyway)."""
        ...

    @property
    def serializes_writers(self) -> bool:
        """Whether one write transaction runs at a time on the whole database (a caller's open
        transaction may hold the only write lock)."""
        ...

    @property
    def reruns_owned_writes(self) -> bool:
        """Whether a write transaction the store owns may be run again from the start when a row
        it read changed before it could lock it (other writers run at the same time): the runner
        then marks its first attempt ``CallMode.may_run_again``. ``False`` where writers are
        serialized and what a write read stays true until it ends."""
        ...

    @property
    def combines_writes(self) -> bool:
        """Whether several writes can go as one statement (data-modifying ``WITH``), so
        ``Tx.write_later`` keeps one-row writes and event rows for the next statement
        (:mod:`scheduler.store.plumbing.write_batch`); else each runs when it is asked for."""
        ...

    @property
    def multi_row_inserts(self) -> bool:
        """Whether a batch of rows (``enqueue_many``'s occurrences, many events) is written as
        multi-row ``INSERT … VALUES`` statements (:mod:`scheduler.store.plumbing.row_inserts`: one
        executor run for many rows, and the occurrences inserted first, returning the identities
        they took) or row by row with ``executemany`` (one prepared statement stepped per row)."""
        ...

    @property
    def copies_rows(self) -> bool:
        """Whether the database streams a batch of rows into a table as one statement
        (:meth:`copy_statement`), for batches no conflict can skip: ``enqueue_many``'s new
        occurrences, many events; else they go as inserts."""
        ...

    def copy_statement(self, schema: str | None, table: str, columns: Sequence[str]) -> str:
        """The statement that streams rows of ``columns`` into ``table`` (in ``schema``, or the
        connection's own): PostgreSQL's ``COPY … FROM STDIN``. Only where :attr:`copies_rows`."""
        ...

    def claim(
        self,
        tx: Tx,
        claims: Claims,
        claim_filter: ClaimFilter,
        limit: int,
        contention: ClaimContention | None,
        probed: Sequence[StoredRow] | None,
    ) -> None:
        """Up to ``limit`` successive claims into ``claims``, each preceded by the seed's sweep
        (``leases.claim_in``): the serial reading of a claim plan where one writer runs at a
        time; among concurrent writers the candidates are locked first (the heads of the queue,
        a window of them, or the full list, as ``contention`` suggests)."""
        ...

    def lock_target(self, tx: Tx, occurrence_id: str) -> None:
        """Hold the named occurrence before a targeted claim reads it (nothing where writers are
        serialized)."""
        ...

    def lock_sweep(self, tx: Tx, batch: Sequence[StoredRow]) -> Sequence[StoredRow]:
        """The rows of a sweep batch this transaction may sweep: those it could lock, as they are
        now (the batch itself where writers are serialized)."""
        ...

    def settle_tactic(self, call: CallMode, rows: int) -> SettleTactic:
        """How a settlement of ``rows`` rows in ``call`` guards what it read (:data:`SettleTactic`)."""
        ...

    def read_cycle(
        self,
        tx: Tx,
        request: SettleRequest,
        claim_filter: ClaimFilter,
        contention: ClaimContention | None,
    ) -> CycleRead | None:
        """Read a ``settle_and_claim``'s settled row and the heads of the queue in one statement
        where the backend does (``None``: the settlement reads its row and the claim its
        candidates, the usual way)."""
        ...

    def leave_cycle_to_writes(
        self,
        tx: Tx,
        request: SettleRequest,
        lease_ms: int,
        claim_filter: ClaimFilter,
        contention: ClaimContention | None,
    ) -> bool:
        """Leave a whole ``settle_and_claim`` to the call's writes statement where the backend and
        the call allow it (``Tx.pick``: its result once the writes were sent); ``False`` to run
        it the usual way."""
        ...

    def leave_enqueue_to_writes(self, tx: Tx, request: EnqueueCall, lock: tuple[str, str]) -> bool:
        """Leave a whole ``enqueue_occurrence`` to the call's writes statement where the backend
        and the call allow it (``Tx.pick``: its result once the writes were sent); ``False`` to
        run it the usual way. ``lock``: the scope and key the usual way holds (``Tx.lock_keys``)."""
        ...

    def leave_claim_to_writes(
        self,
        tx: Tx,
        owner: str,
        lease_ms: int,
        claim_filter: ClaimFilter,
        contention: ClaimContention | None,
    ) -> bool:
        """:meth:`leave_cycle_to_writes` for a ``claim_next`` (``Tx.pick``'s result: ``claim_in``'s
        list)."""
        ...

    def leave_settle_to_writes(self, tx: Tx, request: SettleRequest) -> bool:
        """:meth:`leave_cycle_to_writes` for a ``settle``."""
        ...

    # ------------------------------------------------------------- catalog

    def schema_header(self, conn: Connection, target: SchemaTarget) -> tuple[int, int | None]:
        """(application id, schema version or ``None`` when the ``migrations`` rows tell it)."""
        ...

    # ------------------------------------------------------------- wake-ups

    def wake_channel(self, schema: str) -> str | None:
        """Where committed writes that made work claimable notify idle workers (``None``: no
        ``NOTIFY``; workers poll)."""
        ...

    def settle_channel(self, schema: str) -> str | None:
        """Where a store with ``notify_settled`` notifies the end of an occurrence (``None``: no
        ``NOTIFY``)."""
        ...

    def send_wakeup(self, conn: Connection, channel: str) -> None:
        """Queue one notification on ``channel`` in ``conn``'s transaction (delivered at COMMIT)."""
        ...


__all__ = ["Backend", "CycleRead", "EnqueueCall", "KeyLocks", "NamedStatements", "SettleTactic"]
