"""Leases: claim_next, claim_occurrence, claim_batch, renew and the expired-lease sweep (seed v6).

Every write samples ``now`` inside its transaction. Candidate rows are read once, joined with
their runtime control and requeue request (:mod:`scheduler.store.capabilities.claim_query`); the claims of a
transaction are written with one ``executemany`` and their records are those rows with the
claim applied, so nothing is read back (:mod:`scheduler.store.capabilities.claim_writes` writes them).
``renew`` returns its row from the UPDATE itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from scheduler.contract.constants import MAX_LEASE_MS, RETRY_WAIT
from scheduler.contract.errors import invalid_argument
from scheduler.contract.scalars import assert_positive_safe_int, is_safe_int
from scheduler.contract.storable import normalize_key
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.claim_eligibility import ClaimFilter
from scheduler.store.capabilities.claim_plan import ClaimContention, ClaimPlan, claimable
from scheduler.store.capabilities.claim_query import CLAIM_OCCURRENCE_PREPARED, claim_occurrence_params
from scheduler.store.capabilities.claim_writes import (
    RENEW,
    Claims,
    lease_expiry,
    sweep_expired,
)
from scheduler.store.capabilities.jobs import not_found
from scheduler.store.capabilities.occurrence_rows import EventLog, occurrence_record, validate_batch
from scheduler.store.capabilities.settle_request import (
    SettleRequest,
    normalize_settle,
    normalize_settle_mapping,
)
from scheduler.store.capabilities.settlement import lease_lost, settle_in, settle_many_in
from scheduler.store.plumbing.statement_plans import StoredRow
from scheduler.store.plumbing.tx import RestartTransaction, Tx
from scheduler.store.records import Occurrence, SettledAndClaimed, SettledManyAndClaimed

MAX_CLAIM_BATCH: Final = 1000


def normalize_lease_ms(value: Any) -> int:
    """A lease length: an ``int`` in 1..86400000."""
    lease = assert_positive_safe_int(value, "leaseMs")
    if lease > MAX_LEASE_MS:
        raise invalid_argument(f"leaseMs must not exceed {MAX_LEASE_MS}")
    return lease


def normalize_claim_batch_limit(value: Any, minimum: int = 1) -> int:
    """A number of claims: an ``int`` in ``minimum``..1000."""
    if not is_safe_int(value) or not minimum <= value <= MAX_CLAIM_BATCH:
        raise invalid_argument(f"limit must be an integer between {minimum} and {MAX_CLAIM_BATCH}")
    return value


def optional_identifier(value: Any, field: str, max_length: int) -> str | None:
    return None if value is None else normalize_key(value, field, max_length)


def normalize_job_kinds(value: Any) -> tuple[str, ...] | None:
    """``job_kind``: ``None`` (every kind), one kind, or a non-empty list/tuple of kinds.

    Each kind is validated like a single one (an identifier of at most 128 UTF-16 units); a
    nested sequence or any other type is ``SCHEDULER_INVALID_ARGUMENT``, as is an empty list.
    Duplicates are dropped (the filter is "any of them").
    """
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        if not value:
            raise invalid_argument("jobKind must be a job kind or a non-empty list of job kinds")
        return tuple(dict.fromkeys(normalize_key(kind, "jobKind", 128) for kind in value))
    return (normalize_key(value, "jobKind", 128),)


def normalize_claim_filter(job_kind: Any, workspace_id: Any) -> ClaimFilter:
    """The validated ``job_kind`` / ``workspace_id`` filters of a claim (jobKind first, as the seed)."""
    kinds = normalize_job_kinds(job_kind)
    return ClaimFilter(kinds, optional_identifier(workspace_id, "workspaceId", 256))


def claim_in(
    tx: Tx,
    owner: str,
    lease_ms: int,
    claim_filter: ClaimFilter,
    limit: int,
    events: EventLog | None = None,
    contention: ClaimContention | None = None,
    probed: Sequence[StoredRow] | None = None,
) -> list[Occurrence]:
    """Up to ``limit`` successive claims, each preceded by the seed's sweep, taken as the
    backend takes them (``Backend.claim``).

    With ``events`` given, the events are appended there for the caller to write. ``contention``
    (the store's): how a single claim among concurrent writers reads its candidates; ``probed``:
    the heads ``Backend.read_cycle`` already read in this transaction.
    """
    claims = Claims(tx, owner, lease_ms, events)
    tx.backend.claim(tx, claims, claim_filter, limit, contention, probed)
    return claims.write()


def claim_next_in(
    tx: Tx, owner: str, lease_ms: int, claim_filter: ClaimFilter, contention: ClaimContention | None
) -> list[Occurrence]:
    """``claim_in`` of one occurrence, left whole to the call's writes statement where the backend
    may (``Backend.leave_claim_to_writes``)."""
    if tx.backend.leave_claim_to_writes(tx, owner, lease_ms, claim_filter, contention):
        _finish_with_pick(tx)  # the whole call is its writes statement
        return cast(list[Occurrence], None)  # replaced by tx.finish once the statement ran
    return claim_in(tx, owner, lease_ms, claim_filter, 1, None, contention)


def settle_one_in(tx: Tx, request: SettleRequest) -> Occurrence:
    """``settle_in``, left whole to the call's writes statement where the backend may
    (``Backend.leave_settle_to_writes``)."""
    if tx.backend.leave_settle_to_writes(tx, request):
        _finish_with_pick(tx)
        return cast(Occurrence, None)  # replaced by tx.finish once the statement ran
    return settle_in(tx, request)


def settle_and_claim_in(
    tx: Tx,
    request: SettleRequest,
    lease_ms: int,
    claim_filter: ClaimFilter,
    contention: ClaimContention | None = None,
) -> SettledAndClaimed:
    """``settle_in`` then ``claim_in`` for the same owner, with the transaction's one ``now``."""
    backend = tx.backend
    if backend.leave_cycle_to_writes(tx, request, lease_ms, claim_filter, contention):
        _finish_with_pick(tx)  # the whole call is its writes statement
        return cast(SettledAndClaimed, None)  # replaced by tx.finish once the statement ran
    events = EventLog(tx)  # both halves' events, in order, written with one INSERT

    def refuse_unrepresentable_lease() -> None:
        """Before anything is written and before the held lease is judged; ``now`` (the server
        clock: API §8) is read here, after the settled row is locked."""
        lease_expiry(tx.now, lease_ms)

    probed: Sequence[StoredRow] | None = None
    read: dict[str, dict[str, Any]] | None = None
    # A retry due at once would be one of the heads: such a settlement reads them after it.
    retry_now = not request.succeeded and request.retryable and request.retry_at is None
    cycle = None if retry_now else backend.read_cycle(tx, request, claim_filter, contention)
    if cycle is not None:  # settle's read and the heads at once
        read = {} if cycle.current is None else {request.occurrence_id: cycle.current}
        probed = cycle.heads
    settled = settle_in(tx, request, events, before=refuse_unrepresentable_lease, read=read)
    if probed is not None and settled.status == RETRY_WAIT and settled.available_at <= tx.now:
        raise RestartTransaction  # the heads were read before the retry made its row due
    claimed = claim_in(tx, request.owner_id, lease_ms, claim_filter, 1, events, contention, probed)
    events.flush(tx)
    return SettledAndClaimed(settled=settled, claimed=claimed[0] if claimed else None)


def settle_many_and_claim_in(
    tx: Tx,
    requests: Sequence[SettleRequest],
    owner: str,
    lease_ms: int,
    claim_filter: ClaimFilter,
    limit: int,
) -> SettledManyAndClaimed:
    """``settle_many_in`` then ``claim_in`` (up to ``limit`` claims for ``owner``, none for 0)
    with the transaction's one ``now``; both halves' events are written with one INSERT."""
    events = EventLog(tx)

    def refuse_unrepresentable_lease() -> None:
        """As ``settle_and_claim_in``'s: once the settled rows are read, before a lease is judged."""
        lease_expiry(tx.now, lease_ms)

    before = refuse_unrepresentable_lease if limit else None
    settled = settle_many_in(tx, requests, events, before) if requests else []
    claimed = claim_in(tx, owner, lease_ms, claim_filter, limit, events) if limit else []
    events.flush(tx)
    return SettledManyAndClaimed(settled=settled, claimed=claimed)


def _finish_with_pick(tx: Tx) -> None:
    """The call's result is completed by the work left to its writes statement once it ran."""
    pick = tx.pick
    assert pick is not None
    tx.finish = pick.completed


def claim_occurrence_in(tx: Tx, occurrence_id: str, owner: str, lease_ms: int) -> Occurrence | None:
    """Sweep, then claim one named occurrence if the seed's rules allow it.

    Among concurrent writers the named row is locked first, waiting for a transaction holding
    it (a claim of it in flight): this claim then runs as if serially after that one, on rows
    read after the lock, and ``now`` is sampled after it.
    """
    tx.backend.lock_target(tx, occurrence_id)
    claims = Claims(tx, owner, lease_ms)
    rows = tx.all(CLAIM_OCCURRENCE_PREPARED, claim_occurrence_params(tx.now, occurrence_id))
    plan = ClaimPlan(rows, tx.now)
    sweep = plan.next_sweep()
    sweep_expired(tx, tx.backend.lock_sweep(tx, sweep), claims.events)
    target = plan.target
    if target is None:
        raise not_found("occurrence", occurrence_id)
    if not plan.was_swept(occurrence_id) and claimable(target, tx.now):
        claims.claim(target, targeted=True)
    claimed = claims.write()
    return claimed[0] if claimed else None


def renew_in(tx: Tx, occurrence_id: str, owner: str, fence: int, lease_ms: int) -> Occurrence:
    """Extend a live lease to ``MAX(current, now + lease_ms)``."""
    expires = lease_expiry(tx.now, lease_ms)
    params = {
        "p_id": occurrence_id,
        "p_owner": owner,
        "p_fence": fence,
        "p_expires": expires,
        "p_now": tx.now,
    }
    row = tx.first(RENEW, params)
    if row is None:
        raise lease_lost(occurrence_id, owner_id=owner, fence=fence)
    tx.append_event(
        job_id=row.job_id,
        occurrence_id=occurrence_id,
        type="occurrence_renewed",
        owner_id=owner,
        fence=fence,
        data={"leaseExpiresAt": row.lease_expires_at},
    )
    return occurrence_record(row)


class LeaseOperations(StoreBase):
    """Public lease methods of ``SchedulerStore``."""

    def claim_next(
        self,
        *,
        owner_id: str,
        lease_ms: int,
        job_kind: str | Sequence[str] | None = None,
        workspace_id: str | None = None,
    ) -> Occurrence | None:
        """Claim the next due occurrence, or ``None`` (seed: ``claimNext``).

        ``lease_ms``: 1..86400000 ms. ``job_kind``: one kind or a non-empty list/tuple of kinds
        (any of them; the seed's order across all of them); ``workspace_id``: the job
        authority's ``workspaceId``. Expired final attempts are dead-lettered first (at most 100
        per call, as the seed); expired leases are reclaimed. Bad arguments are
        ``SCHEDULER_INVALID_ARGUMENT``; a lost compare-and-set ``SCHEDULER_CLAIM_CONFLICT``.
        """
        owner = normalize_key(owner_id, "ownerId")
        lease = normalize_lease_ms(lease_ms)
        claim_filter = normalize_claim_filter(job_kind, workspace_id)
        claimed = self._write(lambda tx: claim_next_in(tx, owner, lease, claim_filter, self._claims))
        if not claimed:
            self._idle()
            return None
        return claimed[0]

    def claim_batch(
        self,
        *,
        owner_id: str,
        lease_ms: int,
        limit: int,
        job_kind: str | Sequence[str] | None = None,
        workspace_id: str | None = None,
    ) -> list[Occurrence]:
        """Up to ``limit`` (1..1000) successive ``claim_next`` results in one transaction.

        ``job_kind`` / ``workspace_id`` filter as in ``claim_next``.
        """
        owner = normalize_key(owner_id, "ownerId")
        lease = normalize_lease_ms(lease_ms)
        claim_filter = normalize_claim_filter(job_kind, workspace_id)
        bounded = normalize_claim_batch_limit(limit)
        claimed = self._write(lambda tx: claim_in(tx, owner, lease, claim_filter, bounded))
        if not claimed:
            self._idle()
        return claimed

    def claim_occurrence(self, *, occurrence_id: str, owner_id: str, lease_ms: int) -> Occurrence | None:
        """Claim one named occurrence if it is eligible, else ``None`` (``SCHEDULER_NOT_FOUND`` if absent)."""
        identifier = normalize_key(occurrence_id, "occurrenceId")
        owner = normalize_key(owner_id, "ownerId")
        lease = normalize_lease_ms(lease_ms)
        return self._write(lambda tx: claim_occurrence_in(tx, identifier, owner, lease))

    def renew(self, *, occurrence_id: str, owner_id: str, fence: int, lease_ms: int) -> Occurrence:
        """Extend the caller's live lease; it never shrinks (``SCHEDULER_LEASE_LOST`` if not held)."""
        identifier = normalize_key(occurrence_id, "occurrenceId")
        owner = normalize_key(owner_id, "ownerId")
        token = assert_positive_safe_int(fence, "fence")
        lease = normalize_lease_ms(lease_ms)
        return self._write(lambda tx: renew_in(tx, identifier, owner, token, lease))

    def settle(
        self,
        *,
        occurrence_id: str,
        owner_id: str,
        fence: int,
        outcome: str,
        result: Any = None,
        error: Any = None,
        retryable: bool = True,
        retry_at: int | None = None,
        adjudication_request_id: str | None = None,
    ) -> Occurrence:
        """Finish the caller's attempt: ``succeeded``, or ``failed`` (retry_wait or dead_letter)."""
        request = normalize_settle(
            occurrence_id=occurrence_id,
            owner_id=owner_id,
            fence=fence,
            outcome=outcome,
            result=result,
            error=error,
            retryable=retryable,
            retry_at=retry_at,
            adjudication_request_id=adjudication_request_id,
        )
        return self._write(lambda tx: settle_one_in(tx, request))

    def settle_and_claim(
        self,
        *,
        occurrence_id: str,
        owner_id: str,
        fence: int,
        outcome: str,
        result: Any = None,
        error: Any = None,
        retryable: bool = True,
        retry_at: int | None = None,
        adjudication_request_id: str | None = None,
        lease_ms: int,
        job_kind: str | Sequence[str] | None = None,
        workspace_id: str | None = None,
    ) -> SettledAndClaimed:
        """``settle`` of the held occurrence, then ``claim_next`` for the same owner: one commit per cycle.

        Both run in ONE write transaction with one clock sample; ``.settled`` is what ``settle``
        returns, ``.claimed`` what ``claim_next(owner_id=owner_id, lease_ms=lease_ms,
        job_kind=job_kind, workspace_id=workspace_id)`` would then return. Every argument of
        both halves is validated first (``SCHEDULER_INVALID_ARGUMENT``, nothing read or
        written). All or nothing: if either half fails (e.g. ``SCHEDULER_LEASE_LOST``,
        ``SCHEDULER_CLAIM_CONFLICT``), nothing is written and that error is raised; the lease is
        then still held, so the call can be retried.
        """
        request = normalize_settle(
            occurrence_id=occurrence_id,
            owner_id=owner_id,
            fence=fence,
            outcome=outcome,
            result=result,
            error=error,
            retryable=retryable,
            retry_at=retry_at,
            adjudication_request_id=adjudication_request_id,
        )
        lease = normalize_lease_ms(lease_ms)
        claim_filter = normalize_claim_filter(job_kind, workspace_id)
        cycle = self._write(lambda tx: settle_and_claim_in(tx, request, lease, claim_filter, self._claims))
        if cycle.claimed is None:
            self._idle()
        return cycle

    def settle_many(self, settlements: Sequence[Mapping[str, Any]]) -> list[Occurrence]:
        """``settle`` for each dict of its keyword arguments, in order, in one transaction."""
        requests: list[SettleRequest] = validate_batch(settlements, normalize_settle_mapping, "settlements")
        if not requests:
            self._assert_open()
            return []
        return self._write(lambda tx: settle_many_in(tx, requests))

    def settle_many_and_claim(
        self,
        settlements: Sequence[Mapping[str, Any]],
        *,
        owner_id: str,
        lease_ms: int,
        limit: int,
        job_kind: str | Sequence[str] | None = None,
        workspace_id: str | None = None,
    ) -> SettledManyAndClaimed:
        """``settle_many(settlements)``, then ``claim_batch`` for ``owner_id``: one commit for a
        batched worker's cycle.

        Both run in ONE write transaction with one clock sample; ``.settled`` is what
        ``settle_many`` returns (in the order of ``settlements``), ``.claimed`` what
        ``claim_batch(owner_id=owner_id, lease_ms=lease_ms, limit=limit, job_kind=job_kind,
        workspace_id=workspace_id)`` would then return. Each settlement is a dict of ``settle``'s
        keyword arguments (its own ``owner_id`` need not be the claimer's). ``settlements`` may be
        empty (the call is then ``claim_batch``); ``limit`` is 0..1000, and 0 claims nothing
        (the call is then ``settle_many``, and no expired lease is swept). Every argument of both
        halves is validated first (``SCHEDULER_INVALID_ARGUMENT``, a settlement's error with
        ``details["index"]``; nothing read or written). All or nothing: if a settlement fails
        (e.g. ``SCHEDULER_LEASE_LOST`` with ``details["index"]``) or the claims do, nothing is
        written and that error is raised; the leases are then still held, so the call can be
        retried without the failed settlement.
        """
        requests: list[SettleRequest] = validate_batch(settlements, normalize_settle_mapping, "settlements")
        owner = normalize_key(owner_id, "ownerId")
        lease = normalize_lease_ms(lease_ms)
        claim_filter = normalize_claim_filter(job_kind, workspace_id)
        bounded = normalize_claim_batch_limit(limit, minimum=0)
        if not requests and not bounded:
            self._assert_open()
            return SettledManyAndClaimed(settled=[], claimed=[])
        cycle = self._write(
            lambda tx: settle_many_and_claim_in(tx, requests, owner, lease, claim_filter, bounded)
        )
        if bounded and not cycle.claimed:
            self._idle()
        return cycle
