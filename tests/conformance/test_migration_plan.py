"""Plan normalization: entry identities, the plan manifest and digest, the recorded vectors.

Tests with a store run on both backends (``place``).

API §5 prepare_domain_migration.
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
    uuid_for,
)
from recorded import VECTORS, document
from recorded import decode as decode_tags
from store_places import StorePlace

from scheduler import SchedulerKernelError
from scheduler.contract.canonical import canonical_json, sha256_payload_digest
from scheduler.store.capabilities.domain_migrations.plan import (
    MAX_PLAN_ENTRIES,
    attempt_manifest,
    normalize_domain_migration_plan,
)

INVALID = "SCHEDULER_INVALID_ARGUMENT"
PLAN_VECTORS: list[dict[str, Any]] = json.loads((VECTORS / "domain_migration_plans.json").read_text())
ENTRY_OUTPUT_KEYS = (
    "entryId",
    "domain",
    "sourceId",
    "sourceScopeDigest",
    "sourceDigest",
    "targetJobId",
    "targetJobDigest",
    "rollbackStrategy",
    "sourceLocator",
    "sourceLocatorDigest",
)


@pytest.fixture
def h(place: StorePlace) -> Iterator[Harness]:
    yield from harness_in(place)


def decode(value: Any) -> Any:
    """Fixture tags (README §2): a key whose value is ``undefined`` is an absent key here."""
    return document(decode_tags(value))


def _case_id(case: dict[str, Any]) -> str:
    return str(case.get("note", "case"))[:60]


@pytest.mark.parametrize("case", PLAN_VECTORS, ids=[_case_id(case) for case in PLAN_VECTORS])
def test_recorded_plan_vector(case: dict[str, Any], place: StorePlace) -> None:
    plan_input = decode(case["input"])
    output = case.get("output")
    attempt_id = output["withAttemptId"]["attemptId"] if output else uuid_for(1)
    with place.open(clock=lambda: T0, uuid_factory=lambda: attempt_id) as store:
        if output is None:
            error = raises(case["error_code"], lambda: store.prepare_domain_migration(plan_input))
            assert error.message == case["error_message"]
            assert error.details == case.get("error_details")
            assert store.list_domain_migrations() == []
            return
        migration = store.prepare_domain_migration(plan_input)
    expected_manifest = {
        **output["planManifest"],
        "schemaVersion": 2,
        "planDigest": output["planDigest"],
        "attemptId": attempt_id,
    }
    assert migration.manifest == expected_manifest
    assert migration.manifest_digest == output["withAttemptId"]["manifestDigest"]
    assert migration.id == output["withAttemptId"]["migrationId"]
    assert sha256_payload_digest(output["planManifest"]) == output["planDigest"]
    got_entries = [{key: entry.to_dict()[key] for key in ENTRY_OUTPUT_KEYS} for entry in migration.entries]
    assert got_entries == output["entries"]
    pure = normalize_domain_migration_plan(plan_input)
    assert pure.plan_digest == output["planDigest"]
    assert pure.manifest == output["planManifest"]


def test_entry_ids_and_plan_digest_do_not_depend_on_input_order() -> None:
    forward = normalize_domain_migration_plan(plan(agenda_entry(1), agenda_entry(2), cowork_entry(3)))
    backward = normalize_domain_migration_plan(plan(cowork_entry(3), agenda_entry(2), agenda_entry(1)))
    assert forward.plan_digest == backward.plan_digest
    assert [e.entry_id for e in forward.entries] == [e.entry_id for e in backward.entries]


def test_entries_are_sorted_by_entry_id_in_code_point_order() -> None:
    normalized = normalize_domain_migration_plan(plan(*(agenda_entry(n) for n in range(20))))
    ids = [entry.entry_id for entry in normalized.entries]
    # the seed sorts with localeCompare; ids are one ASCII prefix + lowercase hex, where both orders agree
    assert ids == sorted(ids)
    assert all(
        entry_id.startswith("scheduler-migration-entry-") and len(entry_id) == 26 + 64 for entry_id in ids
    )


def test_entry_id_is_the_digest_of_the_entry_identity() -> None:
    entry = normalize_domain_migration_plan(plan(agenda_entry())).entries[0]
    digest = sha256_payload_digest(entry.identity())
    assert entry.entry_id == "scheduler-migration-entry-" + digest.removeprefix("sha256:")


def test_identity_changes_with_every_identity_field() -> None:
    base = normalize_domain_migration_plan(plan(agenda_entry())).entries[0].entry_id
    variants = [
        agenda_entry(source={"changed": True}),
        agenda_entry(sourceScope={"store": "agent-schedule", "directory": "/elsewhere"}),
        agenda_entry(rollbackStrategy="disable"),
        agenda_entry(targetJob={**agenda_entry()["targetJob"], "maxAttempts": 5}),
    ]
    ids = {normalize_domain_migration_plan(plan(variant)).entries[0].entry_id for variant in variants}
    assert base not in ids and len(ids) == len(variants)


def test_rollback_strategy_defaults_to_restore_when_absent_or_none() -> None:
    absent = agenda_entry()
    del absent["rollbackStrategy"]
    for entry in (absent, agenda_entry(rollbackStrategy=None)):
        assert normalize_domain_migration_plan(plan(entry)).entries[0].rollback_strategy == "restore"


def test_target_job_is_normalized_like_create_job_input() -> None:
    job = agenda_entry()["targetJob"]
    del job["maxAttempts"]
    job["trigger"] = None
    normalized = normalize_domain_migration_plan(plan(agenda_entry(targetJob=job))).entries[0].target_job
    assert normalized["maxAttempts"] == 3
    assert normalized["trigger"] == {}
    assert normalized["enabled"] is True
    assert normalized["authority"]["schemaVersion"] == 1
    assert set(normalized) == {"id", "kind", "trigger", "payload", "authority", "enabled", "maxAttempts"}


def test_plan_limits() -> None:
    many = [agenda_entry(n) for n in range(MAX_PLAN_ENTRIES + 1)]
    error = raises(INVALID, lambda: normalize_domain_migration_plan({"entries": many}))
    assert error.message == "scheduler migration plan must contain between 1 and 1000 entries"
    assert (
        len(normalize_domain_migration_plan({"entries": many[:MAX_PLAN_ENTRIES]}).entries) == MAX_PLAN_ENTRIES
    )


@pytest.mark.parametrize(
    ("bad_plan", "message"),
    [
        (None, "scheduler migration plan must be an object"),
        ("entries", "scheduler migration plan must be an object"),
        ({}, "scheduler migration plan must contain between 1 and 1000 entries"),
        ({"entries": (agenda_entry(),)}, "scheduler migration plan must contain between 1 and 1000 entries"),
        ({"entries": [None]}, "entries[0] must be an object"),
        ({"entries": [[agenda_entry()]]}, "entries[0] must be an object"),
        (
            {"entries": [agenda_entry(domain=["agenda"])]},
            "entries[0].domain must be a supported scheduler migration domain",
        ),
        ({"entries": [agenda_entry(sourceId="  ")]}, "entries[0].sourceId is not a valid identifier"),
        (
            {"entries": [agenda_entry(rollbackStrategy="delete")]},
            "entries[0].rollbackStrategy must be restore or disable",
        ),
        ({"entries": [agenda_entry(targetJob=None)]}, "job must be an object"),
        ({"entries": [agenda_entry(source={1, 2})]}, "schedulerMigration.source contains a non-JSON value"),
    ],
)
def test_invalid_plans_are_refused(bad_plan: Any, message: str) -> None:
    error = raises(INVALID, lambda: normalize_domain_migration_plan(bad_plan))
    assert error.message == message


def test_unknown_fields_are_listed_sorted_including_non_string_keys() -> None:
    entry: dict[Any, Any] = agenda_entry()
    entry["zeta"] = 1
    entry["alpha"] = 2
    entry[7] = 3
    error = raises(INVALID, lambda: normalize_domain_migration_plan(plan(entry)))
    assert error.message == "entries[0] contains unknown fields"
    assert error.details == {"fields": ["7", "alpha", "zeta"]}


def test_duplicates_are_refused() -> None:
    twin = agenda_entry(targetJob={**agenda_entry()["targetJob"], "id": "other-target"})
    error = raises(INVALID, lambda: normalize_domain_migration_plan(plan(agenda_entry(), twin)))
    assert error.message == "scheduler migration plan contains duplicate sources"
    same_target = agenda_entry(43, targetJob=agenda_entry(42)["targetJob"])
    error = raises(INVALID, lambda: normalize_domain_migration_plan(plan(agenda_entry(42), same_target)))
    assert error.message == "scheduler migration plan contains duplicate target jobs"
    error = raises(INVALID, lambda: normalize_domain_migration_plan(plan(agenda_entry(), agenda_entry())))
    assert error.message == "scheduler migration plan contains duplicate sources"


def test_attempt_manifest_wraps_the_plan_manifest() -> None:
    normalized = normalize_domain_migration_plan(plan(agenda_entry(), cowork_entry()))
    manifest, digest, migration_id = attempt_manifest(normalized, "attempt-1")
    assert manifest == {
        **normalized.manifest,
        "schemaVersion": 2,
        "planDigest": normalized.plan_digest,
        "attemptId": "attempt-1",
    }
    assert digest == sha256_payload_digest(manifest)
    assert migration_id == "scheduler-domain-migration-" + digest.removeprefix("sha256:")


def test_prepare_stores_the_attempt_and_a_repeat_draws_no_new_uuid(h: Harness) -> None:
    migration_plan = plan(agenda_entry(), cowork_entry())
    first = h.store.prepare_domain_migration(migration_plan)
    assert first.deduplicated is False
    assert first.state == "prepared" and first.entry_count == 2
    assert first.manifest["attemptId"] == uuid_for(1)
    assert first.created_at == first.updated_at == T0
    h.tick()
    again = h.store.prepare_domain_migration(copy.deepcopy(migration_plan))
    assert again.deduplicated is True
    assert again.id == first.id and again.updated_at == T0
    assert h.issued == [uuid_for(1)]
    stored = h.rows("SELECT manifest_json, manifest_digest FROM scheduler_domain_migrations")
    assert stored == [(canonical_json(first.manifest), first.manifest_digest)]


def test_bad_plan_writes_nothing_and_precedes_the_closed_check(h: Harness) -> None:
    before = h.snapshot()
    raises(INVALID, lambda: h.store.prepare_domain_migration(plan(agenda_entry(domain="calendar"))))
    assert h.snapshot() == before
    assert h.issued == []
    h.store.close()
    raises(INVALID, lambda: h.store.prepare_domain_migration({"entries": []}))
    raises("SCHEDULER_STORE_CLOSED", lambda: h.store.prepare_domain_migration(plan()))


def test_to_dict_has_the_seed_shape(h: Harness) -> None:
    migration = h.store.prepare_domain_migration(plan(agenda_entry()))
    as_dict = migration.to_dict()
    assert list(as_dict) == [
        "id",
        "manifestDigest",
        "manifest",
        "state",
        "entryCount",
        "createdAt",
        "updatedAt",
        "completedAt",
        "lastError",
        "entries",
        "deduplicated",
    ]
    entry = as_dict["entries"][0]
    assert entry["sourceLocator"] is None and entry["sourceLocatorDigest"] is None
    assert entry["targetAction"] is None and entry["state"] == "prepared"
    assert "deduplicated" not in entry


def test_invalid_json_in_a_plan_never_escapes_as_a_python_error() -> None:
    with pytest.raises(SchedulerKernelError) as caught:
        normalize_domain_migration_plan(plan(agenda_entry(sourceScope={"n": float("nan")})))
    assert caught.value.code == INVALID
