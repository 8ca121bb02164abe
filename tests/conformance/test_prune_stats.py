"""``store.prune`` (what may be deleted, in bounded batches) and ``store.stats``, on both backends
(``place``).

API §9 (prune, stats).
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduler import SchedulerKernelError, scheduler_adjudication_operator_digest
from scheduler.contract.digests import scheduler_adjudication_reason_digest
from scheduler.testing import T0, SchedulerClock
from tests.lifecycle_support import CAPABILITY_DIGEST, CAPABILITY_JSON
from tests.migration_fixtures import agenda_entry, plan
from tests.store_places import StorePlace
from tests.worker_support import add_job, enqueue

HOUR = 3_600_000
BUDGETED = {"principal": {"type": "service", "id": "budgeted"}, "requestedCapabilities": ["run"]}


def settle(store: Any, occurrence_id: str, *, outcome: str = "succeeded", error: Any = None) -> Any:
    claimed = store.claim_occurrence(occurrence_id=occurrence_id, owner_id="w", lease_ms=60_000)
    assert claimed is not None
    return store.settle(
        occurrence_id=occurrence_id,
        owner_id="w",
        fence=claimed.fence,
        outcome=outcome,
        error=error,
        retryable=False,
    )


def finished(store: Any, job: str, key: str, **options: Any) -> str:
    occurrence_id = enqueue(store, job, key)
    settle(store, occurrence_id, **options)
    return occurrence_id


def rows(place: StorePlace, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return place.sql(sql, params)


def present(place: StorePlace, occurrence_id: str) -> bool:
    return bool(rows(place, "SELECT 1 FROM occurrences WHERE occurrence_id = ?", occurrence_id))


def test_prune_deletes_only_what_nothing_else_needs(place: StorePlace) -> None:

    clock = SchedulerClock()
    store = place.open(clock=clock)
    add_job(store, "plain", max_attempts=1)
    add_job(store, "ticker", trigger={"type": "interval", "everyMs": 1000, "anchor": T0})
    store.create_job(id="budgeted", kind="budgeted", authority=BUDGETED, max_attempts=1)
    policy = store.ensure_authority_policy(BUDGETED, window_ms=4 * HOUR)

    old = finished(store, "plain", "old")
    unknown = finished(store, "plain", "unknown", outcome="failed", error={"code": "MAIL_OUTCOME_UNKNOWN"})
    decided = finished(store, "plain", "decided", outcome="failed", error={"code": "MAIL_OUTCOME_UNKNOWN"})
    case = store.get_adjudication_case(decided)
    store.adjudicate_occurrence(
        occurrence_id=decided,
        decision="confirmed_not_applied",
        expected_evidence_digest=case.evidence_digest,
        expected_attempt=case.attempt,
        expected_fence=case.fence,
        reason_digest=scheduler_adjudication_reason_digest("checked the mailbox"),
        operator_digest=scheduler_adjudication_operator_digest("ops"),
    )
    settle(store, decided)  # the adjudicated retry succeeded: the adjudication is applied
    ticks = [enqueue(store, "ticker", f"interval:{k}", at=T0 + k * 1000) for k in range(3)]
    clock.advance(3_000)
    for tick in ticks:
        settle(store, tick)
    reserved = enqueue(store, "budgeted", "reserved")
    claimed = store.claim_occurrence(occurrence_id=reserved, owner_id="w", lease_ms=60_000)
    store.reserve_authority(occurrence_id=reserved, policy_revision=policy.revision)
    store.settle(occurrence_id=reserved, owner_id="w", fence=claimed.fence, outcome="succeeded")
    paused = finished(store, "plain", "pause-requested")
    requeued = finished(store, "plain", "requeue-request")
    migration = store.prepare_domain_migration(plan(agenda_entry()))
    store.apply_domain_migration(migration.id)
    target = store.get_job("agenda-migrated-42")
    store.update_job(target.id, target.revision, enabled=True)
    migrated = finished(store, "agenda-migrated-42", "migrated")
    clock.set(T0 + 90 * 60_000)
    recent = finished(store, "plain", "recent")
    # rows the lifecycle leaves on terminal rows only in odd cases
    place.sql(
        "INSERT INTO scheduler_occurrence_retries VALUES (?, 'r1', 1, 'execution_failed', ?, NULL)",
        (requeued, T0),
    )
    place.sql(
        "INSERT INTO scheduler_occurrence_controls VALUES"
        " (?, ?, ?, 'pause_requested', 1, 'p1', NULL, 1, NULL, ?, NULL, NULL, NULL, ?)",
        (paused, CAPABILITY_JSON, CAPABILITY_DIGEST, T0, T0),
    )
    clock.set(T0 + 2 * HOUR)

    preview = store.prune(older_than_ms=HOUR, dry_run=True)
    assert all(present(place, identifier) for identifier in (old, decided, *ticks))
    result = store.prune(older_than_ms=HOUR, batch_size=2)
    assert (preview.occurrences, preview.events) == (result.occurrences, result.events)
    assert result.dry_run is False and result.cutoff == T0 + HOUR and result.batches > 1
    pruned = {old, decided, ticks[0], ticks[1]}
    kept = {unknown, ticks[2], reserved, paused, requeued, migrated, recent}
    assert result.occurrences == len(pruned) and result.adjudications == 1
    assert not any(present(place, identifier) for identifier in pruned)
    assert all(present(place, identifier) for identifier in kept)
    assert rows(place, "SELECT count(*) FROM events WHERE occurrence_id = ?", old) == [(0,)]
    assert rows(place, "SELECT count(*) FROM events WHERE job_id = 'plain' AND occurrence_id IS NULL") == [
        (1,)
    ]

    clock.set(T0 + 5 * HOUR)  # the budget window [T0, T0 + 4 h) has closed
    later = store.prune(older_than_ms=HOUR)
    assert later.occurrences == 2 and later.reservations == 1  # the reserved one and `recent`
    assert not present(place, reserved) and present(place, unknown)

    again = store.enqueue_occurrence(job_id="plain", scheduled_for=0, trigger_key="old")
    assert again.id == old and again.deduplicated is False  # a pruned idempotency key can be enqueued again
    store.close()


@pytest.mark.parametrize(
    "options",
    [
        {"older_than_ms": -1},
        {"older_than_ms": 1, "batch_size": 0},
        {"older_than_ms": 1, "batch_size": 10_001},
        {"older_than_ms": 1, "statuses": ["queued"]},
        {"older_than_ms": 1, "dry_run": "yes"},
        {"older_than_ms": 1, "max_batches": 0},
    ],
)
def test_prune_rejects_invalid_arguments(place: StorePlace, options: dict[str, Any]) -> None:
    store = place.open()
    with pytest.raises(SchedulerKernelError) as raised:
        store.prune(**options)
    assert raised.value.code == "SCHEDULER_INVALID_ARGUMENT"
    store.close()


def test_stats_report_depth_age_leases_dead_letters_and_adjudications(place: StorePlace) -> None:
    clock = SchedulerClock()
    store = place.open(clock=clock)
    add_job(store, "mail", kind="email", max_attempts=1)
    add_job(store, "report", max_attempts=1)
    add_job(store, "off", enabled=True)
    waiting = enqueue(store, "mail", "due", at=T0 - 5_000)
    enqueue(store, "mail", "future", at=T0 + HOUR)
    enqueue(store, "off", "disabled-job", at=T0 - 60_000)
    store.update_job("off", 1, enabled=False)
    finished(store, "report", "done")
    finished(store, "report", "lost", outcome="failed", error={"code": "REPORT_OUTCOME_UNKNOWN"})
    store.claim_occurrence(occurrence_id=enqueue(store, "report", "stuck"), owner_id="w", lease_ms=1_000)
    store.claim_occurrence(occurrence_id=enqueue(store, "report", "busy"), owner_id="w", lease_ms=60_000)
    clock.advance(2_000)

    stats = store.stats()
    assert stats.statuses == {"queued": 3, "running": 2, "retry_wait": 0, "succeeded": 1, "dead_letter": 1}
    assert [(row.kind, row.status, row.count) for row in stats.depth] == [
        ("email", "queued", 2),
        ("off", "queued", 1),
        ("report", "dead_letter", 1),
        ("report", "running", 2),
    ]
    assert (
        stats.oldest_due_at == T0 - 5_000 and stats.oldest_due_age_ms == 7_000
    )  # the disabled job's is skipped
    assert (stats.running, stats.expired_leases, stats.dead_letters) == (2, 1, 1)
    assert (stats.adjudications_awaiting_decision, stats.adjudications_pending, stats.paused) == (1, 0, 0)
    assert stats.to_dict()["oldestDueAgeMs"] == 7_000
    assert store.queue_depth() == [(row.kind, row.status, row.count) for row in stats.depth]
    assert waiting
    store.close()
