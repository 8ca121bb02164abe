"""Rollback from every state, both strategies, created/updated/reused targets, every fail-closed rule.

Every test with a store runs on both backends (``place``).

API §5 Domain migration journal (v4, v5).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from migration_fixtures import (
    Harness,
    agenda_entry,
    cowork_entry,
    harness_in,
    plan,
    raises,
    retire_all,
    run_to_retiring,
    sources_of,
    target_job,
    uuid_for,
)
from store_places import StorePlace

from scheduler.contract.digests import scheduler_migration_source_digest
from scheduler.contract.jobs import scheduler_job_definition_digest

INVALID = "SCHEDULER_INVALID_ARGUMENT"
STATE_CONFLICT = "SCHEDULER_MIGRATION_STATE_CONFLICT"
TARGET_CHANGED = "SCHEDULER_MIGRATION_TARGET_CHANGED"
EVIDENCE = "SCHEDULER_MIGRATION_EXECUTION_EVIDENCE"


@pytest.fixture
def h(place: StorePlace) -> Iterator[Harness]:
    yield from harness_in(place)


OLD_COWORK = target_job("cowork-cron-migrated-7", "cowork-cron", payload={"old": True})
OLD_AGENDA = target_job("agenda-migrated-42", payload={"old": "agenda"})


def create(h: Harness, job: dict[str, Any]) -> None:
    args = {("max_attempts" if key == "maxAttempts" else key): value for key, value in job.items()}
    h.store.create_job(**args)


def source_of(migration_plan: dict[str, Any], entry: Any) -> Any:
    return next(e["source"] for e in migration_plan["entries"] if e["sourceId"] == entry.source_id)


def restore_all(h: Harness, migration_plan: dict[str, Any], migration_id: str) -> Any:
    migration = h.store.get_domain_migration(migration_id)
    for entry in migration.entries:
        h.tick()
        restored = h.store.confirm_domain_migration_entry_source_restored(
            migration_id=migration_id,
            entry_id=entry.entry_id,
            retirement_token=entry.retirement_token,
            source=source_of(migration_plan, entry),
        )
        assert restored.state == "rolled_back"
    return h.store.get_domain_migration(migration_id)


def advance(h: Harness, migration_plan: dict[str, Any], to_state: str) -> Any:
    """Drive a fresh migration of ``migration_plan`` to ``to_state``; returns it."""
    h.tick()
    migration = h.store.prepare_domain_migration(migration_plan)
    if to_state == "prepared":
        return migration
    h.tick()
    migration = h.store.apply_domain_migration(migration.id)
    if to_state == "applied":
        return migration
    h.tick()
    migration = h.store.verify_domain_migration(migration.id, sources=sources_of(migration_plan, migration))
    if to_state == "verified":
        return migration
    h.tick()
    migration = h.store.begin_domain_migration_retirement(migration.id)
    if to_state == "retiring":
        return migration
    return retire_all(h, migration_plan, migration)


def definition_digest(h: Harness, job_id: str) -> str:
    job = h.store.get_job(job_id)
    assert job is not None
    return scheduler_job_definition_digest(job.definition())


# --------------------------------------------------------------------------- from prepared


def test_rollback_from_prepared_has_no_target_work(h: Harness) -> None:
    migration_plan = plan(agenda_entry(), cowork_entry())
    migration = advance(h, migration_plan, "prepared")
    h.tick()
    rolling = h.store.begin_domain_migration_rollback(migration.id)
    assert rolling.state == "rolling_back" and rolling.deduplicated is True
    assert [e.state for e in rolling.entries] == ["prepared", "prepared"]
    assert h.store.get_job("agenda-migrated-42") is None
    assert h.store.rollback_domain_migration_targets(migration.id).deduplicated is True
    assert (
        h.store.begin_domain_migration_rollback(migration.id).deduplicated is True
    )  # resumes, nothing to do
    first = rolling.entries[0]
    h.tick()
    restored = h.store.restore_domain_migration_entry_source(
        migration_id=migration.id,
        entry_id=first.entry_id,
        restore_source=lambda: source_of(migration_plan, first),
    )
    assert restored.state == "rolled_back"
    assert restored.source_restored_digest == restored.source_digest
    assert h.store.get_domain_migration(migration.id).state == "rolling_back"
    done = restore_all(h, migration_plan, migration.id)
    assert done.state == "rolled_back" and done.completed_at == h.now
    assert h.store.begin_domain_migration_rollback(migration.id).deduplicated is True
    assert h.store.rollback_domain_migration_targets(migration.id).deduplicated is True
    assert (
        h.store.get_active_domain_migration_by_source(
            domain="agenda", source_scope=agenda_entry()["sourceScope"], source_id="legacy-agenda-42"
        )
        is None
    )
    h.tick()
    again = h.store.prepare_domain_migration(migration_plan)  # a rolled-back plan gets a new attempt
    assert again.deduplicated is False and again.id != migration.id
    assert again.manifest["planDigest"] == migration.manifest["planDigest"]
    assert again.manifest["attemptId"] == uuid_for(2)


# --------------------------------------------------------------------------- from applied / verified


@pytest.mark.parametrize("state", ["applied", "verified"])
def test_rollback_of_staged_targets(h: Harness, state: str) -> None:
    create(h, OLD_COWORK)
    create(h, OLD_AGENDA)
    routine = {
        "domain": "routine",
        "sourceId": "routine-1",
        "sourceScope": {"store": "routines", "directory": "/r"},
        "source": {"r": 1},
        "targetJob": target_job("routine-new", "routine"),
    }
    updated_restore = agenda_entry()  # existing different job, restore strategy
    updated_disable = cowork_entry()  # existing different job, disable strategy
    migration_plan = plan(updated_restore, updated_disable, routine)
    migration = advance(h, migration_plan, state)
    actions = {e.target_job_id: e.target_action for e in migration.entries}
    assert actions == {
        "agenda-migrated-42": "updated",
        "cowork-cron-migrated-7": "updated",
        "routine-new": "created",
    }
    h.tick()
    rolled = h.store.begin_domain_migration_rollback(migration.id)
    assert rolled.state == "rolling_back" and rolled.deduplicated is False
    by_target = {e.target_job_id: e for e in rolled.entries}
    assert {e.state for e in rolled.entries} == {"rollback_target_disabled"}
    agenda = h.store.get_job("agenda-migrated-42")
    assert agenda is not None and definition_digest(h, agenda.id) == scheduler_job_definition_digest(
        OLD_AGENDA
    )
    assert agenda.revision == 3 and by_target["agenda-migrated-42"].target_rollback_revision == 3
    cowork = h.store.get_job("cowork-cron-migrated-7")
    assert cowork is not None and cowork.enabled is False and cowork.revision == 2  # staged, already disabled
    assert cowork.payload == cowork_entry()["targetJob"]["payload"]
    assert by_target["cowork-cron-migrated-7"].target_rollback_revision == 2
    new = h.store.get_job("routine-new")
    assert new is not None and new.enabled is False and new.revision == 1
    h.tick()
    assert h.store.rollback_domain_migration_targets(migration.id).deduplicated is True
    done = restore_all(h, migration_plan, migration.id)
    assert done.state == "rolled_back"
    assert {e.state for e in done.entries} == {"rolled_back"}


def test_reused_target_is_left_as_it_was(h: Harness) -> None:
    entry = agenda_entry(targetJob=target_job("agenda-migrated-42", enabled=False))
    create(h, entry["targetJob"])
    migration = advance(h, plan(entry), "applied")
    assert migration.entries[0].target_action == "reused"
    rolled = h.store.begin_domain_migration_rollback(migration.id)
    assert rolled.entries[0].target_rollback_revision == 1
    job = h.store.get_job("agenda-migrated-42")
    assert job is not None and job.revision == 1


# --------------------------------------------------------------------------- from retiring / retired


def test_rollback_from_retiring_requires_the_entry_token(h: Harness) -> None:
    migration_plan = plan(agenda_entry(), cowork_entry())
    retiring = run_to_retiring(h, migration_plan)
    first = retiring.entries[0]
    h.tick()
    h.store.confirm_domain_migration_entry_retired(
        migration_id=retiring.id,
        entry_id=first.entry_id,
        retirement_token=first.retirement_token,
        source=None,
    )
    h.tick()
    rolled = h.store.begin_domain_migration_rollback(retiring.id)
    assert {e.state for e in rolled.entries} == {"rollback_target_disabled"}
    assert all(h.store.get_job(e.target_job_id).enabled is False for e in rolled.entries)
    error = raises(
        STATE_CONFLICT,
        lambda: h.store.confirm_domain_migration_entry_source_restored(
            migration_id=retiring.id, entry_id=first.entry_id, source=agenda_entry()["source"]
        ),
    )
    assert error.message == "Scheduler migration source restoration token does not match"
    done = restore_all(h, migration_plan, retiring.id)
    assert done.state == "rolled_back"
    assert [e.source_retirement_digest is not None for e in done.entries] == [True, False]


def test_rollback_from_retired_deactivates_and_restores(h: Harness) -> None:
    create(h, OLD_AGENDA)
    migration_plan = plan(agenda_entry(), cowork_entry(rollbackStrategy="restore"))
    retired = advance(h, migration_plan, "retired")
    assert retired.state == "retired"
    assert h.store.get_job("cowork-cron-migrated-7").enabled is True
    agenda_before = h.store.get_job("agenda-migrated-42")
    assert agenda_before is not None and agenda_before.revision == 3
    h.tick()
    rolled = h.store.begin_domain_migration_rollback(retired.id)
    assert rolled.state == "rolling_back" and rolled.completed_at is None
    by_target = {e.target_job_id: e for e in rolled.entries}
    cowork = h.store.get_job("cowork-cron-migrated-7")  # created → disabled
    assert cowork is not None and cowork.enabled is False and cowork.revision == 3
    assert by_target["cowork-cron-migrated-7"].target_rollback_revision == 3
    agenda = h.store.get_job("agenda-migrated-42")  # updated + restore → before-image
    assert agenda is not None and agenda.revision == 4
    assert agenda.payload == OLD_AGENDA["payload"] and agenda.enabled is True
    done = restore_all(h, migration_plan, retired.id)
    assert done.state == "rolled_back" and done.completed_at == h.now


def test_disable_strategy_on_an_updated_target_after_retirement(h: Harness) -> None:
    create(h, OLD_COWORK)
    migration_plan = plan(cowork_entry())
    retired = advance(h, migration_plan, "retired")
    rolled = h.store.begin_domain_migration_rollback(retired.id)
    job = h.store.get_job("cowork-cron-migrated-7")
    assert job is not None and job.enabled is False and job.payload == cowork_entry()["targetJob"]["payload"]
    assert rolled.entries[0].target_rollback_revision == job.revision == 4


# --------------------------------------------------------------------------- fail closed


def test_execution_evidence_blocks_rollback(h: Harness) -> None:
    migration_plan = plan(agenda_entry())
    retired = advance(h, migration_plan, "retired")
    h.tick()
    h.store.enqueue_occurrence(job_id="agenda-migrated-42", scheduled_for=h.now, trigger_key="cron:1")
    before = h.snapshot()
    error = raises(EVIDENCE, lambda: h.store.begin_domain_migration_rollback(retired.id))
    assert error.details == {
        "occurrenceCountBefore": 0,
        "occurrenceCountNow": 1,
        "executionEventCountBefore": 0,
        "executionEventCountNow": 1,
    }
    assert error.message == (
        "Scheduler migration target has execution evidence and cannot be rolled back: agenda-migrated-42"
    )
    assert h.snapshot() == before
    assert h.store.get_domain_migration(retired.id).state == "retired"


def test_target_revision_changed_blocks_rollback_atomically(h: Harness) -> None:
    migration = advance(h, plan(agenda_entry(), cowork_entry()), "applied")
    h.store.update_job("cowork-cron-migrated-7", 1, payload={"hand": "edited"})
    before = h.snapshot()
    error = raises(TARGET_CHANGED, lambda: h.store.begin_domain_migration_rollback(migration.id))
    assert error.details == {"expectedRevision": 1, "actualRevision": 2}
    assert (
        error.message == "Scheduler migration target revision changed before rollback: cowork-cron-migrated-7"
    )
    assert h.snapshot() == before
    assert h.store.get_domain_migration(migration.id).state == "applied"


def test_target_definition_changed_without_revision_blocks_rollback(h: Harness) -> None:
    migration = advance(h, plan(agenda_entry()), "verified")
    h.execute("UPDATE jobs SET payload_json = '{\"forged\":true}' WHERE job_id = 'agenda-migrated-42'")
    error = raises(TARGET_CHANGED, lambda: h.store.begin_domain_migration_rollback(migration.id))
    assert (
        error.message == "Scheduler migration target definition changed before rollback: agenda-migrated-42"
    )
    assert error.details is not None
    assert error.details["expectedRevision"] == error.details["actualRevision"] == 1
    assert error.details["actualDefinitionDigest"] == definition_digest(h, "agenda-migrated-42")
    assert error.details["expectedDefinitionDigest"] != error.details["actualDefinitionDigest"]


def test_target_changed_after_rollback_blocks_restore_and_repeat(h: Harness) -> None:
    migration_plan = plan(agenda_entry())
    migration = advance(h, migration_plan, "applied")
    rolled = h.store.begin_domain_migration_rollback(migration.id)
    entry = rolled.entries[0]
    h.store.update_job("agenda-migrated-42", 1, enabled=True)
    restore = lambda: h.store.confirm_domain_migration_entry_source_restored(  # noqa: E731
        migration_id=migration.id, entry_id=entry.entry_id, source=source_of(migration_plan, entry)
    )
    error = raises(TARGET_CHANGED, restore)
    assert error.message == "Scheduler migration target changed after rollback: agenda-migrated-42"
    assert error.details == {"expectedRevision": 1, "actualRevision": 2}
    raises(TARGET_CHANGED, lambda: h.store.rollback_domain_migration_targets(migration.id))
    raises(TARGET_CHANGED, lambda: h.store.begin_domain_migration_rollback(migration.id))
    h.store.update_job("agenda-migrated-42", 2, enabled=False)  # definition back, revision not
    raises(TARGET_CHANGED, restore)


def test_evidence_after_rollback_blocks_restore(h: Harness) -> None:
    migration_plan = plan(agenda_entry(), cowork_entry())
    migration = advance(h, migration_plan, "applied")
    h.store.begin_domain_migration_rollback(migration.id)
    agenda, cowork = sorted(h.store.get_domain_migration(migration.id).entries, key=lambda e: e.domain)
    h.execute(
        "INSERT INTO events (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json) "
        "VALUES ('agenda-migrated-42', NULL, 'note', 1, NULL, NULL, '{}')"
    )
    h.execute(
        "INSERT INTO occurrences (occurrence_id, job_id, job_revision, idempotency_key, trigger_key, "
        "scheduled_for, available_at, status, attempt, max_attempts, fence, authority_json, payload_json, "
        "created_at, updated_at) VALUES ('occ_forged', 'cowork-cron-migrated-7', 1, 'k', 't', 0, 0, "
        "'queued', 0, 3, 0, '{}', 'null', 0, 0)"
    )
    restored = h.store.confirm_domain_migration_entry_source_restored(  # a job-level event is no execution
        migration_id=migration.id, entry_id=agenda.entry_id, source=source_of(migration_plan, agenda)
    )
    assert restored.state == "rolled_back"
    error = raises(
        EVIDENCE,
        lambda: h.store.confirm_domain_migration_entry_source_restored(
            migration_id=migration.id, entry_id=cowork.entry_id, source=source_of(migration_plan, cowork)
        ),
    )
    assert error.details == {
        "occurrenceCountBefore": 0,
        "occurrenceCountNow": 1,
        "executionEventCountBefore": 0,
        "executionEventCountNow": 0,
    }


# --------------------------------------------------------------------------- restore rules


def test_restore_source_rules(h: Harness) -> None:
    migration_plan = plan(agenda_entry(), cowork_entry())
    migration = advance(h, migration_plan, "applied")
    entry = migration.entries[0]
    args = {"migration_id": migration.id, "entry_id": entry.entry_id}
    error = raises(
        STATE_CONFLICT, lambda: h.store.restore_domain_migration_entry_source(**args, restore_source=dict)
    )
    assert error.message == "Scheduler migration is not rolling back"
    h.store.begin_domain_migration_rollback(migration.id)
    before = h.snapshot()
    error = raises(
        "SCHEDULER_MIGRATION_SOURCE_CHANGED",
        lambda: h.store.restore_domain_migration_entry_source(**args, restore_source=lambda: {"other": 1}),
    )
    assert error.details == {"entryId": entry.entry_id, "sourceId": entry.source_id}
    assert error.message == "Restored scheduler source does not match its pre-migration digest"
    raises(
        INVALID,
        lambda: h.store.restore_domain_migration_entry_source(**args, restore_source={"not": "callable"}),
    )
    raises(
        INVALID, lambda: h.store.restore_domain_migration_entry_source(**args, restore_source=lambda: {1, 2})
    )

    def boom() -> Any:
        raise RuntimeError("restore failed")

    with pytest.raises(RuntimeError):
        h.store.restore_domain_migration_entry_source(**args, restore_source=boom)
    raises(
        STATE_CONFLICT,
        lambda: h.store.restore_domain_migration_entry_source(
            migration_id=migration.id, entry_id="missing", restore_source=dict
        ),
    )
    assert h.snapshot() == before
    calls: list[int] = []

    def restore() -> Any:
        calls.append(1)
        return source_of(migration_plan, entry)

    assert h.store.restore_domain_migration_entry_source(**args, restore_source=restore).deduplicated is False
    assert h.store.restore_domain_migration_entry_source(**args, restore_source=restore).deduplicated is True
    assert calls == [1]  # a repeat does not run the callback again


def test_async_restore_source_is_refused_and_closed(h: Harness) -> None:
    migration_plan = plan(agenda_entry())
    migration = advance(h, migration_plan, "prepared")
    h.store.begin_domain_migration_rollback(migration.id)
    entry = migration.entries[0]
    created: list[Any] = []

    async def restore() -> Any:
        return source_of(migration_plan, entry)

    def factory() -> Any:
        coroutine = restore()
        created.append(coroutine)
        return coroutine

    error = raises(
        INVALID,
        lambda: h.store.restore_domain_migration_entry_source(
            migration_id=migration.id, entry_id=entry.entry_id, restore_source=factory
        ),
    )
    assert error.message == "restoreSource must complete synchronously"
    assert created[0].cr_frame is None  # closed: no "never awaited" warning
    loop = asyncio.new_event_loop()
    try:
        future: asyncio.Future[Any] = loop.create_future()
        raises(
            INVALID,
            lambda: h.store.restore_domain_migration_entry_source(
                migration_id=migration.id, entry_id=entry.entry_id, restore_source=lambda: future
            ),
        )
    finally:
        loop.close()
    assert h.store.get_domain_migration(migration.id).entries[0].state == "prepared"


def test_restored_evidence_mismatch_on_repeat(h: Harness) -> None:
    migration_plan = plan(agenda_entry())
    migration = advance(h, migration_plan, "prepared")
    h.store.begin_domain_migration_rollback(migration.id)
    entry = migration.entries[0]
    restore_all(h, migration_plan, migration.id)
    h.execute("UPDATE scheduler_domain_migration_entries SET source_restored_digest = 'sha256:x'")
    error = raises(
        "SCHEDULER_MIGRATION_SOURCE_MISMATCH",
        lambda: h.store.confirm_domain_migration_entry_source_restored(
            migration_id=migration.id, entry_id=entry.entry_id, source=source_of(migration_plan, entry)
        ),
    )
    assert error.message == "Restored scheduler source evidence does not match the journal"


def test_json_null_is_a_source_value(h: Harness) -> None:
    migration_plan = plan(agenda_entry(source=None))
    migration = advance(h, migration_plan, "prepared")
    assert migration.entries[0].source_digest == scheduler_migration_source_digest(None)
    h.store.begin_domain_migration_rollback(migration.id)
    restored = h.store.confirm_domain_migration_entry_source_restored(
        migration_id=migration.id, entry_id=migration.entries[0].entry_id, source=None
    )
    assert restored.state == "rolled_back"


def test_rollback_targets_requires_rolling_back(h: Harness) -> None:
    migration = advance(h, plan(), "applied")
    error = raises(STATE_CONFLICT, lambda: h.store.rollback_domain_migration_targets(migration.id))
    assert error.message == "Scheduler migration is not rolling back"


def test_restore_argument_validation_precedes_the_store(h: Harness) -> None:
    h.store.close()
    raises(
        INVALID,
        lambda: h.store.restore_domain_migration_entry_source(
            migration_id="m", entry_id="e", restore_source=1
        ),
    )
    raises(
        INVALID,
        lambda: h.store.restore_domain_migration_entry_source(
            migration_id="", entry_id="e", restore_source=dict
        ),
    )
    raises(
        INVALID,
        lambda: h.store.restore_domain_migration_entry_source(
            migration_id="m", entry_id="e", retirement_token="", restore_source=dict
        ),
    )
    raises(
        "SCHEDULER_STORE_CLOSED",
        lambda: h.store.restore_domain_migration_entry_source(
            migration_id="m", entry_id="e", restore_source=dict
        ),
    )
    h.store = h.open()
