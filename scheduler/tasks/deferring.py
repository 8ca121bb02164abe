"""``defer``: a task call checked and turned into an occurrence (API §10).

Everything is checked before anything is written: the arguments bind to the function's parameters
and are JSON, ``key`` is an identifier, ``run_at`` an aware ``datetime`` or epoch milliseconds. Then
ONE write transaction (of the store, or a SAVEPOINT in the caller's transaction) enqueues each
call:

* without ``key``: a new run, trigger key ``run:<random hex>``, due at ``run_at`` or at the store's
  clock read inside that transaction (never 0);
* with ``key``: trigger key ``key:<key>`` through ``enqueue_occurrence_once_per_trigger``, so the
  first run of that key wins whatever ``run_at`` says; a later call with other arguments (compared
  as canonical JSON) is ``SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH`` and rolls the whole call back.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import normalize_epoch_ms
from scheduler.contract.storable import normalize_key
from scheduler.store.capabilities.queues import Enqueue, enqueue_now_or_at
from scheduler.store.facade import SchedulerStore
from scheduler.store.records import Occurrence
from scheduler.tasks.arguments import bind_arguments, payload_of, same_call
from scheduler.tasks.definition import TaskDefinition
from scheduler.tasks.tracing import current_trace

KEY_PREFIX: Final = "key:"
RUN_PREFIX: Final = "run:"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
DEFER_KEYWORDS: Final = frozenset({"key", "run_at"})
"""What a ``defer_many`` item may hold besides the call's arguments."""


def run_at_ms(value: Any) -> int | None:
    """``run_at``: ``None``, an aware ``datetime`` or epoch milliseconds (``int``)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise invalid_argument("run_at must be a timezone-aware datetime (or epoch milliseconds)")
        return normalize_epoch_ms((value - _EPOCH) // _MS, "run_at")
    return normalize_epoch_ms(value, "run_at")


@dataclass(frozen=True, slots=True)
class DeferCall:
    """One checked call: the task, its bound arguments, and ``key`` / ``run_at``."""

    definition: TaskDefinition
    arguments: dict[str, Any]
    trigger_key: str
    keyed: bool
    run_at: int | None

    def request(self, trace: dict[str, str] | None) -> Enqueue:
        return Enqueue(
            job_id=self.definition.name,
            trigger_key=self.trigger_key,
            payload=payload_of(self.arguments, trace),
            scheduled_for=self.run_at,
            once_per_trigger=self.keyed,
        )


def make_call(
    definition: TaskDefinition, args: tuple[Any, ...], kwargs: Mapping[str, Any], key: Any, run_at: Any
) -> DeferCall:
    """Check a ``defer`` call; ``SCHEDULER_INVALID_ARGUMENT`` for anything wrong."""
    arguments = bind_arguments(definition, args, kwargs)
    if key is None:
        trigger_key = RUN_PREFIX + uuid.uuid4().hex
    else:
        trigger_key = KEY_PREFIX + normalize_key(key, "key", 256 - len(KEY_PREFIX))
    return DeferCall(definition, arguments, trigger_key, key is not None, run_at_ms(run_at))


def make_item(definition: TaskDefinition, item: Any) -> DeferCall:
    """A ``defer_many`` item: a dict of the call's keyword arguments, plus ``key`` / ``run_at``."""
    if not isinstance(item, Mapping):
        raise invalid_argument("each defer_many item must be a dict of keyword arguments")
    keywords = {name: value for name, value in item.items() if name not in DEFER_KEYWORDS}
    return make_call(definition, (), keywords, item.get("key"), item.get("run_at"))


def _mismatch(call: DeferCall, occurrence: Occurrence) -> SchedulerKernelError:
    return SchedulerKernelError(
        "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH",
        f"key {call.trigger_key[len(KEY_PREFIX) :]!r} of task {call.definition.name} names a run "
        "with other arguments",
        {"jobId": call.definition.name, "triggerKey": call.trigger_key, "runId": occurrence.id},
    )


def defer_on(store: SchedulerStore, calls: Sequence[DeferCall]) -> list[Occurrence]:
    """Enqueue ``calls`` in one write transaction of ``store``; the occurrences, in order."""
    trace = current_trace()

    def check(index: int, occurrence: Occurrence) -> None:
        call = calls[index]
        if occurrence.deduplicated and not same_call(call.definition, occurrence.payload, call.arguments):
            raise _mismatch(call, occurrence)

    return enqueue_now_or_at(store, [call.request(trace) for call in calls], check)


__all__ = ["DeferCall", "defer_on", "make_call", "make_item", "run_at_ms"]
