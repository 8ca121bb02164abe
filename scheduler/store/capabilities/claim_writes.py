"""What claims, renewals and the expired-lease sweep write (seed v6: claimNext, renew and
_deadLetterExpiredLeases): their ``UPDATE`` statements, :class:`Claims` (the claims of one
transaction, decided row by row and written together) and :func:`sweep_expired`.

:mod:`scheduler.store.capabilities.leases` decides which rows are claimed or swept; this module writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import and_, bindparam, update

from scheduler.contract.canonical import canonical_json
from scheduler.contract.constants import DEAD_LETTER, MAX_SAFE_INTEGER, RUNNING
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.schema import tables as t
from scheduler.store.capabilities.claim_eligibility import (
    PAUSE_REQUESTED,
    PLAIN_CLAIM_GUARD,
    RESUMED,
    ClaimFilter,
)
from scheduler.store.capabilities.claim_plan import LockedAsProbed, keeps_attempt, read_plan
from scheduler.store.capabilities.occurrence_rows import EventLog, occurrence_record
from scheduler.store.capabilities.settlement import APPLY_ADJUDICATION, SETTLE_RESERVATION
from scheduler.store.plumbing.constructs import greatest, row_check
from scheduler.store.plumbing.statement_plans import Prepared, StoredRow
from scheduler.store.plumbing.tx import RestartTransaction, Tx
from scheduler.store.records import Occurrence

LEASE_EXPIRED_ERROR: Final = {
    "code": "lease_expired",
    "message": "Execution lease expired after the final allowed attempt",
}
_LEASE_EXPIRED_JSON: Final = canonical_json(LEASE_EXPIRED_ERROR, "occurrence.error")
_SWEEP_OUTCOME_JSON: Final = canonical_json({"status": DEAD_LETTER, "error": LEASE_EXPIRED_ERROR}, "outcome")

_o = t.occurrences
_leased = and_(
    _o.c.occurrence_id == bindparam("p_id"),
    row_check(_o.c.status == RUNNING),
    _o.c.lease_owner == bindparam("p_owner"),
    _o.c.fence == bindparam("p_fence"),
)


def _claim_update(*, guarded: bool) -> Any:
    """The claim ``UPDATE`` (a new statement on each call); ``guarded``: with
    ``PLAIN_CLAIM_GUARD``, for a row claimed on its probed facts."""
    statement = (
        update(_o)
        .where(_o.c.occurrence_id == bindparam("p_id"), _o.c.fence == bindparam("p_fence"))
        .values(
            status=RUNNING,
            attempt=bindparam("p_attempt"),
            fence=bindparam("p_next_fence"),
            lease_owner=bindparam("p_owner"),
            lease_expires_at=bindparam("p_expires"),
            updated_at=bindparam("p_now"),
            settled_at=None,
        )
    )
    return statement.where(PLAIN_CLAIM_GUARD) if guarded else statement


_CLAIM: Final = Prepared(_claim_update(guarded=False))
CLAIM_GUARDED: Final = Prepared(_claim_update(guarded=True))
"""``_CLAIM`` of a head claimed on its probed control, requeue and job facts (``LockedAsProbed``)."""
RENEW: Final = Prepared(
    update(_o)
    .where(_leased, _o.c.lease_expires_at > bindparam("p_now"))
    .values(
        lease_expires_at=greatest(_o.c.lease_expires_at, bindparam("p_expires")),
        updated_at=bindparam("p_now"),
    )
    .returning(*_o.c)
)
_SWEEP: Final = Prepared(
    update(_o)
    .where(_leased)
    .values(
        status=DEAD_LETTER,
        lease_owner=None,
        lease_expires_at=None,
        last_error_json=_LEASE_EXPIRED_JSON,
        updated_at=bindparam("p_now"),
        settled_at=bindparam("p_now"),
    )
)
_c = t.occurrence_controls
_REBIND_CONTROL: Final = Prepared(
    update(_c)
    .where(
        _c.c.occurrence_id == bindparam("p_id"),
        _c.c.state == bindparam("p_state"),
        _c.c.expected_fence == bindparam("p_fence"),
    )
    .values(
        expected_fence=bindparam("p_next_fence"),
        revision=_c.c.revision + 1,
        updated_at=bindparam("p_now"),
    )
)
_r = t.occurrence_retries
_CONSUME_RETRY: Final = Prepared(
    update(_r)
    .where(
        _r.c.occurrence_id == bindparam("p_id"),
        _r.c.request_id == bindparam("p_request"),
        _r.c.claimed_at.is_(None),
    )
    .values(claimed_at=bindparam("p_now"))
)


def lease_expiry(now: int, lease_ms: int) -> int:
    """``now + lease_ms`` (ms), refused (``SCHEDULER_INVALID_ARGUMENT``) past the safe integer range."""
    expires = now + lease_ms
    if expires > MAX_SAFE_INTEGER:
        raise invalid_argument("lease expiry exceeds the safe integer range")
    return expires


# ------------------------------------------------------------------------------------ sweep


def sweep_expired(tx: Tx, rows: Sequence[StoredRow], events: EventLog) -> None:
    """Dead-letter expired final attempts (seed: _deadLetterExpiredLeases) in the given order."""
    for row in rows:
        params = {
            "p_id": row.occurrence_id,
            "p_owner": row.lease_owner,
            "p_fence": row.fence,
            "p_now": tx.now,
        }
        if tx.changes(_SWEEP, params) != 1:
            continue
        data: dict[str, Any] = {
            "attempt": row.attempt,
            "maxAttempts": row.max_attempts,
            "reason": "lease_expired",
        }
        if row.adjudication_request_id is not None:
            settled = {"p_id": row.occurrence_id, "p_now": tx.now, "p_outcome": _SWEEP_OUTCOME_JSON}
            tx.changes(APPLY_ADJUDICATION, settled)
            tx.changes(SETTLE_RESERVATION, {**settled, "p_status": "failed"})
            data["adjudicationRequestId"] = row.adjudication_request_id
        events.add(
            job_id=row.job_id,
            occurrence_id=row.occurrence_id,
            type="occurrence_dead_lettered",
            owner_id=row.lease_owner,
            fence=row.fence,
            data=data,
        )


# ------------------------------------------------------------------------------------ claims


class Claims:
    """The claims of one transaction: decided row by row, written with one UPDATE at the end.

    Each claimed record is the candidate row read in this transaction with the claim's columns
    applied, so nothing is read back.
    """

    __slots__ = ("claimed", "events", "expires", "guarded", "owner", "owns_events", "rows", "tx", "updates")
    # ``guarded``: for each update, whether its row was claimed on facts as probed (LockedAsProbed).

    def __init__(self, tx: Tx, owner: str, lease_ms: int, events: EventLog | None = None) -> None:
        self.tx = tx
        self.owner = owner
        self.expires = lease_expiry(tx.now, lease_ms)
        self.owns_events = events is None
        self.events = EventLog(tx) if events is None else events
        self.rows: list[StoredRow] = []
        self.updates: list[dict[str, Any]] = []
        self.guarded: list[bool] = []
        self.claimed: list[Occurrence] = []

    def claim(self, row: StoredRow, *, targeted: bool) -> None:
        """Claim one eligible candidate (seed: the claim UPDATE, its bookkeeping and event)."""
        update, event, record = self.prepare(row, targeted=targeted)
        assert record is not None
        self.updates.append(update)
        self.rows.append(row)
        self.guarded.append(isinstance(row, LockedAsProbed))
        self.events.add(**event)
        self.claimed.append(record)

    def prepare(
        self, row: StoredRow, *, targeted: bool, record: bool = True
    ) -> tuple[dict[str, Any], dict[str, Any], Occurrence | None]:
        """What :meth:`claim` of ``row`` writes and returns, recorded nowhere: the claim
        ``UPDATE``'s parameters, the claim event's ``EventLog.add`` arguments and (with
        ``record``) the claimed record."""
        attempt = row.attempt + (0 if keeps_attempt(row) else 1)
        fence = row.fence + 1
        changes = {
            "status": RUNNING,
            "attempt": attempt,
            "fence": fence,
            "lease_owner": self.owner,
            "lease_expires_at": self.expires,
            "updated_at": self.tx.now,
            "settled_at": None,
        }
        update = {
            "p_id": row.occurrence_id,
            "p_fence": row.fence,
            "p_attempt": attempt,
            "p_next_fence": fence,
            "p_owner": self.owner,
            "p_expires": self.expires,
            "p_now": self.tx.now,
        }
        data: dict[str, Any] = {
            "attempt": attempt,
            "previousOwner": row.lease_owner,
            "previousStatus": row.status,
        }
        if targeted:
            data["targeted"] = True
        if row.control_state == PAUSE_REQUESTED:
            data["pauseRequestRebound"] = True
        elif row.control_state == RESUMED:
            data["resumedWithoutAttempt"] = True
        if row.retry_request_id is not None:
            data["retryRequestId"] = row.retry_request_id
        event = {
            "job_id": row.job_id,
            "occurrence_id": row.occurrence_id,
            "type": "occurrence_reclaimed" if row.status == RUNNING else "occurrence_claimed",
            "owner_id": self.owner,
            "fence": fence,
            "data": data,
        }
        return update, event, occurrence_record(row, changes) if record else None

    def write(self) -> list[Occurrence]:
        """The claim UPDATEs (one executemany), control and requeue bookkeeping, then the events."""
        tx = self.tx
        pairs = list(zip(self.updates, self.guarded, strict=True))
        # A row claimed on its probed facts whose UPDATE finds them changed: the call decides
        # again on a fresh read (RestartTransaction).
        for statement, conflict, updates in (
            (_CLAIM, _claim_conflict, [params for params, guarded in pairs if not guarded]),
            (CLAIM_GUARDED, RestartTransaction, [params for params, guarded in pairs if guarded]),
        ):
            if len(updates) == 1:
                row = (_o.name, updates[0]["p_id"])
                tx.write_later(statement, updates[0], expected=1, conflict=conflict, row=row)
            elif updates and tx.changes(statement, updates) != len(updates):
                raise conflict()
        for row in self.rows:
            _rebind_control(tx, row, row.fence + 1)
            if row.retry_request_id is not None:
                params = {"p_id": row.occurrence_id, "p_request": row.retry_request_id, "p_now": tx.now}
                tx.changes(_CONSUME_RETRY, params)
        if self.owns_events:
            self.events.flush(tx)
        return self.claimed


def _claim_conflict() -> SchedulerKernelError:
    return SchedulerKernelError("SCHEDULER_CLAIM_CONFLICT", "Occurrence eligibility changed during claim")


def _rebind_control(tx: Tx, row: StoredRow, fence: int) -> None:
    state = row.control_state
    if state not in (PAUSE_REQUESTED, RESUMED):
        return
    params = {
        "p_id": row.occurrence_id,
        "p_state": state,
        "p_fence": row.control_expected_fence,
        "p_next_fence": fence,
        "p_now": tx.now,
    }
    if tx.changes(_REBIND_CONTROL, params) != 1 and state == RESUMED:
        raise SchedulerKernelError(
            "SCHEDULER_OCCURRENCE_CONTROL_CONFLICT",
            f"Scheduler resume checkpoint lost its claim fence: {row.occurrence_id}",
        )


def claim_serially(tx: Tx, claims: Claims, claim_filter: ClaimFilter, limit: int) -> None:
    """Up to ``limit`` successive claims, each preceded by the seed's sweep, read once
    (``claim_plan.read_plan``) and taken in order: ``Backend.claim`` where one writer runs at a
    time, so what was read stays true until the transaction ends."""
    plan = read_plan(tx, claim_filter, limit)
    for _ in range(limit):
        sweep_expired(tx, plan.next_sweep(), claims.events)
        candidate = plan.next_candidate()
        if candidate is None:
            break
        claims.claim(candidate, targeted=False)
