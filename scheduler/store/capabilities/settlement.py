"""Settlement of a leased attempt (seed v6 ``settle``) and its control/authority/adjudication
bookkeeping; the validated request is :mod:`scheduler.store.capabilities.settle_request`'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from sqlalchemy import and_, bindparam, exists, select, update

from scheduler.contract.canonical import canonical_json
from scheduler.contract.constants import DEAD_LETTER, RETRY_WAIT, RUNNING, SUCCEEDED
from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema import tables as t
from scheduler.store.capabilities.occurrence_rows import EventLog, chunks, occurrence_record, with_index
from scheduler.store.capabilities.settle_request import SettleRequest
from scheduler.store.plumbing.constructs import row_check, server_clock_ms
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.telemetry import log_lease_lost
from scheduler.store.plumbing.tx import RestartTransaction, Tx
from scheduler.store.records import Occurrence

_o = t.occurrences
_c = t.occurrence_controls
_res = t.authority_reservations
_adj = t.adjudications

# The occurrence row is locked (PostgreSQL; nothing on SQLite) before the control, reservation and
# adjudication rows are written, as every writer of those rows does: a claim or sweep holding the
# row is then waited for instead of deadlocked with.
CURRENT_ROWS: Final = select(
    _o,
    _c.c.state.label("control_state"),
    _c.c.expected_fence.label("control_expected_fence"),
    _res.c.status.label("reservation_status"),
    _res.c.policy_revision.label("reservation_policy_revision"),
    _res.c.units.label("reservation_units"),
    _adj.c.status.label("adjudication_status"),
    _adj.c.request_id.label("adjudication_request_id"),
).select_from(
    _o.outerjoin(_c, _c.c.occurrence_id == _o.c.occurrence_id)
    .outerjoin(_res, _res.c.occurrence_id == _o.c.occurrence_id)
    .outerjoin(_adj, _adj.c.occurrence_id == _o.c.occurrence_id)
)
"""An occurrence with its control, reservation and adjudication: what a settlement decides on."""
_CURRENT: Final = Prepared(CURRENT_ROWS.where(_o.c.occurrence_id == bindparam("p_id")).with_for_update(of=_o))
_LOCKED_CURRENT: Final = (
    CURRENT_ROWS.where(_o.c.occurrence_id == bindparam("p_id"))
    .with_for_update(of=_o)
    .cte("locked_current")
    .prefix_with("MATERIALIZED")
)
_CURRENT_THEN_CLOCK: Final = Prepared(
    select(_LOCKED_CURRENT, server_clock_ms().label("server_now")).select_from(_LOCKED_CURRENT), locks=True
)
"""``_CURRENT`` and the server clock read after the row is locked (the materialized CTE runs its
lock before the outer query computes the clock): one round trip fewer per settle on PostgreSQL."""
_CURRENT_MANY: Final = Prepared(
    CURRENT_ROWS.where(_o.c.occurrence_id.in_(bindparam("p_ids", expanding=True))).with_for_update(of=_o)
)
_CURRENT_MANY_THEN_CLOCK: Final = Prepared(
    CURRENT_ROWS.add_columns(server_clock_ms().label("server_now"))
    .where(_o.c.occurrence_id.in_(bindparam("p_ids", expanding=True)))
    .with_for_update(of=_o)
)
"""``_CURRENT_MANY`` with the server clock, for rows this transaction already locked
(``_LOCK_SETTLED``): each row's clock is read after those locks, saving the clock's round trip."""
_LOCK_SETTLED: Final = Prepared(
    select(_o.c.occurrence_id)
    .where(_o.c.occurrence_id.in_(bindparam("p_ids", expanding=True)))
    .order_by(_o.c.occurrence_id)
    .with_for_update()
)
"""The occurrences a settlement will read, locked in id order before they are read (PostgreSQL).

A read that locks the rows and joins their control, reservation and adjudication in one
statement reads the joined rows on the snapshot taken before it waited for a lock: what the
transaction it waited for wrote there (a pause request, whose writer holds the occurrence row)
would be missed. Read after this statement, they are as that transaction left them."""


def live_lease() -> Any:
    """``WHERE`` the occurrence ``p_id`` is running under ``p_owner``'s lease at ``p_fence``,
    unexpired at ``p_now`` (a new clause on each call)."""
    return and_(
        _o.c.occurrence_id == bindparam("p_id"),
        row_check(_o.c.status == RUNNING),
        _o.c.lease_owner == bindparam("p_owner"),
        _o.c.fence == bindparam("p_fence"),
        _o.c.lease_expires_at > bindparam("p_now"),
    )


def _settle_update(*, guarded: bool) -> Any:
    """The settlement ``UPDATE`` of a live lease (a new statement on each call); ``guarded``:
    checking the row still has no control, reservation or adjudication (``_SETTLE_GUARDED``)."""
    statement = (
        update(_o)
        .where(live_lease())
        .values(
            status=bindparam("p_status"),
            available_at=bindparam("p_available"),
            lease_owner=None,
            lease_expires_at=None,
            last_error_json=bindparam("p_error"),
            result_json=bindparam("p_result"),
            updated_at=bindparam("p_now"),
            settled_at=bindparam("p_settled"),
        )
    )
    return statement.where(_NO_AUX_ROWS) if guarded else statement


_NO_AUX_ROWS: Final = and_(
    *(~exists().where(table.c.occurrence_id == _o.c.occurrence_id) for table in (_c, _res, _adj))
)
_SETTLE: Final = Prepared(_settle_update(guarded=False))
_SETTLE_GUARDED: Final = Prepared(_settle_update(guarded=True))
"""``_SETTLE`` of a row read without a control, reservation or adjudication, checking there still
is none.

Their writers lock the occurrence row first, but a read that locks the row in the same statement
reads the joined rows on the snapshot taken before it waited for that lock: a pause request
committed meanwhile would be missed (the control left ``pause_requested`` on a settled row). The
``UPDATE`` runs after the lock, so it sees them as they are; where one appeared, it writes nothing
and the call runs again (``Backend.settle_tactic``: ``check_on_write``). (A row that was read is
written by the settlement with a compare-and-set of its own.)"""
_REBIND_RESUMED: Final = Prepared(
    update(_c)
    .where(
        _c.c.occurrence_id == bindparam("p_id"),
        _c.c.state == "resumed",
        _c.c.expected_fence == bindparam("p_fence"),
    )
    .values(
        expected_fence=bindparam("p_next_fence"), revision=_c.c.revision + 1, updated_at=bindparam("p_now")
    )
)
TERMINALIZE_CONTROL: Final = Prepared(
    update(_c)
    .where(_c.c.occurrence_id == bindparam("p_id"), _c.c.state == bindparam("p_state"))
    .values(
        state="terminal",
        revision=_c.c.revision + 1,
        terminal_at=bindparam("p_now"),
        updated_at=bindparam("p_now"),
    )
)
SETTLE_RESERVATION: Final = Prepared(
    update(_res)
    .where(_res.c.occurrence_id == bindparam("p_id"), _res.c.status == "reserved")
    .values(status=bindparam("p_status"), outcome_json=bindparam("p_outcome"), settled_at=bindparam("p_now"))
)
APPLY_ADJUDICATION: Final = Prepared(
    update(_adj)
    .where(_adj.c.occurrence_id == bindparam("p_id"), _adj.c.status == "pending")
    .values(
        status="applied",
        applied_at=bindparam("p_now"),
        retry_settled_at=bindparam("p_now"),
        retry_outcome_json=bindparam("p_outcome"),
    )
)


def lease_lost(
    occurrence_id: str, *, owner_id: str | None = None, fence: int | None = None, job_id: str | None = None
) -> SchedulerKernelError:
    """``SCHEDULER_LEASE_LOST`` (and its ``lease lost`` log record, see ``telemetry``)."""
    log_lease_lost(occurrence_id, owner_id=owner_id, fence=fence, job_id=job_id)
    return SchedulerKernelError(
        "SCHEDULER_LEASE_LOST",
        f"Occurrence lease is absent, expired, or owned by another fence: {occurrence_id}",
    )


def _lease_held(row: Mapping[str, Any] | None, request: SettleRequest, now: int) -> bool:
    return (
        row is not None
        and row["status"] == RUNNING
        and row["lease_owner"] == request.owner_id
        and row["fence"] == request.fence
        and row["lease_expires_at"] > now
    )


def _settle_control(tx: Tx, current: Mapping[str, Any], status: str, fence: int) -> bool:
    """Rebind a resumed control to the next claim on retry, or terminalize it; True if terminalized."""
    state = current["control_state"]
    params = {"p_id": current["occurrence_id"], "p_now": tx.now}
    if status == RETRY_WAIT and state == "resumed":
        tx.changes(_REBIND_RESUMED, {**params, "p_fence": fence, "p_next_fence": fence + 1})
        return False
    if state == "pause_requested" or state == "resumed":
        return tx.changes(TERMINALIZE_CONTROL, {**params, "p_state": state}) == 1
    return False


def settle_reservation(tx: Tx, current: Mapping[str, Any], status: str, outcome: dict[str, Any]) -> None:
    if current["reservation_status"] != "reserved" or status == RETRY_WAIT:
        return
    params = {
        "p_id": current["occurrence_id"],
        "p_status": "succeeded" if status == SUCCEEDED else "failed",
        "p_outcome": canonical_json(outcome, "authoritySettlement"),
        "p_now": tx.now,
    }
    if tx.changes(SETTLE_RESERVATION, params) != 1:
        raise SchedulerKernelError(
            "SCHEDULER_AUTHORITY_SETTLEMENT_CONFLICT",
            f"Scheduler authority reservation could not be settled: {current['occurrence_id']}",
        )


def settle_adjudication(tx: Tx, current: Mapping[str, Any], status: str, outcome: dict[str, Any]) -> None:
    if current["adjudication_status"] != "pending" or status == RETRY_WAIT:
        return
    params = {
        "p_id": current["occurrence_id"],
        "p_outcome": canonical_json(outcome, "adjudication.retryOutcome"),
        "p_now": tx.now,
    }
    if tx.changes(APPLY_ADJUDICATION, params) != 1:
        raise SchedulerKernelError(
            "SCHEDULER_ADJUDICATION_SETTLEMENT_CONFLICT",
            f"Scheduler adjudication could not be settled: {current['occurrence_id']}",
        )


def _next_state(
    current: Mapping[str, Any], request: SettleRequest, now: int
) -> tuple[str, str, int, int | None]:
    """(status, event type, available_at, settled_at) after the settlement."""
    if request.succeeded:
        return SUCCEEDED, "occurrence_succeeded", current["available_at"], now
    if request.retryable and current["attempt"] < current["max_attempts"]:
        available = now if request.retry_at is None else max(now, request.retry_at)
        return RETRY_WAIT, "occurrence_retry_scheduled", available, None
    return DEAD_LETTER, "occurrence_dead_lettered", current["available_at"], now


def settlement_event_data(
    current: Mapping[str, Any], status: str, available: int, pending_adjudication: bool, terminalized: bool
) -> dict[str, Any]:
    data: dict[str, Any] = {"attempt": current["attempt"], "maxAttempts": current["max_attempts"]}
    if current["reservation_status"] is not None:
        data["authorityPolicyRevision"] = current["reservation_policy_revision"]
        data["authorityUnits"] = current["reservation_units"]
    if status == RETRY_WAIT:
        data["retryAt"] = available
    if pending_adjudication:
        data["adjudicationRequestId"] = current["adjudication_request_id"]
    if terminalized:
        data["runtimeControlTerminalized"] = True
    return data


def _without_aux_rows(current: Mapping[str, Any]) -> bool:
    """No control, reservation or adjudication row was read with the occurrence (each has a
    NOT NULL ``state``/``status``)."""
    return (
        current["control_state"] is None
        and current["reservation_status"] is None
        and current["adjudication_status"] is None
    )


def _as_dict(row: Any) -> dict[str, Any]:
    """A row's columns as a dict of its own (a fast-path row's ``_mapping`` already is one)."""
    values = row._mapping
    return values if type(values) is dict else dict(values)


class _Settlements:
    """The settlements of one transaction: rows read once, one UPDATE and one event insert at the end."""

    def __init__(
        self,
        tx: Tx,
        requests: Sequence[SettleRequest],
        events: EventLog | None = None,
        read: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.tx = tx
        ids = list(dict.fromkeys(request.occurrence_id for request in requests))
        self.tactic = tx.backend.settle_tactic(tx.call, len(ids))
        if read is None and self.tactic == "lock_first":
            # Lock first, read after: see _LOCK_SETTLED ("check_on_write" checks with
            # _SETTLE_GUARDED instead, saving the statement).
            for chunk in chunks(sorted(ids)):
                tx.all(_LOCK_SETTLED, {"p_ids": list(chunk)})
        if read is not None:
            rows: Sequence[Any] = ()
        elif len(ids) == 1 and tx.clock_unread:
            rows = tx.all(_CURRENT_THEN_CLOCK, {"p_id": ids[0]})
            if rows:
                tx.adopt_clock(rows[0].server_now)
        elif len(ids) == 1:
            rows = tx.all(_CURRENT, {"p_id": ids[0]})
        else:
            clocked = self.tactic == "lock_first" and tx.clock_unread  # every row is locked by now
            statement = _CURRENT_MANY_THEN_CLOCK if clocked else _CURRENT_MANY
            rows = [row for chunk in chunks(ids) for row in tx.all(statement, {"p_ids": list(chunk)})]
            if clocked and rows:
                tx.adopt_clock(rows[0].server_now)
        self.current: dict[str, dict[str, Any]] = (
            {row.occurrence_id: _as_dict(row) for row in rows} if read is None else read
        )
        for values in self.current.values():
            values.pop("server_now", None)
        self.updates: list[dict[str, Any]] = []
        self.owns_events = events is None
        self.events = EventLog(tx) if events is None else events

    def settle(self, request: SettleRequest) -> Occurrence:
        """Settle one attempt (seed: settle's transaction body); the row write is deferred."""
        tx, now, identifier = self.tx, self.tx.now, request.occurrence_id
        current = self.current.get(identifier)
        if current is None or not _lease_held(current, request, now):
            job_id = None if current is None else current["job_id"]
            raise lease_lost(identifier, owner_id=request.owner_id, fence=request.fence, job_id=job_id)
        pending_adjudication = current["adjudication_status"] == "pending"
        if (
            request.adjudication_request_id is not None
            and pending_adjudication
            and current["adjudication_request_id"] != request.adjudication_request_id
        ):
            raise SchedulerKernelError(
                "SCHEDULER_ADJUDICATION_SETTLEMENT_CONFLICT",
                f"Scheduler adjudication request does not match settlement: {identifier}",
            )
        status, event_type, available, settled = _next_state(current, request, now)
        changes = {
            "status": status,
            "available_at": available,
            "lease_owner": None,
            "lease_expires_at": None,
            "last_error_json": None if request.succeeded else request.error_json,
            "result_json": request.result_json,
            "updated_at": now,
            "settled_at": settled,
        }
        self.updates.append(
            {
                "p_id": identifier,
                "p_owner": request.owner_id,
                "p_fence": request.fence,
                "p_now": now,
                "p_status": status,
                "p_available": available,
                "p_error": changes["last_error_json"],
                "p_result": request.result_json,
                "p_settled": settled,
            }
        )
        terminalized = _settle_control(tx, current, status, request.fence)
        outcome: dict[str, Any] = (
            {"status": status, "result": request.result}
            if request.succeeded
            else {"status": status, "error": request.error}
        )
        settle_reservation(tx, current, status, outcome)
        settle_adjudication(tx, current, status, outcome)
        self.events.add(
            job_id=current["job_id"],
            occurrence_id=identifier,
            type=event_type,
            owner_id=request.owner_id,
            fence=request.fence,
            data=settlement_event_data(current, status, available, pending_adjudication, terminalized),
        )
        settled_row = {**current, **changes}
        self.current[identifier] = settled_row
        return occurrence_record(settled_row)

    def write(self, *, indexed: bool = False) -> None:
        """``indexed``: a failure of the one settlement's write carries ``details["index"]`` 0 (in
        a batch: kept for a later statement, it fails there)."""
        if len(self.updates) == 1:
            update = self.updates[0]
            identifier = update["p_id"]
            due = update["p_status"] == RETRY_WAIT and update["p_available"] <= update["p_now"]
            statement = _SETTLE
            conflict: Callable[[], Exception] = (
                (lambda: with_index(lease_lost(identifier), 0))
                if indexed
                else (lambda: lease_lost(identifier))
            )
            if self.tactic == "check_on_write" and _without_aux_rows(self.current[identifier]):
                statement, conflict = _SETTLE_GUARDED, RestartTransaction
            # The row ran under this call's live lease (no claim read returns it); unless the
            # retry is due at once, no claim read returns it afterwards either.
            self.tx.write_later(
                statement,
                update,
                expected=1,
                conflict=conflict,
                row=(_o.name, identifier),
                claim_reads_may_pass=not due,
            )
        elif self.updates and self.tx.changes(_SETTLE, self.updates) != len(self.updates):
            raise lease_lost(self.updates[0]["p_id"])
        if self.owns_events:
            self.events.flush(self.tx)


def settle_in(
    tx: Tx,
    request: SettleRequest,
    events: EventLog | None = None,
    before: Callable[[], None] | None = None,
    read: dict[str, dict[str, Any]] | None = None,
) -> Occurrence:
    """Settle the caller's live lease (``SCHEDULER_LEASE_LOST`` for a stale owner, fence or lease).

    With ``events`` given, the settlement's event is appended there for the caller to write;
    ``before`` runs once the row is read (locked among concurrent writers), before the lease is
    judged. ``read``: the row already read and locked (``CURRENT_ROWS`` columns by occurrence
    id; absent when there is no such occurrence), else it is read here.
    """
    settlements = _Settlements(tx, [request], events, read)
    if before is not None:
        before()
    occurrence = settlements.settle(request)
    settlements.write()
    return occurrence


def settle_many_in(
    tx: Tx,
    requests: Sequence[SettleRequest],
    events: EventLog | None = None,
    before: Callable[[], None] | None = None,
) -> list[Occurrence]:
    """``settle_in`` for each request in order; a failure carries the item's index.

    ``events`` and ``before`` as in ``settle_in`` (``before`` runs once every row is read).
    """
    settlements = _Settlements(tx, requests, events)
    if before is not None:
        before()
    results: list[Occurrence] = []
    for index, request in enumerate(requests):
        try:
            results.append(settlements.settle(request))
        except SchedulerKernelError as error:
            with_index(error, index)
            raise
    settlements.write(indexed=True)
    return results
