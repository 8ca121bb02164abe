"""Queue operations of the Tasks layer (beyond the original): a claim capped by the live leases of
a job kind, finding occurrences by job, kind, status and error code, and settle notifications.

These are module functions over a :class:`~scheduler.store.facade.SchedulerStore` rather than store
methods: the store's public API stays the original's, and they run in the store's own transactions
(``_write`` / ``_read``) like any method, on both backends, sync or through an async store's
``run_sync``.

The cap: :func:`claim_next_capped` holds a per-kind lock for its transaction (PostgreSQL: an advisory
transaction lock; SQLite: ``BEGIN IMMEDIATE`` already serializes writers), counts the kind's
``running`` occurrences whose lease is live at the transaction's ``now``, and claims only below the
cap. Every capped claim of a kind runs one at a time, so however many workers, processes and hosts
claim it, no more than ``cap`` of its occurrences hold a live lease at once (as long as every claim
of that kind goes through here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import bindparam, func, select

from scheduler.contract.constants import OCCURRENCE_STATUSES, RUNNING
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import is_safe_int, normalize_epoch_ms
from scheduler.contract.storable import normalize_key
from scheduler.schema import tables as t
from scheduler.store.capabilities.claim_eligibility import ClaimFilter
from scheduler.store.capabilities.leases import claim_in, normalize_lease_ms
from scheduler.store.capabilities.occurrence_rows import EventLog, occurrence_record, with_index
from scheduler.store.capabilities.occurrences import (
    EnqueueRequest,
    enqueue_batch_in,
    enqueue_in,
    enqueue_once_in,
)
from scheduler.store.facade import SchedulerStore
from scheduler.store.plumbing.constructs import json_text_field
from scheduler.store.plumbing.session import OwnedRunner
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Occurrence

QUEUE_LOCKS: Final = "queue"
"""The ``Tx.lock_keys`` scope of the per-kind claim lock."""
MAX_CAP: Final = 100_000
MAX_FIND_LIMIT: Final = 1_000

_o, _j = t.occurrences, t.jobs
_LIVE_LEASES: Final = Prepared(
    select(func.count())
    .select_from(_o.join(_j, _j.c.job_id == _o.c.job_id))
    .where(
        _o.c.status == RUNNING,
        _o.c.lease_expires_at > bindparam("now"),
        _j.c.kind == bindparam("kind"),
    )
)


def _kind(value: Any) -> str:
    return normalize_key(value, "jobKind", 128)


def live_leases_in(tx: Tx, kind: str) -> int:
    """``running`` occurrences of jobs of ``kind`` whose lease has not expired at ``tx.now``."""
    return int(tx.first(_LIVE_LEASES, {"now": tx.now, "kind": kind})[0])


def claim_capped_in(tx: Tx, owner: str, lease_ms: int, kind: str, cap: int) -> Occurrence | None:
    """Under the kind's lock: ``claim_next`` of that kind if fewer than ``cap`` hold a live lease."""
    claimed = claim_up_to_cap_in(tx, owner, lease_ms, kind, cap, 1)
    return claimed[0] if claimed else None


def claim_up_to_cap_in(
    tx: Tx, owner: str, lease_ms: int, kind: str, cap: int, limit: int, events: EventLog | None = None
) -> list[Occurrence]:
    """Under the kind's lock: up to ``limit`` successive claims of that kind (``claim_in``) while
    fewer than ``cap`` hold a live lease; the same as that many ``claim_capped_in`` in a row (each
    claim adds one live lease of the kind, a sweep none). ``events`` as ``claim_in``'s."""
    tx.lock_keys(QUEUE_LOCKS, [kind])
    room = min(limit, cap - live_leases_in(tx, kind))
    if room <= 0:
        return []
    return claim_in(tx, owner, lease_ms, ClaimFilter((kind,), None), room, events)


def count_live_leases(store: SchedulerStore, *, job_kind: str) -> int:
    """How many occurrences of jobs of ``job_kind`` are ``running`` with a live lease now."""
    store._assert_open()
    kind = _kind(job_kind)
    return store._write(lambda tx: live_leases_in(tx, kind))


def claim_next_capped(
    store: SchedulerStore, *, owner_id: str, lease_ms: int, job_kind: str, cap: int
) -> Occurrence | None:
    """``claim_next(job_kind=job_kind)`` unless ``cap`` occurrences of that kind already hold a live
    lease (then ``None``, nothing written). One write transaction holding the kind's lock.

    ``cap``: 1..100000. Bad arguments are ``SCHEDULER_INVALID_ARGUMENT``.
    """
    owner = normalize_key(owner_id, "ownerId")
    lease = normalize_lease_ms(lease_ms)
    kind = _kind(job_kind)
    if not is_safe_int(cap) or not 1 <= cap <= MAX_CAP:
        raise invalid_argument(f"cap must be an integer between 1 and {MAX_CAP}")
    claimed = store._write(lambda tx: claim_capped_in(tx, owner, lease, kind, cap))
    if claimed is None:
        store._idle()
    return claimed


def _find_in(
    tx: Tx,
    statuses: Sequence[str],
    job_ids: Sequence[str] | None,
    kinds: Sequence[str] | None,
    error_code: str | None,
    after: str | None,
    limit: int,
) -> list[Occurrence]:
    query = select(_o).where(_o.c.status.in_(list(statuses)))
    if job_ids is not None:
        query = query.where(_o.c.job_id.in_(list(job_ids)))
    if kinds is not None:
        query = query.where(_o.c.job_id.in_(select(_j.c.job_id).where(_j.c.kind.in_(list(kinds)))))
    if error_code is not None:
        query = query.where(json_text_field(_o.c.last_error_json, "code") == error_code)
    if after is not None:
        query = query.where(_o.c.occurrence_id > after)
    rows = tx.execute(query.order_by(_o.c.occurrence_id).limit(limit))
    return [occurrence_record(row) for row in rows]


def _identifiers(values: Any, field: str, max_length: int = 256) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str) or not isinstance(values, (list, tuple)) or not values:
        raise invalid_argument(f"{field} must be a non-empty list")
    return sorted({normalize_key(value, field, max_length) for value in values})


def find_occurrences(
    store: SchedulerStore,
    *,
    statuses: Sequence[str],
    job_ids: Sequence[str] | None = None,
    job_kinds: Sequence[str] | None = None,
    error_code: str | None = None,
    after: str | None = None,
    limit: int = 200,
) -> list[Occurrence]:
    """Occurrences in one of ``statuses``, of the given jobs and/or job kinds, whose ``lastError``
    code is ``error_code`` (when given), with an id above ``after``, by id (keyset pages of at most
    ``limit``, 1..1000)."""
    store._assert_open()
    selected = _identifiers(statuses, "statuses")
    assert selected is not None
    unknown = [status for status in selected if status not in OCCURRENCE_STATUSES]
    if unknown:
        raise invalid_argument("unknown occurrence status", {"statuses": unknown})
    jobs = _identifiers(job_ids, "jobIds")
    kinds = _identifiers(job_kinds, "jobKinds", 128)
    code = None if error_code is None else normalize_key(error_code, "errorCode", 128)
    cursor = None if after is None else normalize_key(after, "after")
    if not is_safe_int(limit) or not 1 <= limit <= MAX_FIND_LIMIT:
        raise invalid_argument(f"limit must be an integer between 1 and {MAX_FIND_LIMIT}")
    return store._read(lambda tx: _find_in(tx, selected, jobs, kinds, code, cursor, limit))


@dataclass(frozen=True, slots=True)
class Enqueue:
    """One enqueue of :func:`enqueue_now_or_at`: ``scheduled_for=None`` means the transaction's
    ``now`` (the store's clock, sampled inside it); ``once_per_trigger`` returns any earlier
    occurrence of the job + trigger key instead (``enqueue_occurrence_once_per_trigger``)."""

    job_id: str
    trigger_key: str
    payload: Any
    scheduled_for: int | None = None
    once_per_trigger: bool = False


Check = Callable[[int, Occurrence], None]


def _enqueue_in(tx: Tx, requests: Sequence[Enqueue], check: Check | None) -> list[Occurrence]:
    enqueued: list[Occurrence] = []
    start = 0
    while start < len(requests):
        end = start + 1
        if not requests[start].once_per_trigger:  # plain enqueues side by side go as one batch
            while end < len(requests) and not requests[end].once_per_trigger:
                end += 1
        run = requests[start:end]
        try:
            if len(run) > 1:
                enqueued += enqueue_batch_in(tx, [_request(tx, item) for item in run])
            else:
                item = run[0]
                enqueue = enqueue_once_in if item.once_per_trigger else enqueue_in
                enqueued.append(enqueue(tx, _request(tx, item)))
                if check is not None and item.once_per_trigger:
                    check(start, enqueued[-1])
        except SchedulerKernelError as error:
            if len(requests) > 1:  # a batch names its item; the whole call names it in the call
                details = error.details if len(run) > 1 and isinstance(error.details, dict) else {}
                with_index(error, start + details.get("index", 0))
            raise
        start = end
    return enqueued


def _request(tx: Tx, item: Enqueue) -> EnqueueRequest:
    at = tx.now if item.scheduled_for is None else item.scheduled_for
    return EnqueueRequest(item.job_id, at, item.trigger_key, at, item.payload)


def enqueue_now_or_at(
    store: SchedulerStore, requests: Sequence[Enqueue], check: Check | None = None
) -> list[Occurrence]:
    """``enqueue_occurrence`` (or the once-per-trigger form) of each request in order, in ONE write
    transaction of ``store`` (a SAVEPOINT inside the caller's transaction on an ``on_connection``
    store), ``scheduled_for`` defaulting to the transaction's ``now``. ``check(index, occurrence)``
    runs inside the transaction after each once-per-trigger enqueue; an error it raises rolls
    everything back. Plain enqueues next to each other go as one batch (``enqueue_many``'s
    writes: the same rows, events and errors as one by one). A failing item of several carries
    ``details["index"]``."""
    for item in requests:
        normalize_key(item.job_id, "jobId")
        normalize_key(item.trigger_key, "triggerKey")
        if item.scheduled_for is not None:
            normalize_epoch_ms(item.scheduled_for, "scheduledFor")
    if not requests:
        store._assert_open()
        return []
    return store._write(lambda tx: _enqueue_in(tx, requests, check))


def notify_settlements(store: SchedulerStore) -> str | None:
    """Make ``store``'s own transactions that end an occurrence notify the settle channel
    (``Backend.settle_channel``); return that channel, or ``None`` where nothing is sent (a
    backend without ``NOTIFY``, or a store bound to a caller's transaction, which never
    notifies)."""
    runner = store._runner
    channel = runner.backend.settle_channel(runner.target.schema)
    if not isinstance(runner, OwnedRunner) or channel is None:
        return None
    runner.notify_settled = True
    return channel


__all__ = [
    "Enqueue",
    "claim_next_capped",
    "count_live_leases",
    "enqueue_now_or_at",
    "find_occurrences",
    "notify_settlements",
]
