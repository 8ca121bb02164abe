"""The view one store operation has of its transaction: ``Tx``.

A runner (:mod:`scheduler.store.plumbing.session`) opens the transaction, samples the clock and hands
the operation a ``Tx``: statement execution through the schema target (and the SQLite fast
path), the call's ``now``, key locks, and the event rows the call appends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar, overload

from sqlalchemy import Connection, Row, Table, insert
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable

from scheduler.backends.interface import Backend
from scheduler.contract.canonical import canonical_json
from scheduler.contract.errors import SchedulerKernelError
from scheduler.contract.scalars import normalize_epoch_ms
from scheduler.schema import tables as t
from scheduler.store.plumbing.fastpath import FastPath
from scheduler.store.plumbing.restart import RestartTransaction as RestartTransaction  # re-exported
from scheduler.store.plumbing.restart import WholeCycleMissed as WholeCycleMissed  # re-exported
from scheduler.store.plumbing.row_inserts import chunked
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.write_batch import (
    EVENT_COLUMNS,
    MULTI_ROW_EVENTS,
    combined,
    combined_parameters,
    event_rows_insert,
    event_rows_parameters,
)

T = TypeVar("T")
Clock = Callable[[], int]
KeyLocks = Callable[[Connection, str, list[str]], None]


@dataclass(frozen=True, slots=True)
class CallMode:
    """How the runner runs this attempt of a call: facts of the call, not of the backend, which
    the backend reads where it chooses a tactic (:mod:`scheduler.backends.interface`)."""

    may_run_again: bool = False
    """The store owns the transaction and may run the call again from the start (nothing is
    committed before the call returns): a claim takes no savepoint and raises
    :class:`RestartTransaction` where it would have rolled back to one. Only the first attempt
    of a store-owned write, on a backend that runs such writes again
    (``Backend.reruns_owned_writes``)."""
    as_one_statement: bool = True
    """The call may be sent as one statement (a quiet ``settle_and_claim``, ``claim_next`` or
    ``settle``: PostgreSQL's ``cycle_statement``, ``claim_statement``, ``settle_statement``):
    false when the call runs again after that statement's check failed."""


NESTED: Final = CallMode()
"""An operation in a transaction someone else owns (a savepoint of it)."""


def read_clock(clock: Clock) -> int:
    """One clock reading, checked to be an epoch-ms integer."""
    return normalize_epoch_ms(clock(), "clock result")


EVENT_INSERT: Final = Prepared(insert(t.events))
"""One ``events`` row (the columns ``append_event`` and ``EventLog`` write)."""
EVENT_CHUNKS: Final = (64, 16)
"""Row counts of the multi-row ``INSERT``s of many events (fewer rows go with ``executemany``)."""
EVENTS_COPIED_AT: Final = 64
"""Event rows of one call that go as one ``COPY`` (where the backend has it). Below, they go as
multi-row inserts, the last one carrying the ``COMMIT`` where it is a named statement: a worker
group's events measured no faster as a ``COPY`` from 8 rows (slightly slower at 8 lanes)."""


class PendingWrites(Protocol):
    """Work left to the statement that sends the call's kept writes (:meth:`Tx.pick_later`): a
    whole successful cycle, claim or settle (PostgreSQL's ``cycle_statement.PendingCycle``,
    ``claim_statement.PendingClaim``, ``settle_statement.PendingSettle``)."""

    @property
    def settles(self) -> bool:
        """Whether the statement may end an occurrence (its events are known once it ran)."""
        ...

    @property
    def missed(self) -> type[RestartTransaction]:
        """Raised when the statement's check fails (nothing it sent was applied)."""
        ...

    @property
    def lead(self) -> tuple[Prepared, dict[str, Any]] | None:
        """A statement to run just before the writes statement (in the same round trip where both
        are named), so that the writes statement's snapshot is taken after it ran."""
        ...

    @property
    def events(self) -> Sequence[dict[str, Any]]:
        """The ``events`` rows the statement wrote (once :meth:`resolve` ran)."""
        ...

    def writes(
        self,
        kept: Sequence[tuple[Prepared, dict[str, Any]]],
        expected: Sequence[int],
        other_events: Sequence[dict[str, Any]],
    ) -> tuple[Prepared, dict[str, Any]]:
        """The statement sending ``kept`` (each expected to write ``expected`` rows), this work
        and ``other_events``, checking itself (``write_batch.count_check``), and its parameters."""
        ...

    def resolve(self, row: Any) -> None:
        """Take the statement's result row."""
        ...

    def completed(self, result: Any) -> Any:
        """The call's result, from what the operation returned before the statement ran."""
        ...


@dataclass(frozen=True, slots=True)
class KeptWrite:
    """A one-row write kept by :meth:`Tx.write_later` until the next statement that could see it."""

    statement: Prepared
    parameters: dict[str, Any]
    expected: int
    conflict: Callable[[], Exception]
    row: tuple[str, str]
    claim_reads_may_pass: bool


class Tx:
    """One transaction as seen by an operation: the connection, ``now`` and small helpers.

    ``all``/``first``/``changes`` run a :class:`~scheduler.store.plumbing.statement_plans.Prepared` hot
    statement through the compile-once fast path when it is usable, else like ``execute``. Every statement
    reaches the scheduler's tables through the store's schema (``options`` carries its
    ``schema_translate_map`` per statement, so a caller's connection is never altered).
    """

    __slots__ = (
        "_conn",
        "_fast",
        "_kept",
        "_kept_events",
        "_key_locks",
        "_now",
        "_pick",
        "_sampler",
        "_uuid_factory",
        "backend",
        "call",
        "claim_savepoint_kept",
        "events",
        "finish",
        "options",
        "pick",
    )

    def __init__(
        self,
        conn: Connection,
        now: int | None,
        uuid_factory: Callable[[], str],
        fast: FastPath | None = None,
        options: dict[str, Any] | None = None,
        sampler: Clock | None = None,
        key_locks: KeyLocks | None = None,
        *,
        backend: Backend,
        call: CallMode = NESTED,
    ) -> None:
        self._conn = conn
        self.backend = backend
        """The database this transaction runs on: its tactics (claims, settlements, kept writes)."""
        self.call = call
        """How the runner runs this attempt (:class:`CallMode`)."""
        self._kept: list[KeptWrite] = []
        self._kept_events: list[dict[str, Any]] = []
        self._now = now
        self._sampler = sampler
        self._key_locks = key_locks
        self._uuid_factory = uuid_factory
        self._fast = fast
        self.options = options
        self.events: list[dict[str, Any]] = []
        """The ``events`` rows written in this transaction (logged after commit: ``telemetry``)."""
        self._pick: PendingWrites | None = None
        self.pick: PendingWrites | None = None
        """The work left to the writes statement in this transaction (:meth:`pick_later`), sent
        or not yet; its results are its own once the writes were sent."""
        self.finish: Callable[[Any], Any] | None = None
        """Applied by the runner to the call's result once its writes were sent (work done by
        the writes statement: :meth:`pick_later`)."""
        self.claim_savepoint_kept = False
        """The claim-lock savepoint was just rolled back to (or locked nothing) and no statement
        that writes or locks ran since, so the next lock round may start from it
        (:mod:`scheduler.backends.postgresql.claim_locks`); such a statement clears it."""

    @property
    def conn(self) -> Connection:
        """The connection, inside the transaction: a ``BEGIN`` the fast path still keeps for its
        first statement is sent first (:meth:`FastPath.defer_begin`)."""
        if self._fast is not None:
            self._fast.ensure_begun(self._conn)
        return self._conn

    @property
    def now(self) -> int:
        """The call's time in epoch ms: the injected clock's sample taken when the transaction
        began, or the server clock (PostgreSQL, ``clock=None``) read once, on first use, which
        the operations reach only after locking the rows they decide on (API §8)."""
        now = self._now
        if now is None:
            if self._sampler is None:
                raise RuntimeError("this transaction was opened without a clock sample")
            now = self._now = read_clock(self._sampler)
        return now

    @property
    def clock_sample(self) -> int | None:
        """The injected clock's sample of this call (``None`` with the server clock)."""
        return self._now if self._sampler is None else None

    @property
    def clock_unread(self) -> bool:
        """Whether ``now`` is the server clock and not read yet: a statement that locks the
        call's rows may read it after the lock (:meth:`adopt_clock`) and save its own round trip."""
        return self._now is None and self._sampler is not None

    def adopt_clock(self, value: Any) -> None:
        """Take ``value`` (the server clock, read after this call's rows were locked) as ``now``."""
        self._now = normalize_epoch_ms(value, "clock result")

    def lock_keys(self, scope: str, keys: Iterable[str]) -> None:
        """Hold ``keys`` of ``scope`` until the transaction ends: a concurrent transaction locking
        one of them waits, so a read-check-create step on a row that may not exist yet runs as in
        some serial order. PostgreSQL: advisory transaction locks, taken in sorted order; SQLite:
        nothing (``BEGIN IMMEDIATE`` already serializes writers)."""
        if self._key_locks is not None:
            self._before(None)
            self._key_locks(self.conn, scope, sorted(set(keys)))

    def write_later(
        self,
        statement: Prepared,
        parameters: dict[str, Any],
        *,
        expected: int,
        conflict: Callable[[], Exception],
        row: tuple[str, str],
        claim_reads_may_pass: bool = False,
    ) -> None:
        """Run a one-row write now, or keep it to be sent with the next write (the same
        statement on PostgreSQL: :mod:`scheduler.store.plumbing.write_batch`); either way ``conflict()``
        is raised unless it changes ``expected`` rows.

        A kept write is sent before any other statement runs, but for the claim reads marked
        ``Prepared.passes_kept_writes`` when every kept write says ``claim_reads_may_pass``: the
        row it writes (``row``: table and key, locked by this transaction) is claimable or
        sweepable at ``now`` neither before nor after the write, so those reads see the same
        with or without it.
        """
        if not self.backend.combines_writes:
            if self.changes(statement, parameters) != expected:
                raise conflict()
            return
        if any(kept.row == row for kept in self._kept):
            self.flush_writes()
        self._kept.append(KeptWrite(statement, parameters, expected, conflict, row, claim_reads_may_pass))

    @property
    def uses_fast_path(self) -> bool:
        """Whether this transaction's statements go through the compile-once fast path."""
        return self._fast is not None

    def pick_later(self, pick: PendingWrites) -> None:
        """Leave ``pick`` (a whole cycle: :mod:`scheduler.backends.postgresql.cycle_statement`) to
        the statement that sends the kept writes; it has its results once that ran. Only in a call
        the store may run again, on a backend that combines writes, through the fast path (the
        backend's tactic decides)."""
        assert self.call.may_run_again and self.backend.combines_writes and self.uses_fast_path
        assert self.pick is None
        self._pick = self.pick = pick

    def flush_writes(self, events: Sequence[dict[str, Any]] = (), *, commit: bool = False) -> None:
        """Send the kept writes and events and ``events`` (``events`` rows), then check each
        write's count.

        Kept writes and up to ``MULTI_ROW_EVENTS`` event rows go as one statement where the
        backend combines writes; more event rows follow in one ``executemany``. With ``commit``
        (the call's end, in a call the store may run again) that statement checks the counts itself and
        the ``COMMIT`` may go with it (``FastPath.run``), or with the ``executemany`` of the
        events that follow; a count that is not the one expected then runs the call again
        (``RestartTransaction``), which reports the conflict.
        """
        kept, self._kept = self._kept, []
        rest = [*self._kept_events, *events]
        self._kept_events = []
        pick, self._pick = self._pick, None
        if pick is not None:
            self._flush_pick(pick, kept, rest, commit)
            return
        parts = [(write.statement, write.parameters) for write in kept]
        if rest and len(rest) <= MULTI_ROW_EVENTS and (kept or len(rest) > 1 or commit):
            parts.append((event_rows_insert(len(rest)), event_rows_parameters(rest)))
            rest = []
        if commit and parts and not rest and self._fast is not None:
            self._flush_and_commit(kept, parts)
            return
        if len(parts) > 1:
            counts = tuple(self.first(combined(tuple(part for part, _ in parts)), combined_parameters(parts)))
        else:
            counts = tuple(self.changes(statement, parameters) for statement, parameters in parts)
        for write, count in zip(kept, counts, strict=False):
            if count != write.expected:
                raise write.conflict()
        if rest:
            self._insert_events(rest, commit)

    def _insert_events(self, rows: list[dict[str, Any]], commit: bool) -> None:
        """Many event rows: at least :data:`EVENTS_COPIED_AT` in one ``COPY`` where the backend has
        it; else as multi-row ``INSERT``s of :data:`EVENT_CHUNKS` rows, the rest in one
        ``executemany`` (the ``COMMIT`` goes with the last statement where it is a named one)."""
        if (
            len(rows) >= EVENTS_COPIED_AT
            and self.copies_rows
            and self.copy_rows(t.events, EVENT_COLUMNS, rows)
        ):
            return
        chunks, left = chunked(rows, EVENT_CHUNKS) if self.backend.multi_row_inserts else ([], rows)
        parts: list[tuple[Prepared, Any]] = [
            (event_rows_insert(len(chunk)), event_rows_parameters(chunk)) for chunk in chunks
        ]
        if left:
            parts.append((EVENT_INSERT, left[0] if len(left) == 1 else list(left)))
        *before, (statement, parameters) = parts
        for earlier, values in before:
            self.changes(earlier, values)
        fast = self._fast
        if commit and fast is not None and fast.run(self._conn, statement, parameters, commit=True):
            return
        self.changes(statement, parameters)

    def _flush_and_commit(self, kept: list[KeptWrite], parts: list[tuple[Prepared, dict[str, Any]]]) -> None:
        statement = combined(tuple(part for part, _ in parts), checked=len(kept))
        parameters = combined_parameters(parts, [write.expected for write in kept])
        fast = self._fast
        assert fast is not None
        try:
            done = fast.run(self._conn, statement, parameters, commit=True)
            counts = tuple(done[0][0] if done is not None else self.first(statement, parameters))
        except DBAPIError as error:
            if self.backend.counts_differed(error):
                raise RestartTransaction from error
            raise
        for write, count in zip(kept, counts, strict=False):
            if count != write.expected:
                raise write.conflict()

    def _flush_pick(
        self, pick: PendingWrites, kept: list[KeptWrite], rest: list[dict[str, Any]], commit: bool
    ) -> None:
        """The kept writes, the pending work and the events as one checked statement (with the
        ``COMMIT`` where ``commit``); a count not as expected runs the call again."""
        fast = self._fast
        if fast is None or len(rest) > MULTI_ROW_EVENTS:
            raise RestartTransaction  # run again without leaving the work to the writes
        statement, parameters = pick.writes(
            [(write.statement, write.parameters) for write in kept], [write.expected for write in kept], rest
        )
        lead = pick.lead
        try:
            done = (
                None if lead is None else fast.run_led(self._conn, lead, statement, parameters, commit=commit)
            )
            if done is None and lead is not None:
                self.first(*lead)  # a round trip of its own (not named yet)
            if done is None:
                done = fast.run(self._conn, statement, parameters, commit=commit)
            row = done[0][0] if done is not None else self.first(statement, parameters)
        except DBAPIError as error:
            if self.backend.counts_differed(error):
                raise pick.missed from error
            raise
        pick.resolve(row)
        self.events.extend(pick.events)

    def _before(self, statement: Prepared | None) -> None:
        """Send the kept writes and events before a statement that could see them."""
        kept = self._kept
        if (kept or self._kept_events or self._pick is not None) and not (
            statement is not None
            and (
                statement.ignores_kept_writes
                or (
                    self._pick is None
                    and statement.passes_kept_writes
                    and all(write.claim_reads_may_pass for write in kept)
                )
            )
        ):
            self.flush_writes()

    def _run(self, statement: Prepared, parameters: Any) -> tuple[list[Any], int] | None:
        self._before(statement)
        if statement.locks:
            self.claim_savepoint_kept = False
        fast = self._fast
        return None if fast is None else fast.run(self._conn, statement, parameters)

    def driver_sql(self, sql: str) -> None:
        """Run a statement without parameters or rows (``SAVEPOINT …``) as the driver's text."""
        self._before(None)
        self.claim_savepoint_kept = False
        if self._fast is not None:
            self._fast.run_driver_sql(self._conn, sql)
        else:
            self.conn.exec_driver_sql(sql)

    def execute(self, statement: Executable | Prepared, parameters: Any = None) -> CursorResult[Any]:
        self._before(statement if isinstance(statement, Prepared) else None)
        if isinstance(statement, Prepared):
            if statement.locks:
                self.claim_savepoint_kept = False
            statement = statement.statement
        else:
            self.claim_savepoint_kept = False
        return self.conn.execute(statement, parameters, execution_options=self.options)

    def all(self, statement: Executable | Prepared, parameters: Any = None) -> Sequence[Any]:
        """Every result row (SQLAlchemy rows, or fast-path rows with the same attribute access)."""
        if isinstance(statement, Prepared):
            done = self._run(statement, parameters)
            if done is not None:
                return done[0]
        return self.execute(statement, parameters).all()

    @overload
    def first(self, statement: Prepared, parameters: Any = None) -> Any: ...

    @overload
    def first(self, statement: Executable, parameters: Any = None) -> Row[Any] | None: ...

    def first(self, statement: Executable | Prepared, parameters: Any = None) -> Any:
        """The first result row, or ``None``."""
        if isinstance(statement, Prepared):
            done = self._run(statement, parameters)
            if done is not None:
                return done[0][0] if done[0] else None
        return self.execute(statement, parameters).first()

    def scalar(self, statement: Executable, parameters: Any = None) -> Any:
        return self.execute(statement, parameters).scalar()

    def changes(self, statement: Executable | Prepared, parameters: Any = None) -> int:
        """Run a DML statement (``executemany`` for a list of dicts); how many rows it changed.

        A driver that cannot count an ``executemany`` (asyncpg) runs the parameter sets one by
        one, so the count stays exact (the compare-and-set checks rely on it).
        """
        if isinstance(statement, Prepared):
            done = self._run(statement, parameters)
            if done is not None:
                return done[1]
        if isinstance(parameters, list) and not self.conn.dialect.supports_sane_multi_rowcount:
            return sum(int(self.execute(statement, one).rowcount) for one in parameters)
        return int(self.execute(statement, parameters).rowcount)

    @property
    def copies_rows(self) -> bool:
        """Whether :meth:`copy_rows` streams rows in one statement in this transaction."""
        return self._fast is not None and self._fast.copies_rows

    def copy_rows(self, table: Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> bool:
        """Stream ``rows`` (their values of ``columns``) into ``table`` in one statement where the
        backend has one (``Backend.copy_statement``) and the fast path runs; whether it did
        (``False``: nothing was written). For rows no conflict can skip: any error fails the call."""
        if self._fast is None or not rows:
            return False
        self._before(None)
        self.claim_savepoint_kept = False
        values = [tuple(row[name] for name in columns) for row in rows]
        return self._fast.copy_rows(self._conn, table, columns, values)

    def new_uuid(self) -> str:
        value = self._uuid_factory()
        if not isinstance(value, str):
            raise SchedulerKernelError("SCHEDULER_INVALID_ARGUMENT", "uuidFactory must return a string")
        return value

    def append_event(
        self,
        *,
        job_id: str,
        type: str,
        occurrence_id: str | None = None,
        owner_id: str | None = None,
        fence: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Append one row to the event history (occurred at ``now``)."""
        row = {
            "job_id": job_id,
            "occurrence_id": occurrence_id,
            "event_type": type,
            "occurred_at": self.now,
            "owner_id": owner_id,
            "fence": fence,
            "data_json": canonical_json({} if data is None else data, "event.data"),
        }
        self._keep_events([row])
        self.events.append(row)

    def insert_events(self, rows: list[dict[str, Any]]) -> None:
        """Append several event rows, sent with the kept writes (one statement where it can be)."""
        self._keep_events(rows)
        self.events.extend(rows)

    def _keep_events(self, rows: list[dict[str, Any]]) -> None:
        """Where writes are kept, event rows wait for the next statement that could see them
        (no claim read does) or the call's end; elsewhere they are written now."""
        if self.backend.combines_writes:
            self._kept_events.extend(rows)
        else:
            self.flush_writes(rows)
