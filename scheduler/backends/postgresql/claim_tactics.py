"""How a claim takes its candidates among concurrent writers (PostgreSQL's ``Backend.claim``).

The seed's claim reads its candidates and claims them one after the other; among workers that
claim, settle and renew at the same time each candidate is locked first (``claim_locks``) and
passed over when another transaction holds it or changed it. A single claim (``claim_next``, the
claim of a ``settle_and_claim``) first tries the heads of the queue alone (:func:`claim_head`):
the head probe while the queue is quiet, the window of heads among workers
(``ClaimContention``); otherwise, and for a batch, the full candidate list is read and its
candidates locked in rounds (:func:`claim_locked`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from scheduler.backends.postgresql import queries
from scheduler.backends.postgresql.claim_locks import lock_candidates, locked_head, locked_sweep
from scheduler.store.capabilities.claim_eligibility import ClaimFilter
from scheduler.store.capabilities.claim_plan import (
    ClaimContention,
    ClaimPlan,
    head_plan,
    read_plan,
    window_plan,
)
from scheduler.store.capabilities.claim_query import (
    HEAD_WINDOW,
    head_probe_params,
    head_probe_prepared,
    head_window_prepared,
)
from scheduler.store.capabilities.claim_writes import Claims, sweep_expired
from scheduler.store.plumbing.statement_plans import StoredRow
from scheduler.store.plumbing.tx import Tx

CONTENDED_EXTRA: Final = 8
"""Candidates a claim reads beyond its limit on a backend with concurrent writers, so a worker
whose first candidates other workers hold finds the next ones without reading again."""


def claim(
    tx: Tx,
    claims: Claims,
    claim_filter: ClaimFilter,
    limit: int,
    contention: ClaimContention | None,
    probed: Sequence[StoredRow] | None,
) -> None:
    """``Backend.claim`` among concurrent writers: a single claim decided by the heads of the
    queue where it can be, else the full candidate list locked in rounds."""
    decided = (
        limit == 1 and contention is not None and _claim_head(tx, claims, claim_filter, contention, probed)
    )
    if not decided:
        _claim_locked(tx, claims, claim_filter, limit, contention)


def _claim_head(
    tx: Tx,
    claims: Claims,
    claim_filter: ClaimFilter,
    contention: ClaimContention,
    probed: Sequence[StoredRow] | None = None,
) -> bool:
    """A single claim decided by the heads of the queue alone (see ``ClaimContention``): True
    when it is decided (a head claimed, or nothing due), False to read the full candidate list
    (expired leases to act on, a head not claimable, or the heads other workers hold).

    ``probed``: the probe's rows, read in this transaction with the same choice of probe (the
    head probe and lock while the queue is quiet, else the window of heads).
    """
    window = not contention.probe_first
    rows = probed
    if rows is None:
        if not window and tx.call.may_run_again:
            parameters = queries.filter_parameters(claim_filter.kinds, claim_filter.workspace_id)
            rows = tx.all(queries.CLAIM_HEAD, {**parameters, "now": tx.now})
        else:
            probe = head_window_prepared if window else head_probe_prepared
            rows = tx.all(probe(claim_filter), head_probe_params(tx.now, claim_filter))
    if window:
        return _claim_from_window(tx, claims, rows, contention)
    # A call the store may run again read the heads and locked a plain head in one statement
    # (queries.CLAIM_HEAD); inside a caller's transaction it locks the head afterwards.
    plan = head_plan(rows, tx.now)
    head = None if plan is None else plan.next_candidate()
    fresh = locked_head(tx, rows, head) if tx.call.may_run_again else None
    if head is None:
        return plan is not None  # nothing is due, or read the full list
    if fresh is not None:
        locked = [fresh]
    elif tx.call.may_run_again and rows[0].head_plain:
        locked = []  # another transaction holds the head
    else:
        locked, _seen = lock_candidates(tx, [head], 1)
    contention.took_first(bool(locked))
    if locked:
        claims.claim(locked[0], targeted=False)
    return bool(locked)


def _claim_from_window(
    tx: Tx, claims: Claims, rows: Sequence[StoredRow], contention: ClaimContention
) -> bool:
    """``_claim_head`` among workers: the first free candidate of the window of heads
    (``claim_plan.window_plan``) locked and claimed; False where the window cannot decide."""
    plan = window_plan(rows, tx.now, HEAD_WINDOW)
    if plan is None:
        return False
    candidates: list[StoredRow] = []
    while (candidate := plan.next_candidate()) is not None:
        candidates.append(candidate)
    if not candidates:
        return not plan.dry  # nothing is due, or the window cannot tell
    locked, seen = lock_candidates(tx, candidates, 1)
    contention.took_first(bool(locked) and seen == 1)
    if locked:
        claims.claim(locked[0], targeted=False)
        return True
    return not plan.dry  # every due row is held or taken, or read the full list


def _claim_locked(
    tx: Tx, claims: Claims, claim_filter: ClaimFilter, limit: int, contention: ClaimContention | None = None
) -> None:
    """A claim among concurrent writers from the full candidate list: candidates locked SKIP
    LOCKED, then read again.

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
