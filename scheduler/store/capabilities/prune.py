"""``prune``: delete old terminal occurrences with their events and child rows (beyond the original).

An occurrence is pruned only when every part of the store that may still read it is done with it.
It must be ``succeeded`` or ``dead_letter``, settled before the cutoff, and have

* no pending adjudication: neither a recorded decision whose retry has not settled, nor an
  outcome-unknown dead letter still awaiting a decision (its evidence must stay readable);
* no active runtime control (``pause_requested``, ``paused``, ``resumed``) and no unclaimed requeue
  request at its current fence (one a cancel left behind at an older fence can never be claimed);
* no authority reservation in a budget window that is still open (the budget check compares the
  window's usage with its reservations, so they must stay until the window closes);
* a job that is not the target of a domain-migration entry that can still be rolled back (rollback
  compares the target's occurrence and event counts with the recorded ones);
* and it must not be its job's last fired periodic tick of its trigger type (the ``cron:``,
  ``interval:`` or ``once:`` key with the largest ``scheduled_for`` among all the job's
  occurrences, ``periodic_ticks.latest_ticks_in``: what a worker reads to know which ticks it
  fired), so a restarted worker never fires an old tick again, however many other occurrences
  the job has.

Deleted with it: its ``events`` rows, authority reservation, adjudication, runtime control and
requeue requests. Jobs, job-level events and authority usage counters stay. Each batch is one write
transaction; a pruned occurrence's idempotency key can be enqueued again (it creates a new occurrence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import and_, bindparam, delete, exists, func, or_, select

from scheduler.contract.constants import DEAD_LETTER, SUCCEEDED
from scheduler.contract.errors import invalid_argument
from scheduler.contract.scalars import assert_non_negative_safe_int, normalize_epoch_ms
from scheduler.schema import tables as t
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.occurrence_rows import chunks
from scheduler.store.capabilities.periodic_ticks import FiredTick, latest_ticks_in, tick_prefix
from scheduler.store.plumbing.constructs import glob_match, json_text_field
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Record

PRUNABLE_STATUSES: Final = (SUCCEEDED, DEAD_LETTER)
DEFAULT_PRUNE_BATCH: Final = 500
MAX_PRUNE_BATCH: Final = 10_000

_o = t.occurrences
_a = t.adjudications
_c = t.occurrence_controls
_r = t.occurrence_retries
_res = t.authority_reservations
_pol = t.authority_policies
_entries = t.domain_migration_entries
_e = t.events


@dataclass(frozen=True, slots=True)
class PruneResult(Record):
    """What ``prune`` deleted (or, with ``dry_run``, would delete), row counts per table."""

    cutoff: int
    dry_run: bool
    batches: int
    occurrences: int
    events: int
    reservations: int
    adjudications: int
    controls: int
    requeue_requests: int


def _eligible() -> Any:
    """The SQL conditions an occurrence ``_o`` must meet (binds ``status``, ``cutoff``, ``now``)."""
    return and_(
        _o.c.status == bindparam("status"),
        _o.c.available_at < bindparam("cutoff"),
        _o.c.settled_at < bindparam("cutoff"),
        ~exists().where(_a.c.occurrence_id == _o.c.occurrence_id, _a.c.status == "pending"),
        ~and_(
            _o.c.status == DEAD_LETTER,
            glob_match(json_text_field(_o.c.last_error_json, "code"), "*_OUTCOME_UNKNOWN"),
            ~exists().where(_a.c.occurrence_id == _o.c.occurrence_id),
        ),
        ~exists().where(_c.c.occurrence_id == _o.c.occurrence_id, _c.c.state != "terminal"),
        ~exists().where(  # a request at an older fence (left by a cancel) can never be claimed
            _r.c.occurrence_id == _o.c.occurrence_id,
            _r.c.claimed_at.is_(None),
            _r.c.expected_fence == _o.c.fence,
        ),
        ~exists().where(
            _res.c.occurrence_id == _o.c.occurrence_id,
            _pol.c.principal_type == _res.c.principal_type,
            _pol.c.principal_id == _res.c.principal_id,
            _pol.c.revision == _res.c.policy_revision,
            _res.c.window_started_at + _pol.c.window_ms > bindparam("now"),
        ),
        ~exists().where(_entries.c.target_job_id == _o.c.job_id, _entries.c.state != "rolled_back"),
    )


def _after_cursor() -> Any:
    """Keyset pagination in ``scheduler_occurrences_claim`` order (``lease_expires_at`` is NULL here)."""
    available: Any = bindparam("c_available")
    scheduled: Any = bindparam("c_scheduled")
    identifier: Any = bindparam("c_id")
    return and_(
        _o.c.available_at >= available,  # the index range; the OR below makes it exact
        or_(
            _o.c.available_at > available,
            and_(_o.c.available_at == available, _o.c.scheduled_for > scheduled),
            and_(
                _o.c.available_at == available,
                _o.c.scheduled_for == scheduled,
                _o.c.occurrence_id > identifier,
            ),
        ),
    )


_CANDIDATES: Final = (
    select(_o.c.occurrence_id, _o.c.job_id, _o.c.trigger_key, _o.c.available_at, _o.c.scheduled_for)
    .where(_eligible(), _after_cursor())
    .order_by(_o.c.available_at, _o.c.lease_expires_at, _o.c.scheduled_for, _o.c.occurrence_id)
    .limit(bindparam("batch"))
)
_IDS: Any = bindparam("ids", expanding=True)
_CHILDREN: Final = {
    "events": _e.c.occurrence_id,
    "reservations": _res.c.occurrence_id,
    "adjudications": _a.c.occurrence_id,
    "controls": _c.c.occurrence_id,
    "requeue_requests": _r.c.occurrence_id,
}


def _outranks(row: Any, kept: FiredTick | None) -> bool:
    """Whether the candidate is newer than the newest tick of its type read so far."""
    return kept is None or (row.scheduled_for, row.occurrence_id) > (kept.scheduled_for, kept.occurrence_id)


@dataclass
class _Pass:
    """Progress of one prune call: the cursor per status and the running totals."""

    cutoff: int
    now: int
    batch: int
    dry_run: bool
    counts: dict[str, int]
    batches: int = 0
    newest: dict[str, dict[str, FiredTick]] = field(default_factory=dict)
    """Each job's newest tick per type, read once per prune (re-read when a candidate might outrank
    it: a tick fired meanwhile, or one another prune left as the newest)."""

    def _protected(self, tx: Tx, rows: Sequence[Any]) -> set[str]:
        """The candidates' jobs' newest ticks: what a restarted worker reads, never pruned."""
        for row in rows:
            family = tick_prefix(row.trigger_key)
            known = self.newest.get(row.job_id)
            if family is not None and (known is None or _outranks(row, known.get(family))):
                self.newest[row.job_id] = latest_ticks_in(tx, row.job_id)
        return {
            tick.occurrence_id
            for job_id in {row.job_id for row in rows}
            for tick in self.newest.get(job_id, {}).values()
        }

    def run_batch(self, tx: Tx, status: str, cursor: tuple[int, int, str]) -> tuple[int, int, str] | None:
        """Prune one batch after ``cursor``; the next cursor, or ``None`` when the status is done."""
        parameters = {
            "status": status,
            "cutoff": self.cutoff,
            "now": self.now,
            "batch": self.batch,
            "c_available": cursor[0],
            "c_scheduled": cursor[1],
            "c_id": cursor[2],
        }
        rows = tx.all(_CANDIDATES, parameters)
        if not rows:
            return None
        self.batches += 1
        protected = self._protected(tx, rows)
        ids = [row.occurrence_id for row in rows if row.occurrence_id not in protected]
        if ids:
            self._delete(tx, ids)
        last = rows[-1]
        return (last.available_at, last.scheduled_for, last.occurrence_id)

    def _delete(self, tx: Tx, ids: list[str]) -> None:
        for chunk in chunks(ids):
            bound = {"ids": list(chunk)}
            for name, column in _CHILDREN.items():
                if self.dry_run:
                    count = tx.scalar(
                        select(func.count()).select_from(column.table).where(column.in_(_IDS)), bound
                    )
                else:
                    count = tx.changes(delete(column.table).where(column.in_(_IDS)), bound)
                self.counts[name] += int(count)
            if not self.dry_run:
                tx.changes(delete(_o).where(_o.c.occurrence_id.in_(_IDS)), bound)
        self.counts["occurrences"] += len(ids)


def _normalize_statuses(statuses: Any) -> tuple[str, ...]:
    if isinstance(statuses, str) or not isinstance(statuses, (list, tuple)) or not statuses:
        raise invalid_argument("statuses must be a non-empty list of succeeded / dead_letter")
    chosen = tuple(dict.fromkeys(statuses))
    if any(status not in PRUNABLE_STATUSES for status in chosen):
        raise invalid_argument("statuses may only contain succeeded and dead_letter")
    return chosen


class PruneOperations(StoreBase):
    """``prune``: bounded deletion of old terminal occurrences."""

    def prune(
        self,
        *,
        older_than_ms: int,
        batch_size: int = DEFAULT_PRUNE_BATCH,
        dry_run: bool = False,
        statuses: Sequence[str] = PRUNABLE_STATUSES,
        max_batches: int | None = None,
    ) -> PruneResult:
        """Delete terminal occurrences settled more than ``older_than_ms`` ago, with their events and
        child rows, in write transactions of at most ``batch_size`` (1..10000) occurrences each.

        Only occurrences no other part of the store still needs are deleted (see the module
        docstring and docs/operations.md). ``dry_run`` counts what would be deleted without writing.
        ``statuses``: which terminal statuses (default both). ``max_batches`` stops early.
        A pruned idempotency key can be enqueued again. Invalid arguments raise
        ``SCHEDULER_INVALID_ARGUMENT``.
        """
        age = assert_non_negative_safe_int(older_than_ms, "olderThanMs")
        if type(batch_size) is not int or not 1 <= batch_size <= MAX_PRUNE_BATCH:
            raise invalid_argument(f"batchSize must be an integer between 1 and {MAX_PRUNE_BATCH}")
        if not isinstance(dry_run, bool):
            raise invalid_argument("dryRun must be a boolean")
        chosen = _normalize_statuses(statuses)
        if max_batches is not None and (type(max_batches) is not int or max_batches < 1):
            raise invalid_argument("maxBatches must be a positive integer")
        self._assert_open()
        now = normalize_epoch_ms(self.clock(), "clock result")
        counts = dict.fromkeys(("occurrences", *_CHILDREN), 0)
        progress = _Pass(max(0, now - age), now, batch_size, dry_run, counts)
        run = self._read if dry_run else self._write
        for status in chosen:
            cursor: tuple[int, int, str] | None = (-1, -1, "")
            while cursor is not None and (max_batches is None or progress.batches < max_batches):
                current = cursor
                cursor = run(lambda tx: progress.run_batch(tx, status, current))  # noqa: B023
        return PruneResult(cutoff=progress.cutoff, dry_run=dry_run, batches=progress.batches, **counts)
