"""A batched worker's group as one write call (beyond the original; for :mod:`scheduler.worker` only).

:func:`commit_group` settles the runs of a group that finished and claims for the worker's free
lanes in ONE store-owned write transaction with one clock sample: ``settle_many_in`` of the
settlements, then the worker's claims (:class:`GroupClaims`: its kinds, or the Tasks worker's
queues in order, capped ones under their cap), then the claimed runs' job kinds and controls
(``occurrence_runtimes_in``), every event of the call written with one ``INSERT``. It is one
``store._write`` call, so no operation of it runs in a savepoint of its own (a claim takes one
only when the call runs again: ``CallMode``), and it is all or nothing like any store call.

Not public API (the store's public calls are unchanged; ``settle_many_and_claim`` is the public
call for a worker loop of one's own). Beyond what that call does, the worker needs its claim steps,
the runtimes and where a failure arose: :class:`GroupFailure` tells an error of the settlements (a
``SCHEDULER_LEASE_LOST`` with ``details["index"]`` drops that member) from one of the claims or of
the commit (the group is then settled alone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import is_safe_int
from scheduler.contract.storable import normalize_key
from scheduler.store.capabilities.claim_eligibility import ClaimFilter
from scheduler.store.capabilities.leases import (
    claim_in,
    normalize_claim_batch_limit,
    normalize_job_kinds,
    normalize_lease_ms,
)
from scheduler.store.capabilities.occurrence_rows import EventLog, validate_batch
from scheduler.store.capabilities.queues import MAX_CAP, claim_up_to_cap_in
from scheduler.store.capabilities.settle_request import SettleRequest, normalize_settle_mapping
from scheduler.store.capabilities.settlement import settle_many_in
from scheduler.store.capabilities.worker_reads import OccurrenceRuntime, occurrence_runtimes_in
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Occurrence

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore

LEASE_LOST: Final = "SCHEDULER_LEASE_LOST"


@dataclass(frozen=True, slots=True)
class ClaimStep:
    """Claims of one kind filter: ``filter`` as ``claim_batch``'s ``job_kind``; with ``cap``, of
    its one kind, only while fewer than ``cap`` of that kind hold a live lease
    (``queues.claim_next_capped``)."""

    filter: ClaimFilter
    cap: int | None = None


@dataclass(frozen=True, slots=True)
class GroupClaims:
    """What a worker claims for its free lanes: for ``owner`` with leases of ``lease_ms``, the
    steps in order, each taking what it can before the next is tried (validated once:
    :func:`group_claims`)."""

    owner: str
    lease_ms: int
    steps: tuple[ClaimStep, ...]


def group_claims(
    owner_id: str, lease_ms: int, steps: Sequence[tuple[str | Sequence[str], int | None]]
) -> GroupClaims:
    """:class:`GroupClaims` from ``(job kinds, cap)`` pairs (a cap only for a single kind,
    1..100000); bad values are ``SCHEDULER_INVALID_ARGUMENT``."""
    owner = normalize_key(owner_id, "ownerId")
    lease = normalize_lease_ms(lease_ms)
    if not steps:
        raise invalid_argument("a worker group claims at least one kind")
    validated = []
    for kinds, cap in steps:
        claim_filter = ClaimFilter(normalize_job_kinds(kinds), None)
        one_kind = claim_filter.kinds is not None and len(claim_filter.kinds) == 1
        if cap is not None and (not is_safe_int(cap) or not 1 <= cap <= MAX_CAP or not one_kind):
            raise invalid_argument(f"cap must be an integer between 1 and {MAX_CAP}, for one job kind")
        validated.append(ClaimStep(claim_filter, cap))
    return GroupClaims(owner, lease, tuple(validated))


@dataclass(frozen=True, slots=True)
class CommittedGroup:
    """A group committed: the settled records (in the settlements' order), the claimed ones (in
    claim order) and the claimed runs' job kinds and controls as read in the same transaction."""

    settled: list[Occurrence]
    claimed: list[Occurrence]
    runtimes: dict[str, OccurrenceRuntime]


@dataclass(frozen=True, slots=True)
class GroupFailure:
    """A group that wrote nothing: the error, and whether it arose in the settlements (their
    validation or settling: a member's error carries ``details["index"]``) rather than in the
    claims, the runtimes read or the commit."""

    error: SchedulerKernelError
    in_settlements: bool


def runs_groups(store: object) -> bool:
    """Whether :func:`commit_group` can run on ``store`` (a ``SchedulerStore``, or an object
    passing its attributes through)."""
    return all(callable(getattr(store, name, None)) for name in ("_write", "_assert_open", "_idle"))


class _Phase:
    """Where the call is (a new attempt of the call starts over)."""

    __slots__ = ("settling",)

    def __init__(self) -> None:
        self.settling = False


def claim_steps_in(tx: Tx, claims: GroupClaims, limit: int, events: EventLog) -> list[Occurrence]:
    """Up to ``limit`` claims, the steps in order (each takes what it can before the next is tried)."""
    claimed: list[Occurrence] = []
    for step in claims.steps:
        remaining = limit - len(claimed)
        if remaining <= 0:
            break
        if step.cap is None:
            claimed += claim_in(tx, claims.owner, claims.lease_ms, step.filter, remaining, events)
        else:
            kinds = step.filter.kinds
            assert kinds is not None
            claimed += claim_up_to_cap_in(
                tx, claims.owner, claims.lease_ms, kinds[0], step.cap, remaining, events
            )
    return claimed


def _group_in(
    tx: Tx, requests: Sequence[SettleRequest], claims: GroupClaims, limit: int, phase: _Phase
) -> CommittedGroup:
    events = EventLog(tx)  # both halves' events, in order, written with one INSERT
    phase.settling = bool(requests)
    settled = settle_many_in(tx, requests, events) if requests else []
    phase.settling = False
    claimed = claim_steps_in(tx, claims, limit, events) if limit else []
    runtimes = occurrence_runtimes_in(tx, [occurrence.id for occurrence in claimed]) if claimed else {}
    events.flush(tx)
    return CommittedGroup(settled, claimed, runtimes)


def commit_group(
    store: SchedulerStore, settlements: Sequence[Mapping[str, object]], claims: GroupClaims, limit: int
) -> CommittedGroup | GroupFailure:
    """Settle ``settlements`` (dicts of ``settle``'s keyword arguments) and claim up to ``limit``
    (0..1000; 0: settle only) as ``claims`` says, in ONE write transaction of ``store``, with one
    clock sample; then read the claimed runs' job kinds and controls in it.

    All or nothing: on any error nothing is written, the leases of the settlements are still held
    and the error is returned (:class:`GroupFailure`, never raised). A settlement's failure
    (validation, ``SCHEDULER_LEASE_LOST``, …) carries its ``details["index"]``.
    """
    phase = _Phase()
    try:
        phase.settling = True
        requests = validate_batch(settlements, normalize_settle_mapping, "settlements")
        phase.settling = False
        bounded = normalize_claim_batch_limit(limit, minimum=0)
        if not requests and not bounded:
            store._assert_open()
            return CommittedGroup([], [], {})
        group = store._write(lambda tx: _group_in(tx, requests, claims, bounded, phase))
    except SchedulerKernelError as error:
        # No claim raises SCHEDULER_LEASE_LOST: one is a settlement's, also where its write was
        # kept for the claims' statement or the COMMIT (it carries its index there too).
        return GroupFailure(error, in_settlements=phase.settling or error.code == LEASE_LOST)
    if bounded and not group.claimed:
        store._idle()
    return group
