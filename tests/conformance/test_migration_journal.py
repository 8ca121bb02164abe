"""The journal lifecycle: prepare → apply → verify → retire → confirm, reads.

Every test runs on both backends (``place``); the recorded reference ``.sqlite`` files read and
continued: ``tests/backends/sqlite/test_migration_reference_dbs.py``.

API §5 Domain migration journal (v4, v5).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from migration_fixtures import (
    T0,
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


@pytest.fixture
def h(place: StorePlace) -> Iterator[Harness]:
    yield from harness_in(place)


def routine_entry(**overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "domain": "routine",
        "sourceId": "routine-morning",
        "sourceScope": {"store": "routines", "directory": "/home/alice/.chainlesschain/routines"},
        "source": {"name": "morning", "steps": ["news", "weather"]},
        "targetJob": target_job("routine-morning", "routine", enabled=False),
        "rollbackStrategy": "restore",
    }
    entry.update(overrides)
    return entry


def events_of(h: Harness, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    rows = h.rows("SELECT event_type, data_json FROM events WHERE job_id = ? ORDER BY event_id", job_id)
    return [(kind, json.loads(data)) for kind, data in rows]


def three_target_plan() -> dict[str, Any]:
    """agenda → new job (created), cowork → existing different job (updated), routine → identical (reused)."""
    return plan(agenda_entry(), cowork_entry(), routine_entry())


def seed_existing_targets(h: Harness) -> None:
    h.store.create_job(
        **_create_args(target_job("cowork-cron-migrated-7", "cowork-cron", payload={"old": True}))
    )
    h.store.create_job(**_create_args(target_job("routine-morning", "routine", enabled=False)))


def _create_args(job: dict[str, Any]) -> dict[str, Any]:
    names = {"maxAttempts": "max_attempts"}
    return {names.get(key, key): value for key, value in job.items()}


# --------------------------------------------------------------------------- full happy path


def test_full_happy_path_created_updated_and_reused_targets(h: Harness) -> None:
    seed_existing_targets(h)
    migration_plan = three_target_plan()
    before_cowork = h.store.get_job("cowork-cron-migrated-7")
    assert before_cowork is not None

    h.tick()
    prepared = h.store.prepare_domain_migration(migration_plan)
    assert prepared.state == "prepared" and prepared.deduplicated is False
    assert [e.state for e in prepared.entries] == ["prepared"] * 3

    h.tick()
    applied = h.store.apply_domain_migration(prepared.id)
    assert applied.state == "applied" and applied.deduplicated is False
    by_target = {e.target_job_id: e for e in applied.entries}
    created, updated, reused = (
        by_target[k] for k in ("agenda-migrated-42", "cowork-cron-migrated-7", "routine-morning")
    )
    assert (created.target_action, updated.target_action, reused.target_action) == (
        "created",
        "updated",
        "reused",
    )
    assert created.target_before is None
    assert updated.target_before == before_cowork.definition()
    assert reused.target_before["enabled"] is False
    assert (
        created.target_applied_revision,
        updated.target_applied_revision,
        reused.target_applied_revision,
    ) == (1, 2, 1)
    assert {e.target_applied_at for e in applied.entries} == {h.now}
    assert {e.target_occurrence_count_before for e in applied.entries} == {0}
    assert {e.target_execution_event_count_before for e in applied.entries} == {0}
    for job_id in by_target:
        job = h.store.get_job(job_id)
        assert job is not None and job.enabled is False
    assert events_of(h, "agenda-migrated-42") == [("job_created", {"revision": 1})]
    assert events_of(h, "cowork-cron-migrated-7")[-1] == (
        "job_updated",
        {
            "changedFields": ["authority", "enabled", "kind", "maxAttempts", "payload", "trigger"],
            "fromRevision": 1,
            "toRevision": 2,
        },
    )
    assert len(events_of(h, "routine-morning")) == 1  # reused: no new event

    h.tick()
    again = h.store.apply_domain_migration(prepared.id)
    assert again.deduplicated is True and again.updated_at == applied.updated_at

    h.tick()
    verified = h.store.verify_domain_migration(prepared.id, sources=sources_of(migration_plan, prepared))
    assert verified.state == "verified" and {e.state for e in verified.entries} == {"verified"}
    h.tick()
    assert h.store.verify_domain_migration(prepared.id, sources=[]).deduplicated is True

    h.tick()
    retiring = h.store.begin_domain_migration_retirement(prepared.id)
    assert retiring.state == "retiring"
    tokens = [e.retirement_token for e in retiring.entries]
    assert tokens == [f"scheduler-retirement-{uuid_for(k)}" for k in (2, 3, 4)]  # entry-id order
    h.tick()
    assert h.store.begin_domain_migration_retirement(prepared.id).deduplicated is True
    assert len(h.issued) == 4

    first = retiring.entries[0]
    h.tick()
    confirmed = h.store.confirm_domain_migration_entry_retired(
        migration_id=prepared.id,
        entry_id=first.entry_id,
        retirement_token=first.retirement_token,
        source={"retired": first.source_id},
    )
    assert confirmed.state == "retired" and confirmed.deduplicated is False
    assert confirmed.source_retirement_digest == scheduler_migration_source_digest(
        {"retired": first.source_id}
    )
    assert h.store.get_domain_migration(prepared.id).state == "retiring"
    assert h.store.get_job(first.target_job_id).enabled is False

    retired = retire_all(h, migration_plan, h.store.get_domain_migration(prepared.id))
    assert retired.state == "retired" and retired.completed_at == h.now
    jobs = {job_id: h.store.get_job(job_id) for job_id in by_target}
    intended = {e["targetJob"]["id"]: e["targetJob"] for e in migration_plan["entries"]}
    for job_id, job in jobs.items():
        assert job is not None
        assert scheduler_job_definition_digest(job.definition()) == scheduler_job_definition_digest(
            intended[job_id]
        )
    assert jobs["agenda-migrated-42"].enabled is True and jobs["agenda-migrated-42"].revision == 2
    assert (
        jobs["routine-morning"].enabled is False and jobs["routine-morning"].revision == 1
    )  # intended disabled
    assert {e.target_job_id: e.target_applied_revision for e in retired.entries} == {
        "agenda-migrated-42": 2,
        "cowork-cron-migrated-7": 3,
        "routine-morning": 1,
    }


def test_confirm_retired_rules(h: Harness) -> None:
    migration_plan = plan(agenda_entry(), cowork_entry())
    retiring = run_to_retiring(h, migration_plan)
    entry = retiring.entries[0]
    args = {"migration_id": retiring.id, "entry_id": entry.entry_id}
    error = raises(
        STATE_CONFLICT,
        lambda: h.store.confirm_domain_migration_entry_retired(**args, retirement_token="wrong", source={}),
    )
    assert error.message == "Scheduler migration entry is not waiting for this retirement token"
    raises(
        "SCHEDULER_MIGRATION_NOT_FOUND",
        lambda: h.store.confirm_domain_migration_entry_retired(
            migration_id=retiring.id, entry_id="nope", retirement_token=entry.retirement_token, source={}
        ),
    )
    h.tick()
    done = h.store.confirm_domain_migration_entry_retired(
        **args, retirement_token=entry.retirement_token, source={"gone": True}
    )
    h.tick()
    repeat = h.store.confirm_domain_migration_entry_retired(
        **args, retirement_token=entry.retirement_token, source={"gone": True}
    )
    assert repeat.deduplicated is True and repeat.updated_at == done.updated_at
    error = raises(
        "SCHEDULER_MIGRATION_SOURCE_MISMATCH",
        lambda: h.store.confirm_domain_migration_entry_retired(
            **args, retirement_token=entry.retirement_token, source={"gone": False}
        ),
    )
    assert error.message == "Retired scheduler source evidence does not match the journal"
    raises(
        "SCHEDULER_MIGRATION_SOURCE_MISMATCH",
        lambda: h.store.confirm_domain_migration_entry_retired(
            **args, retirement_token=retiring.entries[1].retirement_token, source={"gone": True}
        ),
    )


def test_last_confirmation_fails_closed_when_a_target_changed(h: Harness) -> None:
    migration_plan = plan(agenda_entry(), cowork_entry())
    retiring = run_to_retiring(h, migration_plan)
    first, last = retiring.entries
    h.tick()
    h.store.confirm_domain_migration_entry_retired(
        migration_id=retiring.id, entry_id=first.entry_id, retirement_token=first.retirement_token, source=1
    )
    h.store.update_job(first.target_job_id, 1, payload={"tampered": True})
    before = h.snapshot()
    h.tick()
    error = raises(
        TARGET_CHANGED,
        lambda: h.store.confirm_domain_migration_entry_retired(
            migration_id=retiring.id, entry_id=last.entry_id, retirement_token=last.retirement_token, source=2
        ),
    )
    assert error.details == {"entryId": first.entry_id, "targetJobId": first.target_job_id}
    assert error.message == f"Scheduler migration target changed before activation: {first.target_job_id}"
    assert h.snapshot() == before  # the confirmation itself rolled back too
    current = h.store.get_domain_migration(retiring.id)
    assert current.state == "retiring" and current.entries[1].state == "retiring"
    assert h.store.get_job(last.target_job_id).enabled is False


# --------------------------------------------------------------------------- verify


def test_verify_requires_every_source_once_and_unchanged(h: Harness) -> None:
    migration_plan = plan(agenda_entry(), cowork_entry())
    migration = h.store.prepare_domain_migration(migration_plan)
    h.store.apply_domain_migration(migration.id)
    sources = sources_of(migration_plan, migration)
    error = raises(
        "SCHEDULER_MIGRATION_SOURCE_MISMATCH",
        lambda: h.store.verify_domain_migration(migration.id, sources=sources[:1]),
    )
    assert error.message == "Verification must provide every scheduler migration source exactly once"
    changed = copy.deepcopy(sources)
    changed[1]["source"]["edited"] = True
    error = raises(
        "SCHEDULER_MIGRATION_SOURCE_CHANGED",
        lambda: h.store.verify_domain_migration(migration.id, sources=changed),
    )
    entry = migration.entries[1]
    assert error.details == {"entryId": entry.entry_id, "sourceId": entry.source_id}
    stranger = [sources[0], {"entryId": "scheduler-migration-entry-unknown", "source": sources[1]["source"]}]
    raises(
        "SCHEDULER_MIGRATION_SOURCE_CHANGED",
        lambda: h.store.verify_domain_migration(migration.id, sources=stranger),
    )
    assert h.store.get_domain_migration(migration.id).state == "applied"


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        ("all", "sources must be an array"),
        (None, "sources must be an array"),
        ([None], "sources[0] must be an object"),
        (
            [{"entryId": "a", "source": 1}, {"entryId": " a ", "source": 2}],
            "sources contains duplicate migration entries",
        ),
        ([{"entryId": "a"}], "schedulerMigration.source contains a non-JSON value"),
        ([{"source": 1}], "sources[0].entryId must be a string"),
    ],
)
def test_verify_argument_validation(h: Harness, sources: Any, message: str) -> None:
    migration = h.store.prepare_domain_migration(plan())
    error = raises(INVALID, lambda: h.store.verify_domain_migration(migration.id, sources=sources))
    assert error.message == message


def test_verify_fails_closed_when_a_target_changed(h: Harness) -> None:
    migration_plan = plan(agenda_entry())
    migration = h.store.prepare_domain_migration(migration_plan)
    h.store.apply_domain_migration(migration.id)
    h.store.update_job("agenda-migrated-42", 1, enabled=True)
    error = raises(
        TARGET_CHANGED,
        lambda: h.store.verify_domain_migration(migration.id, sources=sources_of(migration_plan, migration)),
    )
    assert error.details == {"entryId": migration.entries[0].entry_id, "targetJobId": "agenda-migrated-42"}


# --------------------------------------------------------------------------- state conflicts


def test_state_conflicts(h: Harness) -> None:
    migration = h.store.prepare_domain_migration(plan())
    error = raises(STATE_CONFLICT, lambda: h.store.verify_domain_migration(migration.id, sources=[]))
    assert error.message == "Scheduler migration cannot be verified from state prepared"
    error = raises(STATE_CONFLICT, lambda: h.store.begin_domain_migration_retirement(migration.id))
    assert error.message == "Scheduler migration cannot retire sources from state prepared"
    entry = migration.entries[0]
    raises(
        STATE_CONFLICT,
        lambda: h.store.confirm_domain_migration_entry_retired(
            migration_id=migration.id, entry_id=entry.entry_id, retirement_token="t", source=None
        ),
    )
    h.store.begin_domain_migration_rollback(migration.id)
    error = raises(STATE_CONFLICT, lambda: h.store.apply_domain_migration(migration.id))
    assert error.message == "Scheduler migration cannot be applied from state rolling_back"


def test_unknown_migration_and_invalid_ids(h: Harness) -> None:
    error = raises("SCHEDULER_MIGRATION_NOT_FOUND", lambda: h.store.get_domain_migration("nope"))
    assert error.message == "Scheduler domain migration does not exist: nope"
    for call in (
        h.store.apply_domain_migration,
        h.store.begin_domain_migration_retirement,
        h.store.begin_domain_migration_rollback,
        h.store.rollback_domain_migration_targets,
    ):
        raises("SCHEDULER_MIGRATION_NOT_FOUND", lambda call=call: call("nope"))  # type: ignore[misc]
        raises(INVALID, lambda call=call: call(""))  # type: ignore[misc]
        raises(INVALID, lambda call=call: call(None))  # type: ignore[misc]
    raises(INVALID, lambda: h.store.get_domain_migration(7))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- prepare conflicts


def test_prepare_conflict_reports_active_and_requested_entries(h: Harness) -> None:
    active = h.store.prepare_domain_migration(plan(agenda_entry()))
    changed = agenda_entry(source={"id": "legacy-agenda-42", "title": "edited"})
    before = h.snapshot()
    error = raises("SCHEDULER_MIGRATION_CONFLICT", lambda: h.store.prepare_domain_migration(plan(changed)))
    assert error.message == "A scheduler source or target already has a different active migration"
    entry = active.entries[0]
    row = {
        "domain": "agenda",
        "sourceId": "legacy-agenda-42",
        "sourceScopeDigest": entry.source_scope_digest,
        "sourceDigest": entry.source_digest,
        "targetJobId": "agenda-migrated-42",
        "targetJobDigest": entry.target_job_digest,
        "rollbackStrategy": "restore",
    }
    assert error.details["active"] == [row]
    assert error.details["requested"][0]["sourceDigest"] != entry.source_digest
    assert {k: v for k, v in error.details["requested"][0].items() if k != "sourceDigest"} == {
        k: v for k, v in row.items() if k != "sourceDigest"
    }
    assert h.snapshot() == before
    superset = plan(agenda_entry(), cowork_entry())
    raises("SCHEDULER_MIGRATION_CONFLICT", lambda: h.store.prepare_domain_migration(superset))
    same_target = agenda_entry(99, targetJob=agenda_entry()["targetJob"])
    raises("SCHEDULER_MIGRATION_CONFLICT", lambda: h.store.prepare_domain_migration(plan(same_target)))


def test_prepare_spanning_two_active_migrations_is_refused(h: Harness) -> None:
    h.store.prepare_domain_migration(plan(agenda_entry()))
    h.store.prepare_domain_migration(plan(cowork_entry()))
    error = raises(
        "SCHEDULER_MIGRATION_CONFLICT",
        lambda: h.store.prepare_domain_migration(plan(agenda_entry(), cowork_entry())),
    )
    assert error.message == "Scheduler migration sources or targets belong to different active migrations"
    assert error.details is None


def test_reusing_an_attempt_uuid_is_a_conflict_not_a_crash(place: StorePlace) -> None:
    with place.open(clock=lambda: T0, uuid_factory=lambda: "fixed") as store:
        first = store.prepare_domain_migration(plan())
        store.begin_domain_migration_rollback(first.id)
        store.confirm_domain_migration_entry_source_restored(
            migration_id=first.id, entry_id=first.entries[0].entry_id, source=agenda_entry()["source"]
        )
        error = raises("SCHEDULER_MIGRATION_CONFLICT", lambda: store.prepare_domain_migration(plan()))
        assert error.details == {"migrationId": first.id}


# --------------------------------------------------------------------------- reads


def test_list_get_and_active_by_source(h: Harness) -> None:
    first = h.store.prepare_domain_migration(plan(agenda_entry()))
    h.tick()
    second = h.store.prepare_domain_migration(plan(cowork_entry()))
    listed = h.store.list_domain_migrations()
    assert [m.id for m in listed] == [second.id, first.id]
    assert all(
        m.entries is None and "entries" not in m.to_dict() and "deduplicated" not in m.to_dict()
        for m in listed
    )
    assert [m.id for m in h.store.list_domain_migrations(limit=1)] == [second.id]
    assert [m.id for m in h.store.list_domain_migrations(limit=0)] == [second.id]  # clamped to 1
    assert len(h.store.list_domain_migrations(limit=10_000)) == 2
    assert h.store.list_domain_migrations(state="verified") == []
    assert len(h.store.list_domain_migrations(state="prepared", limit=5)) == 2
    found = h.store.get_active_domain_migration_by_source(
        domain="agenda", source_scope=agenda_entry()["sourceScope"], source_id=" legacy-agenda-42 "
    )
    assert found is not None and found.id == first.id and found.entries is not None
    assert found == h.store.get_domain_migration(first.id)
    assert (
        h.store.get_active_domain_migration_by_source(domain="routine", source_scope={}, source_id="x")
        is None
    )


@pytest.mark.parametrize("limit", [True, 1.0, "5", None, 2**53])
def test_list_limit_must_be_an_int(h: Harness, limit: Any) -> None:
    raises(INVALID, lambda: h.store.list_domain_migrations(limit=limit))


@pytest.mark.parametrize("state", ["", "done", 3, "x" * 40])
def test_list_state_must_be_a_migration_state(h: Harness, state: Any) -> None:
    raises(INVALID, lambda: h.store.list_domain_migrations(state=state))


def test_active_by_source_validation(h: Harness) -> None:
    error = raises(
        INVALID,
        lambda: h.store.get_active_domain_migration_by_source(
            domain="calendar", source_scope={}, source_id="x"
        ),
    )
    assert error.message == "domain must be a supported scheduler migration domain"
    raises(
        INVALID,
        lambda: h.store.get_active_domain_migration_by_source(
            domain="agenda", source_scope=None, source_id=""
        ),
    )
    raises(
        INVALID,
        lambda: h.store.get_active_domain_migration_by_source(
            domain="agenda", source_scope={1}, source_id="x"
        ),
    )


def test_reads_after_close_check_the_store_first(h: Harness) -> None:
    """Seed: getDomainMigration/listDomainMigrations call _assertOpen() before reading arguments."""
    migration = h.store.prepare_domain_migration(plan())
    h.store.close()
    raises("SCHEDULER_STORE_CLOSED", lambda: h.store.get_domain_migration(migration.id))
    raises("SCHEDULER_STORE_CLOSED", lambda: h.store.list_domain_migrations())
    raises("SCHEDULER_STORE_CLOSED", lambda: h.store.get_domain_migration(""))
    raises("SCHEDULER_STORE_CLOSED", lambda: h.store.list_domain_migrations(limit="x"))
    h.store = h.open()


def test_transaction_view_commits_migration_steps_together(h: Harness) -> None:
    with h.store.transaction() as tx:
        migration = tx.prepare_domain_migration(plan())
        tx.apply_domain_migration(migration.id)
    assert h.store.get_domain_migration(migration.id).state == "applied"
    with pytest.raises(RuntimeError), h.store.transaction() as tx:
        tx.begin_domain_migration_rollback(migration.id)
        raise RuntimeError("abort")
    assert h.store.get_domain_migration(migration.id).state == "applied"
