"""Leases: claim_next, claim_occurrence, claim_batch, renew and the expired-lease sweep (seed v6).

Every write samples ``now`` inside its transaction. Candidate rows are read once, joined with
their runtime control and requeue request (:mod:`scheduler.store.capabilities.claim_query`); the claims of a
transaction are written with one ``executemany`` and their records are those rows with the
claim applied, so nothing is read back (:mod:`scheduler.store.capabilities.claim_writes` writes them).
``renew`` returns its row from the UPDATE itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Final, cast

from scheduler.backends.postgresql.claim_locks import (
    ClaimContention,
    lock_candidates,
    lock_target,
    locked_head,
    locked_sweep,
)
from scheduler.backends.postgresql.cycle_read import read_cycle
from scheduler.backends.postgresql.cycle_statement import cycle_in_one_statement
from scheduler.backends.postgresql.window_pick import PendingPick
from scheduler.contract.constants import MAX_LEASE_MS, RETRY_WAIT
from scheduler.contract.errors import invalid_argument
from scheduler.contract.scalars import assert_positive_safe_int, is_safe_int
from scheduler.contract.storable import normalize_key
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.claim_plan import ClaimPlan, claimable, head_plan, read_plan, window_plan
from scheduler.store.capabilities.claim_query import (
    CLAIM_OCCURRENCE_PREPARED,
    HEAD_WINDOW,
    ClaimFilter,
    claim_occurrence_params,
    head_probe_and_lock_prepared,
    head_probe_params,
    head_probe_prepared,
    head_window_prepared,
)
from scheduler.store.capabilities.claim_writes import (
    RENEW,
    Claims,
    guarded_claim_update,
    lease_expiry,
    sweep_expired,
)
from scheduler.store.capabilities.jobs import not_found
from scheduler.store.capabilities.occurrence_rows import EventLog, occurrence_record, validate_batch
from scheduler.store.capabilities.settlement import (
    SettleRequest,
    lease_lost,
    normalize_settle,
    normalize_settle_mapping,
    settle_in,
    settle_many_in,
)
from scheduler.store.plumbing.statement_plans import StoredRow
from scheduler.store.plumbing.tx import RestartTransaction, Tx
from scheduler.store.records import Occurrence, SettledAndClaimed

MAX_CLAIM_BATCH: Final = 1000


def normalize_lease_ms(value: Any) -> int:
    """A lease length: an ``int`` in 1..86400000."""
    lease = assert_positive_safe_int(value, "leaseMs")
    if lease > MAX_LEASE_MS:
        raise invalid_argument(f"leaseMs must not exceed {MAX_LEASE_MS}")
    return lease


def normalize_claim_batch_limit(value: Any) -> int:
    if not is_safe_int(value) or not 1 <= value <= MAX_CLAIM_BATCH:
        raise invalid_argument(f"limit must be an integer between 1 and {MAX_CLAIM_BATCH}")
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


CONTENDED_EXTRA: Final = 8
"""Candidates a claim reads beyond its limit on a backend with concurrent writers, so a worker
whose first candidates other workers hold finds the next ones without reading again."""


def claim_in(
    tx: Tx,
    owner: str,
    lease_ms: int,
    claim_filter: ClaimFilter,
    limit: int,
    events: EventLog | None = None,
    contention: ClaimContention | None = None,
    probed: Sequence[StoredRow] | None = None,
    *,
    pick_in_writes: bool = False,
) -> list[Occurrence]:
    """Up to ``limit`` successive claims, each preceded by the seed's sweep.

    With ``events`` given, the events are appended there for the caller to write. ``contention``
    (the store's): how a single claim among concurrent writers reads its candidates; ``probed``:
    the rows of ``claim_query.build_head_probe_and_lock`` (quiet) or ``build_head_window`` (among
    workers: ``ClaimContention.probe_first`` false) already read in this transaction.
    ``pick_in_writes``: a claim from the window of heads may be left to the call's writes
    statement (``Tx.pick_later``; the caller takes the claimed record from ``Tx.pick``
    once the writes were sent, and nothing is returned for it here).
    """
    claims = Claims(tx, owner, lease_ms, events)
    if tx.concurrent:
        decided = (
            limit == 1
            and contention is not None
            and _claim_head(tx, claims, claim_filter, contention, probed, pick_in_writes)
        )
        if not decided:
            _claim_locked(tx, claims, claim_filter, limit, contention)
        return claims.write()
    plan = read_plan(tx, claim_filter, limit)
    for _ in range(limit):
        sweep_expired(tx, plan.next_sweep(), claims.events)
        candidate = plan.next_candidate()
        if candidate is None:
            break
        claims.claim(candidate, targeted=False)
    return claims.write()


def _claim_head(
    tx: Tx,
    claims: Claims,
    claim_filter: ClaimFilter,
    contention: ClaimContention,
    probed: Sequence[StoredRow] | None = None,
    pick_in_writes: bool = False,
) -> bool:
    """A single claim decided by the heads of the queue alone (see ``ClaimContention``): True
    when it is decided (a head claimed, or nothing due, or the claim left to the writes
    statement), False to read the full candidate list (expired leases to act on, a head not
    claimable, or the heads other workers hold).

    ``probed``: the probe's rows, read in this transaction with the same choice of probe (the
    head probe and lock while the queue is quiet, else the window of heads).
    """
    window = not contention.probe_first
    rows = probed
    if rows is None:
        if window:
            probe = head_window_prepared
        else:
            probe = head_probe_and_lock_prepared if tx.restartable else head_probe_prepared
        rows = tx.all(probe(claim_filter), head_probe_params(tx.now, claim_filter))
    if window:
        return _claim_from_window(tx, claims, rows, contention, pick_in_writes)
    # A restartable claim read the heads and locked a plain head in one statement
    # (claim_query._plain); inside a caller's transaction it locks the head afterwards.
    plan = head_plan(rows, tx.now)
    head = None if plan is None else plan.next_candidate()
    fresh = locked_head(tx, rows, head) if tx.restartable else None
    if head is None:
        return plan is not None  # nothing is due, or read the full list
    if fresh is not None:
        locked = [fresh]
    elif tx.restartable and rows[0].head_plain:
        locked = []  # another transaction holds the head
    else:
        locked, _seen = lock_candidates(tx, [head], 1)
    contention.took_first(bool(locked))
    if locked:
        claims.claim(locked[0], targeted=False)
    return bool(locked)


def _claim_from_window(
    tx: Tx,
    claims: Claims,
    rows: Sequence[StoredRow],
    contention: ClaimContention,
    pick_in_writes: bool = False,
) -> bool:
    """``_claim_head`` among workers: the first free candidate of the window of heads
    (``claim_plan.window_plan``) locked and claimed, or left to the writes statement; False
    where the window cannot decide."""
    plan = window_plan(rows, tx.now, HEAD_WINDOW)
    if plan is None:
        return False
    candidates: list[StoredRow] = []
    while (candidate := plan.next_candidate()) is not None:
        candidates.append(candidate)
    if not candidates:
        return not plan.dry  # nothing is due, or the window cannot tell
    if pick_in_writes and _pick_later(tx, claims, candidates, plan.dry, contention):
        return True
    locked, seen = lock_candidates(tx, candidates, 1)
    contention.took_first(bool(locked) and seen == 1)
    if locked:
        claims.claim(locked[0], targeted=False)
        return True
    return not plan.dry  # every due row is held or taken, or read the full list


def _pick_later(
    tx: Tx, claims: Claims, candidates: Sequence[StoredRow], dry: bool, contention: ClaimContention
) -> bool:
    """Leave the claim of the first free of ``candidates`` to the writes statement
    (:mod:`scheduler.backends.postgresql.window_pick`) where it can be (``PendingPick.of``)."""
    if not tx.picks_in_writes:
        return False
    pick = PendingPick.of(
        guarded_claim_update,
        candidates,
        lambda row, record: claims.prepare(row, targeted=False, record=record),
        tx.now,
        may_be_empty=not dry,
        done=lambda position: contention.took_first(position == 0),
    )
    if pick is None:
        return False
    tx.pick_later(pick)
    return True


def _claim_locked(
    tx: Tx, claims: Claims, claim_filter: ClaimFilter, limit: int, contention: ClaimContention | None = None
) -> None:
    """``claim_in`` among concurrent writers: candidates locked SKIP LOCKED, then read again.

    The seed's order is followed; a candidate another transaction holds (or claimed meanwhile)
    is passed over. While no sweep is pending, the next candidates for the rest of the batch are
    locked together (one lock round); otherwise one per step, after that step's sweep, as the
    seed's successive ``claimNext`` calls. When a due arm that may hold more rows than were read
    runs dry (its candidates claimed or passed over), the candidates are read again (without the
    ones already done), so nothing is claimed only when no claimable row remains that another
    transaction does not hold.
    """
    done: set[str] = set()
    plan = read_plan(tx, claim_filter, limit + CONTENDED_EXTRA, done)
    claimed = 0
    while claimed < limit:
        sweep_expired(tx, locked_sweep(tx, plan.next_sweep()), claims.events)
        wanted = 1 if plan.sweep_pending else limit - claimed
        rows, plan, first = _next_locked(tx, plan, claim_filter, wanted, limit - claimed, done)
        if contention is not None and claimed == 0 and rows:
            contention.took_first(first)
        if not rows:
            break
        for row in rows:
            claims.claim(row, targeted=False)
        claimed += len(rows)


def _next_locked(
    tx: Tx, plan: ClaimPlan, claim_filter: ClaimFilter, wanted: int, remaining: int, done: set[str]
) -> tuple[list[StoredRow], ClaimPlan, bool]:
    """Up to ``wanted`` next candidates this transaction locked (fresh rows), the plan they came
    from (a new one after a read again), and whether they were the first ``wanted`` candidates
    offered (none passed over)."""
    first = True
    while True:
        candidates: list[StoredRow] = []
        while len(candidates) < wanted + CONTENDED_EXTRA and (candidate := plan.next_candidate()) is not None:
            candidates.append(candidate)
        if candidates:
            locked, seen = lock_candidates(tx, candidates, wanted)
            plan.put_back(candidates[seen:])
            if locked:
                return locked, plan, first and seen == len(locked)
            first = False
        elif plan.dry:
            plan = read_plan(tx, claim_filter, len(done) + remaining + CONTENDED_EXTRA, done)
        else:
            return [], plan, first


def settle_and_claim_in(
    tx: Tx,
    request: SettleRequest,
    lease_ms: int,
    claim_filter: ClaimFilter,
    contention: ClaimContention | None = None,
) -> SettledAndClaimed:
    """``settle_in`` then ``claim_in`` for the same owner, with the transaction's one ``now``."""
    pending = cycle_in_one_statement(tx, guarded_claim_update, request, lease_ms, claim_filter, contention)
    if pending is not None:  # the whole call is its writes statement (cycle_statement)
        tx.finish = lambda _unsent: pending.result
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
    if tx.restartable and contention is not None and not retry_now:
        # settle's read and the heads at once (the window of heads among workers: _claim_head)
        window = not contention.probe_first
        cycle = read_cycle(tx, request.occurrence_id, request.owner_id, request.fence, claim_filter, window)
        read = {} if cycle.current is None else {request.occurrence_id: cycle.current}
        probed = cycle.heads
    settled = settle_in(tx, request, events, before=refuse_unrepresentable_lease, read=read)
    if probed is not None and settled.status == RETRY_WAIT and settled.available_at <= tx.now:
        raise RestartTransaction  # the heads were read before the retry made its row due
    pick_in_writes = probed is not None
    claimed = claim_in(
        tx,
        request.owner_id,
        lease_ms,
        claim_filter,
        1,
        events,
        contention,
        probed,
        pick_in_writes=pick_in_writes,
    )
    events.flush(tx)
    pick = tx.pick
    if isinstance(pick, PendingPick):  # claimed by the writes statement: its record once they were sent
        tx.finish = lambda cycle: replace(cycle, claimed=pick.picked)
    return SettledAndClaimed(settled=settled, claimed=claimed[0] if claimed else None)


def claim_occurrence_in(tx: Tx, occurrence_id: str, owner: str, lease_ms: int) -> Occurrence | None:
    """Sweep, then claim one named occurrence if the seed's rules allow it.

    Among concurrent writers the named row is locked first, waiting for a transaction holding
    it (a claim of it in flight): this claim then runs as if serially after that one, on rows
    read after the lock, and ``now`` is sampled after it.
    """
    if tx.concurrent:
        lock_target(tx, occurrence_id)
    claims = Claims(tx, owner, lease_ms)
    rows = tx.all(CLAIM_OCCURRENCE_PREPARED, claim_occurrence_params(tx.now, occurrence_id))
    plan = ClaimPlan(rows, tx.now)
    sweep = plan.next_sweep()
    sweep_expired(tx, locked_sweep(tx, sweep) if tx.concurrent else sweep, claims.events)
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
        claimed = self._write(lambda tx: claim_in(tx, owner, lease, claim_filter, 1, None, self._claims))
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
        return self._write(lambda tx: settle_in(tx, request))

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
