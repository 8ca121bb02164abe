"""A ``settle_and_claim`` that succeeds, in one statement (PostgreSQL).

A quiet cycle was two round trips: the first statement (``cycle_read``) locked the settled row,
read the clock and the queue's heads and locked a plain head; Python decided the settlement and
the claim on those rows; the second statement wrote them with the ``COMMIT``. When the
settlement succeeds, holds its lease and has no control, reservation or adjudication row, and
the head is a plain waiting row (``claim_plan.plain``) locked as probed, what Python decides is
fixed by the rows: the settled row becomes ``succeeded`` (``settlement._next_state``), the head
is claimed with one more attempt and fence (``Claims.prepare``), and the two events' data are
``{"attempt":…,"maxAttempts":…}`` and ``claim_data_json``'s. So one statement, sent with the
transaction's ``BEGIN`` and ``COMMIT`` in one round trip, does all of it, after a lead statement
in the same query that locks the settled row (:attr:`PendingCycle.lead`)::

    WITH <cycle_read.settled_lock: the settled row locked, then the clock read>,
         <claim_query.head_probe_and_lock: the heads, and a plain head locked SKIP LOCKED>,
         settled AS (<settlement's guarded settle UPDATE, for a success, at the clock read>
                     WHERE <no control, reservation or adjudication read; the row locked is the
                            version the snapshot reads; the lock did not wait long>
                     RETURNING occurrences.*),
         claimed AS (<leases' guarded claim UPDATE of the locked head> FROM locked
                     WHERE <the head as locked is the version probed; no previous owner;
                            the lease's expiry a safe integer> RETURNING …),
         ev AS (INSERT INTO events … <the settlement's event> UNION ALL <the claim's>)
    SELECT <check>, <clock>, <settled row>, <claimed row>

Why the lead lock: the statement reads the settled row's control, reservation and adjudication
on its snapshot, taken when it starts. Their writers lock the occurrence row first, then write
those rows; one that committed after that snapshot but before the statement's own lock (no wait,
or a short one) would be invisible to it, and its pause request would be left on a settled
occurrence. (The two-statement cycle checks them again in its writes statement, on a newer
snapshot.) Locked by the statement before, the row can no longer change, and the cycle's
statement reads them on a snapshot taken after that lock. The head needs no such lead: a control
or requeue row can only be added to a row that is running or a dead letter, a change of the head
its version check sees.

Among workers that hold the first candidates (``ClaimContention`` not quiet) the statement reads
the window of heads instead of the head (:func:`_window_and_lock`): the candidates
``claim_plan.window_plan`` yields, in the seed's order, up to the first row that is not plain and
no further than the last row of an arm that may hold unread rows; the first one free is locked
``SKIP LOCKED`` at its version as read (:func:`_version_sql`). A row passed over because its
version changed stays locked until the ``COMMIT`` in the same round trip. The claimed row's
place (``c_position``) tells ``ClaimContention`` whether the first candidate was free.

The check (``write_batch.count_check``) fails the statement, and the ``COMMIT`` with it, unless
the settlement wrote its row and either the head was claimed or nothing is due; the call then
runs again the usual way (``RestartTransaction``), which decides every other case — a lost
lease, an expired lease to sweep or reclaim, a head another worker holds or that is not plain (quiet),
no free candidate before the window's first row that is not plain or past its known order
(among workers), an unrepresentable lease expiry — and reports its error exactly as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    String,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    insert,
    literal_column,
    not_,
    or_,
    select,
    true,
)
from sqlalchemy.sql.elements import BindParameter

from scheduler.backends.postgresql.claim_locks import ClaimContention
from scheduler.backends.postgresql.cycle_read import MAX_WAIT_US, settled_lock
from scheduler.contract.constants import MAX_SAFE_INTEGER, SUCCEEDED
from scheduler.schema import tables as t
from scheduler.store.capabilities.authority import LOCK_OCCURRENCE
from scheduler.store.capabilities.claim_query import (
    ARM_EXPIRED,
    HEAD_WINDOW,
    ClaimFilter,
    HeadLock,
    Shape,
    build_head_window,
    head_probe_and_lock,
    head_probe_params,
    locked_key_columns,
    plain_sql,
    replace_binds,
)
from scheduler.store.capabilities.occurrence_rows import occurrence_record
from scheduler.store.capabilities.settle_request import SettleRequest
from scheduler.store.capabilities.settlement import guarded_settle_update
from scheduler.store.plumbing.restart import RestartTransaction, WholeCycleMissed
from scheduler.store.plumbing.statement_plans import STATEMENTS_LOCK, Prepared
from scheduler.store.plumbing.telemetry import records_event
from scheduler.store.plumbing.tx import Tx
from scheduler.store.plumbing.write_batch import EVENT_COLUMNS, count_check
from scheduler.store.records import Occurrence, SettledAndClaimed

SETTLED: Final = "occurrence_succeeded"
CLAIMED: Final = "occurrence_claimed"
_o = t.occurrences
_NAMES: Final = tuple(column.name for column in _o.c)
_MAX_SAFE: Final[Any] = literal_column(str(MAX_SAFE_INTEGER))


def _version_sql(table: Any) -> Any:
    """``id:fence:status:attempt:available_at:scheduled_for`` of a row: one value that changes
    whenever a candidate's claim would (the fence, attempt and times are integers and no status
    contains ``:``, so it is unambiguous)."""
    expression: Any = table.c.occurrence_id
    for name in ("fence", "status", "attempt", "available_at", "scheduled_for"):
        value = table.c[name]
        expression = expression + literal_column("':'") + (value if name == "status" else cast(value, String))
    return expression


def _succeeded(lock: Any) -> Any:
    """The settlement's ``UPDATE`` for a success (``settlement.guarded_settle_update``, its
    values as ``_next_state`` decides them) of the row ``lock`` read, if that row was read
    without a control, reservation or adjudication, as the version the snapshot reads, and
    without a long lock wait (``cycle_read.read_cycle``'s checks)."""
    current = lock.current
    values = {
        "p_now": lock.now,
        "p_status": literal_column(f"'{SUCCEEDED}'"),
        "p_available": _o.c.available_at,
        "p_error": literal_column("NULL"),
        "p_settled": lock.now,
    }
    waited = select(lock.clock.c.waited_us).scalar_subquery()
    return (
        replace_binds(guarded_settle_update(), lambda element: values.get(element.key))
        .where(
            current.c.occurrence_id == _o.c.occurrence_id,
            current.c.control_state.is_(None),
            current.c.reservation_status.is_(None),
            current.c.adjudication_status.is_(None),
            current.c.row_version == lock.version_as_read,
            waited <= MAX_WAIT_US,
        )
        .returning(*_o.c)
        .cte("settled")
    )


def _window_and_lock(shape: Shape, now: Any, lock_if: Any) -> HeadLock:
    """The window of heads (``claim_query.build_head_window``) and its first free candidate locked
    ``FOR UPDATE SKIP LOCKED`` at its version as read (``locked``, with its ``position`` in the
    seed's order, 1 for the first). The candidates are the window's due rows in that order, as
    ``claim_plan.window_plan`` yields them, cut before the first row that is not plain
    (``claim_query.plain_sql``: the Python path claims such a row) and after the
    last row of an arm that returned ``HEAD_WINDOW`` rows (past it the order is unknown); none
    when an expired lease is to be acted on. A candidate another transaction holds is passed over,
    and so is one changed since the snapshot: PostgreSQL checks the version again on the row it
    locks, and ``LIMIT 1`` then takes the next."""
    probe = build_head_window(shape, now, slim=True).cte("probe").prefix_with("MATERIALIZED")
    expired = probe.alias("probe_expired")
    key = (probe.c.available_at, probe.c.scheduled_for, probe.c.occurrence_id)
    ranked = (
        select(
            probe.c.occurrence_id,
            _version_sql(probe).label("version"),
            plain_sql(probe).is_(True).label("plain"),
            func.row_number().over(order_by=key).label("position"),
            func.row_number().over(partition_by=probe.c.arm, order_by=key).label("arm_rank"),
            func.count().over(partition_by=probe.c.arm).label("arm_rows"),
        )
        .where(
            probe.c.arm != literal_column(f"'{ARM_EXPIRED}'"),
            ~exists().where(expired.c.arm == literal_column(f"'{ARM_EXPIRED}'")),
        )
        .cte("ranked")
    )
    full_arm_ends = and_(ranked.c.arm_rows == HEAD_WINDOW, ranked.c.arm_rank == HEAD_WINDOW)
    last = select(
        func.min(
            case(
                (not_(ranked.c.plain), ranked.c.position - 1),
                (full_arm_ends, ranked.c.position),
            )
        )
    ).scalar_subquery()
    occurrences = t.occurrences
    locked = (
        select(*locked_key_columns(occurrences), ranked.c.position)
        .select_from(occurrences.join(ranked, occurrences.c.occurrence_id == ranked.c.occurrence_id))
        .where(
            ranked.c.plain,
            ranked.c.position <= func.coalesce(last, ranked.c.position),
            _version_sql(occurrences) == ranked.c.version,
            lock_if,
        )
        .order_by(ranked.c.position)
        .limit(literal_column("1"))
        .with_for_update(of=occurrences, skip_locked=True)
        .cte("locked")
        .prefix_with("MATERIALIZED")
    )
    return HeadLock(probe, ranked, locked)


def _claimed(claim: Any, probe: Any, locked: Any, now: Any, expires: Any) -> Any:
    """The claim ``UPDATE`` (a fresh copy of ``claim_writes.CLAIM_GUARDED``'s statement) of the head
    ``locked``, at its version as probed, with what ``Claims.prepare`` writes for a plain row."""
    values = {
        "p_id": locked.c.occurrence_id,
        "p_fence": locked.c.fence,
        "p_attempt": _o.c.attempt + 1,
        "p_next_fence": _o.c.fence + 1,
        "p_expires": expires,
        "p_now": now,
    }

    def replace(element: BindParameter[Any]) -> Any:
        return values.get(element.key)

    probed = (
        select(_version_sql(probe)).where(probe.c.occurrence_id == locked.c.occurrence_id).scalar_subquery()
    )
    return (
        replace_binds(claim, replace)
        .where(
            _version_sql(_o) == probed,
            _o.c.lease_owner.is_(None),
            expires <= _MAX_SAFE,
        )
        .returning(*_o.c, locked.c.status.label("previous_status"))
        .cte("claimed")
    )


def _settled_data_sql(settled: Any) -> Any:
    """The settlement event's data of a row with no reservation, succeeded
    (``settlement.settlement_event_data``)."""
    return (
        literal_column("""'{"attempt":'""")
        + cast(settled.c.attempt, String)
        + literal_column("""',"maxAttempts":'""")
        + cast(settled.c.max_attempts, String)
        + literal_column("'}'")
    )


def settled_data_json(attempt: int, max_attempts: int) -> str:
    """:func:`_settled_data_sql` as Python text (the canonical JSON of the same dict)."""
    return f'{{"attempt":{attempt},"maxAttempts":{max_attempts}}}'


def _claim_data_sql(claimed: Any) -> Any:
    """The claim event's data of a plain waiting row (``Claims.prepare``): ``claimed``'s
    ``attempt`` and ``previous_status``, no previous owner."""
    return (
        literal_column("""'{"attempt":'""")
        + cast(claimed.c.attempt, String)
        + literal_column("""',"previousOwner":null,"previousStatus":"'""")
        + claimed.c.previous_status
        + literal_column("""'"}'""")
    )


def claim_data_json(attempt: int, previous_status: str) -> str:
    """:func:`_claim_data_sql` as Python text (the canonical JSON of the same dict)."""
    return f'{{"attempt":{attempt},"previousOwner":null,"previousStatus":"{previous_status}"}}'


def _build(claim: Callable[[], Any], shape: Shape, server_clock: bool, window: bool) -> Prepared:
    lock = settled_lock(server_clock, slim=True)
    now = lock.now
    expires = now + bindparam("p_lease", type_=BigInteger())
    if window:
        heads = _window_and_lock(shape, now, lock.lease_held)
        position: Any = select(heads.locked.c.position).scalar_subquery()
    else:
        heads = head_probe_and_lock(shape, now=now, lock_if=lock.lease_held, slim=True)
        position = literal_column("1")
    settled = _succeeded(lock)
    claimed = _claimed(claim(), heads.probe, heads.locked, now, expires)
    owner = bindparam("p_owner", type_=_o.c.lease_owner.type)

    def event(row: Any, event_type: str, data: Any) -> Any:
        return select(
            row.c.job_id,
            row.c.occurrence_id,
            literal_column(f"'{event_type}'"),
            now,
            owner,
            row.c.fence,
            data,
        )

    events = (
        insert(t.events)
        .from_select(
            list(EVENT_COLUMNS),
            event(settled, SETTLED, _settled_data_sql(settled)).union_all(
                event(claimed, CLAIMED, _claim_data_sql(claimed))
            ),
        )
        .returning(literal_column("1"))
        .cte("ev")
    )

    def count(cte: Any) -> Any:
        return select(func.count()).select_from(cte).scalar_subquery()

    decided = and_(
        count(settled) == 1,
        or_(count(claimed) == 1, count(heads.probe) == 0),
        count(events) == 1 + count(claimed),
        expires <= _MAX_SAFE,
    )
    statement = select(
        count_check((), decided),
        lock.clock.c.now.label("server_now"),
        *[settled.c[name].label("s_" + name) for name in _NAMES],
        *[claimed.c[name].label("c_" + name) for name in _NAMES],
        claimed.c.previous_status.label("c_previous_status"),
        position.label("c_position"),
    ).select_from(lock.clock.outerjoin(settled, true()).outerjoin(claimed, true()))
    return Prepared(statement, locks=True)


@functools.cache
def _statement(claim: Callable[[], Any], shape: Shape, server_clock: bool, window: bool) -> Prepared:
    with STATEMENTS_LOCK:  # built from module-level statements every thread shares
        return _build(claim, shape, server_clock, window)


class PendingCycle:
    """A successful ``settle_and_claim`` left whole to the call's writes statement
    (``Tx.pick_later``); :attr:`result` once it ran."""

    __slots__ = (
        "_claim",
        "_contention",
        "_filter",
        "_lease_ms",
        "_request",
        "_tx",
        "events",
        "position",
        "result",
    )

    def __init__(
        self,
        tx: Tx,
        claim: Callable[[], Any],
        request: SettleRequest,
        lease_ms: int,
        claim_filter: ClaimFilter,
        contention: ClaimContention,
    ) -> None:
        self._tx = tx
        self._claim = claim
        self._request = request
        self._lease_ms = lease_ms
        self._filter = claim_filter
        self._contention = contention
        self.events: list[dict[str, Any]] = []
        self.result: SettledAndClaimed | None = None
        self.position: int | None = None
        """The claimed row's place among the candidates in the seed's order (1: the first)."""

    @property
    def missed(self) -> type[RestartTransaction]:
        """The call runs again, still one the store may run again, the usual way (``session``)."""
        return WholeCycleMissed

    settles: Final = True
    """The statement settles the call's occurrence (its events are known once it ran)."""

    def completed(self, _unsent: object) -> SettledAndClaimed | None:
        """The call's result is the statement's (:attr:`result`)."""
        return self.result

    @property
    def lead(self) -> tuple[Prepared, dict[str, Any]]:
        """The settled row locked first (``authority.LOCK_OCCURRENCE``, as every writer of its
        control, reservation and adjudication rows locks it): the cycle's statement then reads
        those rows on a snapshot taken after the lock (see the module)."""
        return LOCK_OCCURRENCE, {"occurrence_id": self._request.occurrence_id}

    def writes(
        self,
        kept: Sequence[tuple[Prepared, dict[str, Any]]],
        expected: Sequence[int],
        other_events: Sequence[dict[str, Any]],
    ) -> tuple[Prepared, dict[str, Any]]:
        """The cycle's statement and parameters (the call wrote and kept nothing else)."""
        assert not kept and not expected and not other_events
        tx, request = self._tx, self._request
        server_clock = tx.clock_unread
        parameters = head_probe_params(0 if server_clock else tx.now, self._filter)
        if server_clock:
            del parameters["now"]  # the statement reads its own clock
        parameters["p_id"] = request.occurrence_id
        parameters["p_owner"] = request.owner_id
        parameters["p_fence"] = request.fence
        parameters["p_result"] = request.result_json
        parameters["p_lease"] = self._lease_ms
        window = not self._contention.probe_first
        return _statement(self._claim, self._filter.shape, server_clock, window), parameters

    def resolve(self, row: Any) -> None:
        """Take the statement's row: the call's clock, both records and both events."""
        tx, owner = self._tx, self._request.owner_id
        if tx.clock_unread:
            tx.adopt_clock(row.server_now)
        now = tx.now
        settled = {name: getattr(row, "s_" + name) for name in _NAMES}
        self.events = [
            _event(
                settled, SETTLED, now, owner, settled_data_json(settled["attempt"], settled["max_attempts"])
            )
        ]
        claimed: Occurrence | None = None
        if row.c_occurrence_id is not None:
            values = {name: getattr(row, "c_" + name) for name in _NAMES}
            claimed = occurrence_record(values)
            claim_data = claim_data_json(values["attempt"], row.c_previous_status)
            self.events.append(_event(values, CLAIMED, now, owner, claim_data))
            self.position = row.c_position
            self._contention.took_first(self.position == 1)
        self.result = SettledAndClaimed(settled=occurrence_record(settled), claimed=claimed)


def _event(row: dict[str, Any], event_type: str, now: int, owner: str, data_json: str) -> dict[str, Any]:
    return {
        "job_id": row["job_id"],
        "occurrence_id": row["occurrence_id"],
        "event_type": event_type,
        "occurred_at": now,
        "owner_id": owner,
        "fence": row["fence"],
        "data_json": data_json,
    }


def cycle_in_one_statement(
    tx: Tx,
    claim: Callable[[], Any],
    request: SettleRequest,
    lease_ms: int,
    claim_filter: ClaimFilter,
    contention: ClaimContention | None,
) -> PendingCycle | None:
    """Leave the whole call to one statement where it may be (see the module), returning the
    pending cycle (the call's result is its :attr:`~PendingCycle.result` once the writes were
    sent), else ``None``: a success without an adjudication request, where no settlement or claim
    event is logged or counted (the call's state changes are collected before its writes are
    sent). The backend asks only in a call whose writes may carry the cycle and that was not run
    again after the statement missed (``PostgreSQLBackend.leave_cycle_to_writes``). Quiet, the
    statement claims the head (``claim_query.head_probe_and_lock``); among workers, from the
    window of heads."""
    if not (
        contention is not None
        and request.succeeded
        and request.adjudication_request_id is None
        and not records_event(SETTLED)
        and not records_event(CLAIMED)
    ):
        return None
    pending = PendingCycle(tx, claim, request, lease_ms, claim_filter, contention)
    tx.pick_later(pending)
    return pending
