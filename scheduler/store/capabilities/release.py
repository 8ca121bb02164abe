"""``release_lease``: hand a held lease back without settling the attempt (beyond the original).

A worker that will not finish an occurrence it holds — it is shutting down, or a claim arrived
after its stop request — releases it: the occurrence goes back to ``queued`` at once (its
``available_at`` unchanged, so it keeps its place in the queue) and the attempt its claim counted
is given back, so the next claim runs the same attempt again. Fenced like ``renew`` and
``settle``: only the live lease of ``owner_id`` at ``fence`` can be released.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import bindparam, select, update

from scheduler.contract.constants import QUEUED, RUNNING
from scheduler.contract.errors import SchedulerKernelError
from scheduler.contract.scalars import assert_positive_safe_int
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.capabilities.authority import lock_occurrence_row
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.claim_eligibility import PAUSE_REQUESTED, RESUMED
from scheduler.store.capabilities.occurrence_rows import occurrence_record
from scheduler.store.capabilities.settlement import lease_lost, live_lease
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Occurrence

RELEASED_EVENT: Final = "occurrence_released"

_o = t.occurrences
_c = t.occurrence_controls
_HELD: Final = Prepared(
    select(
        _o,
        _c.c.state.label("control_state"),
        _c.c.expected_fence.label("control_expected_fence"),
    )
    .select_from(_o.outerjoin(_c, _c.c.occurrence_id == _o.c.occurrence_id))
    .where(_o.c.occurrence_id == bindparam("p_id"))
)
"""The occurrence and its runtime control, read after the occurrence row is locked."""
_RELEASE: Final = Prepared(
    update(_o)
    .where(live_lease())
    .values(
        status=QUEUED,
        attempt=bindparam("p_attempt"),
        lease_owner=None,
        lease_expires_at=None,
        updated_at=bindparam("p_now"),
    )
)


def _held(row: Any, owner: str, fence: int, now: int) -> bool:
    return bool(
        row is not None
        and row.status == RUNNING
        and row.lease_owner == owner
        and row.fence == fence
        and row.lease_expires_at > now
    )


def release_lease_in(tx: Tx, occurrence_id: str, owner: str, fence: int) -> Occurrence:
    """Put the caller's live lease back to ``queued`` (see :meth:`ReleaseOperations.release_lease`)."""
    lock_occurrence_row(tx, occurrence_id)
    row = tx.first(_HELD, {"p_id": occurrence_id})
    if not _held(row, owner, fence, tx.now):
        raise lease_lost(
            occurrence_id, owner_id=owner, fence=fence, job_id=None if row is None else row.job_id
        )
    if row.control_state == PAUSE_REQUESTED:
        raise SchedulerKernelError(
            "SCHEDULER_OCCURRENCE_CONTROL_CONFLICT",
            f"Scheduler occurrence has a pending pause request: {occurrence_id}",
            {"state": PAUSE_REQUESTED},
        )
    # The next claim of a resumed run bound to this fence counts no attempt: nothing to give back.
    resumed = row.control_state == RESUMED and row.control_expected_fence == fence
    attempt = row.attempt if resumed else max(0, row.attempt - 1)
    params = {
        "p_id": occurrence_id,
        "p_owner": owner,
        "p_fence": fence,
        "p_now": tx.now,
        "p_attempt": attempt,
    }
    if tx.changes(_RELEASE, params) != 1:
        raise lease_lost(occurrence_id, owner_id=owner, fence=fence, job_id=row.job_id)
    tx.append_event(
        job_id=row.job_id,
        occurrence_id=occurrence_id,
        type=RELEASED_EVENT,
        owner_id=owner,
        fence=fence,
        data={"attempt": attempt, "maxAttempts": row.max_attempts, "attemptReturned": attempt != row.attempt},
    )
    changes = {
        "status": QUEUED,
        "attempt": attempt,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": tx.now,
    }
    return occurrence_record(row, changes)


class ReleaseOperations(StoreBase):
    """``release_lease``; mixed into ``SchedulerStore``."""

    def release_lease(self, *, occurrence_id: str, owner_id: str, fence: int) -> Occurrence:
        """Give back the caller's live lease without settling: for work a worker will not finish.

        The occurrence becomes ``queued`` with no lease, claimable at once (its ``available_at`` is
        left as it was, so it keeps its place in the queue); its fence is unchanged, so the next
        claim fences the releasing owner out. The attempt the claim counted is given back
        (``attempt - 1``, never below 0), except for a resumed run, whose next claim counts none.
        Appends ``occurrence_released`` with ``{"attempt", "maxAttempts", "attemptReturned"}``
        (``attempt`` as it is after the release).

        Errors, nothing written: ``SCHEDULER_LEASE_LOST`` when ``owner_id`` does not hold a live
        lease at ``fence`` (another owner or fence, expired, settled, absent);
        ``SCHEDULER_OCCURRENCE_CONTROL_CONFLICT`` (``details == {"state": "pause_requested"}``)
        while a pause is pending (acknowledge it at a checkpoint, or let the lease expire: that
        reclaim counts no attempt either); ``SCHEDULER_INVALID_ARGUMENT`` for bad arguments.
        """
        identifier = normalize_key(occurrence_id, "occurrenceId")
        owner = normalize_key(owner_id, "ownerId")
        token = assert_positive_safe_int(fence, "fence")
        return self._write(lambda tx: release_lease_in(tx, identifier, owner, token))
