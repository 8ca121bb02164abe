"""Hostile strings at the store boundary (issue 15 item 7; docs/design/architecture.md "Hostile strings").

Rule: a string the store keeps as a column value or looks rows up by (every identifier argument,
and the identifier fields of authority envelopes, principals, capability lists and migration plans)
must not hold U+0000 or a surrogate code point; such a string is ``SCHEDULER_INVALID_ARGUMENT``
before anything is read or written. Strings inside JSON values stay accepted and come back exactly.
The pure functions keep the recorded behaviour (tests/test_contract_vectors.py). Every test with a
store runs on both backends (``place``).
API §5 (identifier arguments), §6.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from recorded import T0
from store_places import StorePlace, examples

from scheduler import SchedulerKernelError, SchedulerStore, derive_occurrence_identity
from scheduler.contract.constants import MAX_RUNTIME_CHECKPOINT_BYTES
from scheduler.contract.scalars import JS_WHITESPACE
from scheduler.testing import dump_tables

INVALID = "SCHEDULER_INVALID_ARGUMENT"
LONE = os.fsdecode(b"report-\xff.csv")  # "report-\udcff.csv": a non-UTF-8 file name
PAIR = "\ud83d\ude00"  # the two UTF-16 halves of U+1F600 given as two code points
NUL = "nul\x00inside"
UNSTORABLE = [LONE, PAIR, NUL, "\ud800", "\udfff", "\x00"]
ALICE = {"type": "user", "id": "user-alice"}
AUTHORITY = {"principal": ALICE, "workspaceId": "ws-main", "requestedCapabilities": ["calendar.read"]}


def principal_authority(principal_id: str) -> dict[str, Any]:
    return {"principal": {"type": "user", "id": principal_id}, "requestedCapabilities": ["calendar.read"]}


@pytest.fixture
def store(place: StorePlace) -> Iterator[SchedulerStore]:
    with place.open(clock=lambda: T0) as opened:
        opened.create_job(id="job-a", kind="agenda", authority=AUTHORITY)
        yield opened


# --------------------------------------------------------------------------- the reported inputs

REPORTED: dict[str, Callable[[SchedulerStore, str], Any]] = {
    "create_job(id)": lambda s, v: s.create_job(id=v, kind="agenda", authority=AUTHORITY),
    "create_job(kind)": lambda s, v: s.create_job(id="job-b", kind=v, authority=AUTHORITY),
    "create_job(authority.principal.id)": lambda s, v: s.create_job(
        id="job-b", kind="agenda", authority=principal_authority(v)
    ),
    "enqueue_occurrence(trigger_key)": lambda s, v: s.enqueue_occurrence(
        job_id="job-a", scheduled_for=T0, trigger_key=v
    ),
    "get_job": lambda s, v: s.get_job(v),
    "get_occurrence": lambda s, v: s.get_occurrence(v),
    "history(job_id)": lambda s, v: s.history(job_id=v),
    "claim_next(owner_id)": lambda s, v: s.claim_next(owner_id=v, lease_ms=1000),
    "claim_next(job_kind)": lambda s, v: s.claim_next(owner_id="w", lease_ms=1000, job_kind=v),
    "claim_next(workspace_id)": lambda s, v: s.claim_next(owner_id="w", lease_ms=1000, workspace_id=v),
    "ensure_authority_policy": lambda s, v: s.ensure_authority_policy(principal_authority(v)),
    "set_authority_policy": lambda s, v: s.set_authority_policy(
        {"type": "user", "id": v}, capabilities=["run"], window_ms=60_000, max_runs=1, max_units=1
    ),
    "get_authority_policy": lambda s, v: s.get_authority_policy({"type": "user", "id": v}),
    "reserve_authority": lambda s, v: s.reserve_authority(occurrence_id=v, policy_revision=1),
}


@pytest.mark.parametrize("value", UNSTORABLE, ids=ascii)
@pytest.mark.parametrize("call", sorted(REPORTED))
def test_each_reported_input_is_an_invalid_argument_and_writes_nothing(
    store: SchedulerStore, call: str, value: str
) -> None:
    before = dump_tables(store)
    with pytest.raises(SchedulerKernelError) as raised:
        REPORTED[call](store, value)
    assert raised.value.code == INVALID
    assert "store identically" in raised.value.message or "not a valid identifier" in raised.value.message
    assert dump_tables(store) == before


def test_a_batch_reports_the_index_of_the_hostile_item(store: SchedulerStore) -> None:
    before = dump_tables(store)
    with pytest.raises(SchedulerKernelError) as raised:
        store.enqueue_many(
            [
                {"job_id": "job-a", "scheduled_for": T0, "trigger_key": "fine"},
                {"job_id": "job-a", "scheduled_for": T0, "trigger_key": LONE},
            ]
        )
    assert (raised.value.code, raised.value.details["index"]) == (INVALID, 1)
    assert dump_tables(store) == before


def as_javascript_reads_it(value: str) -> str:
    """The string as UTF-16 code units: a surrogate pair given as two code points is one character."""
    return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


@pytest.mark.parametrize("value", [*UNSTORABLE, "\U0001f600", "\u2028", "\ufeff"], ids=ascii)
def test_the_same_strings_inside_json_values_are_kept(store: SchedulerStore, value: str) -> None:
    """Canonical JSON escapes U+0000 and lone surrogates; a pair comes back as the character it encodes."""
    document = {value: [value, {"nested": value}]}
    job = store.create_job(id="json-job", kind="agenda", authority=AUTHORITY, payload=document, trigger=value)
    occurrence = store.enqueue_occurrence(job_id="json-job", scheduled_for=T0, trigger_key="t", payload=value)
    claimed = store.claim_occurrence(occurrence_id=occurrence.id, owner_id="w", lease_ms=1000)
    assert claimed is not None
    settled = store.settle(
        occurrence_id=claimed.id, owner_id="w", fence=claimed.fence, outcome="succeeded", result=document
    )
    read = as_javascript_reads_it(value)
    expected = {read: [read, {"nested": read}]}
    assert store.get_job("json-job") == job
    assert (job.payload, job.trigger) == (expected, read)
    assert store.get_occurrence(occurrence.id) == settled
    assert (settled.payload, settled.result) == (read, expected)


def test_the_pure_identity_function_keeps_the_recorded_behaviour() -> None:
    """The vectors accept a lone surrogate in an identity (the store refuses to keep one)."""
    identity = derive_occurrence_identity(
        job_id="lone\ud800", job_revision=1, scheduled_for=T0, trigger_key="cron:2026-01-01T00:00:00.000Z"
    )
    assert identity.occurrence_id == "occ_bda429ca299d08a16f78478e88ca0a3c473ecf09b9ff6cef7b01b3d87e29abb5"


# --------------------------------------------------------------------------- every method, hostile text

# The seed's error codes an argument can lead to (API.md §2). Storage, schema, data-corruption and
# closed-store codes are left out on purpose: hostile text must never produce one of those.
DOCUMENTED = frozenset(
    [
        "SCHEDULER_INVALID_ARGUMENT",
        "SCHEDULER_SOURCE_PATH_INVALID",
        "SCHEDULER_NOT_FOUND",
        "SCHEDULER_CONFLICT",
        "SCHEDULER_REVISION_CONFLICT",
        "SCHEDULER_JOB_DISABLED",
        "SCHEDULER_LEASE_LOST",
        "SCHEDULER_CLAIM_CONFLICT",
        "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH",
        "SCHEDULER_FENCE_CONFLICT",
        "SCHEDULER_OCCURRENCE_NOT_RUNNING",
        "SCHEDULER_OCCURRENCE_CONTROL_CONFLICT",
        "SCHEDULER_PAUSE_UNSUPPORTED",
        "SCHEDULER_PAUSE_UNSUPPORTED_SAFE_POINT",
        "SCHEDULER_REQUEUE_CONFLICT",
        "SCHEDULER_REQUEUE_EVIDENCE_CONFLICT",
        "SCHEDULER_AUTHORITY_BUDGET_EXHAUSTED",
        "SCHEDULER_AUTHORITY_BUDGET_STATE_INVALID",
        "SCHEDULER_AUTHORITY_OCCURRENCE_NOT_RUNNING",
        "SCHEDULER_AUTHORITY_PERMISSION_DENIED",
        "SCHEDULER_AUTHORITY_POLICY_CONFLICT",
        "SCHEDULER_AUTHORITY_POLICY_REQUIRED",
        "SCHEDULER_AUTHORITY_POLICY_STALE",
        "SCHEDULER_AUTHORITY_RESERVATION_MISMATCH",
        "SCHEDULER_AUTHORITY_SETTLEMENT_CONFLICT",
        "SCHEDULER_ADJUDICATION_ALREADY_RECORDED",
        "SCHEDULER_ADJUDICATION_ATTEMPT_LIMIT",
        "SCHEDULER_ADJUDICATION_EVIDENCE_CONFLICT",
        "SCHEDULER_ADJUDICATION_NOT_ELIGIBLE",
        "SCHEDULER_ADJUDICATION_SETTLEMENT_CONFLICT",
        "SCHEDULER_MIGRATION_CONFLICT",
        "SCHEDULER_MIGRATION_EXECUTION_EVIDENCE",
        "SCHEDULER_MIGRATION_LOCATOR_CONFLICT",
        "SCHEDULER_MIGRATION_NOT_FOUND",
        "SCHEDULER_MIGRATION_SOURCE_CHANGED",
        "SCHEDULER_MIGRATION_SOURCE_MISMATCH",
        "SCHEDULER_MIGRATION_STATE_CONFLICT",
        "SCHEDULER_MIGRATION_TARGET_CHANGED",
    ]
)


@dataclass(frozen=True)
class Slot:
    """Where a hostile string goes in one call.

    ``kind``: ``"key"`` (an identifier the store keeps or looks up; ``max_length`` UTF-16 units),
    ``"json"`` (inside a JSON value: always accepted), ``"closed"`` (a closed set of values, a
    digest or a wrong type: always invalid) or ``"other"`` (validated by other rules: only a
    documented outcome is required).
    """

    call: Callable[[SchedulerStore, dict[str, Any], str], Any]
    kind: str = "key"
    max_length: int = 256


def key(call: Callable[[SchedulerStore, dict[str, Any], str], Any], max_length: int = 256) -> Slot:
    return Slot(call, "key", max_length)


def json_value(call: Callable[[SchedulerStore, dict[str, Any], str], Any]) -> Slot:
    return Slot(call, "json")


def closed(call: Callable[[SchedulerStore, dict[str, Any], str], Any]) -> Slot:
    return Slot(call, "closed")


def other(call: Callable[[SchedulerStore, dict[str, Any], str], Any]) -> Slot:
    return Slot(call, "other")


DIGEST = "sha256:" + "ab" * 32
POLICY = {"window_ms": 60_000, "max_runs": 1, "max_units": 1}


def _plan(
    source_id: str = "legacy-1", target_id: str = "migrated-1", kind: str = "agenda", **job: Any
) -> Any:
    entry = {
        "domain": "agenda",
        "sourceId": source_id,
        "sourceScope": {"store": "agent-schedule"},
        "source": {"id": source_id},
        "targetJob": {"id": target_id, "kind": kind, "authority": AUTHORITY, **job},
    }
    return {"entries": [entry]}


def _running(w: dict[str, Any]) -> dict[str, Any]:
    return {"occurrence_id": w["running"].id, "owner_id": "w1", "fence": w["running"].fence}


_CYCLE: dict[str, Any] = {"outcome": "failed", "lease_ms": 1000}  # settle_and_claim's other arguments
_GROUP: dict[str, Any] = {"owner_id": "w", "lease_ms": 1000, "limit": 2}  # settle_many_and_claim's claims


def _enqueue(**kw: Any) -> dict[str, Any]:
    return {"job_id": "job-a", "scheduled_for": T0, "trigger_key": "t-h", **kw}


# fmt: off
METHOD_SLOTS: dict[str, list[Slot]] = {
    "create_job": [
        key(lambda s, w, v: s.create_job(id=v, kind="agenda", authority=AUTHORITY)),
        key(lambda s, w, v: s.create_job(id="h", kind=v, authority=AUTHORITY), 128),
        key(lambda s, w, v: s.create_job(id="h", kind="k", authority={"principal": {"type": v, "id": "p"}}),
            64),
        key(lambda s, w, v: s.create_job(id="h", kind="k", authority=principal_authority(v))),
        key(lambda s, w, v: s.create_job(id="h", kind="k", authority={**AUTHORITY, "workspaceId": v})),
        key(lambda s, w, v: s.create_job(id="h", kind="k",
                                         authority={**AUTHORITY, "requestedCapabilities": [v]})),
        json_value(lambda s, w, v: s.create_job(id="h", kind="k", authority=AUTHORITY, payload={v: v})),
        json_value(lambda s, w, v: s.create_job(id="h", kind="k", authority=AUTHORITY, trigger={"at": v})),
    ],
    "update_job": [
        key(lambda s, w, v: s.update_job(v, 1, enabled=True)),
        key(lambda s, w, v: s.update_job("job-a", 1, kind=v), 128),
        key(lambda s, w, v: s.update_job("job-a", 1, authority=principal_authority(v))),
        json_value(lambda s, w, v: s.update_job("job-a", 1, payload=[v])),
    ],
    "get_job": [key(lambda s, w, v: s.get_job(v))],
    "enqueue_occurrence": [
        key(lambda s, w, v: s.enqueue_occurrence(**_enqueue(job_id=v))),
        key(lambda s, w, v: s.enqueue_occurrence(**_enqueue(trigger_key=v))),
        json_value(lambda s, w, v: s.enqueue_occurrence(**_enqueue(trigger_key="t-json", payload=v))),
    ],
    "enqueue_occurrence_once_per_trigger": [
        key(lambda s, w, v: s.enqueue_occurrence_once_per_trigger(**_enqueue(job_id=v))),
        key(lambda s, w, v: s.enqueue_occurrence_once_per_trigger(**_enqueue(trigger_key=v))),
    ],
    "enqueue_many": [
        key(lambda s, w, v: s.enqueue_many([_enqueue(trigger_key="t-ok"), _enqueue(trigger_key=v)])),
        key(lambda s, w, v: s.enqueue_many([_enqueue(job_id=v)])),
    ],
    "get_occurrence": [key(lambda s, w, v: s.get_occurrence(v))],
    "list_occurrences_by_trigger": [
        key(lambda s, w, v: s.list_occurrences_by_trigger(job_id=v, trigger_key="t")),
        key(lambda s, w, v: s.list_occurrences_by_trigger(job_id="job-a", trigger_key=v)),
    ],
    "claim_next": [
        key(lambda s, w, v: s.claim_next(owner_id=v, lease_ms=1000, job_kind="none")),
        key(lambda s, w, v: s.claim_next(owner_id="w", lease_ms=1000, job_kind=v), 128),
        # job_kind as a sequence (API §5): "other" until the store accepts sequences, then a key slot
        other(lambda s, w, v: s.claim_next(owner_id="w", lease_ms=1000, job_kind=["none", v])),
        key(lambda s, w, v: s.claim_next(owner_id="w", lease_ms=1000, workspace_id=v)),
    ],
    "claim_batch": [
        key(lambda s, w, v: s.claim_batch(owner_id=v, lease_ms=1000, limit=2, job_kind="none")),
        key(lambda s, w, v: s.claim_batch(owner_id="w", lease_ms=1000, limit=2, job_kind=v), 128),
        key(lambda s, w, v: s.claim_batch(owner_id="w", lease_ms=1000, limit=2, workspace_id=v)),
    ],
    "claim_occurrence": [
        key(lambda s, w, v: s.claim_occurrence(occurrence_id=v, owner_id="w", lease_ms=1000)),
        key(lambda s, w, v: s.claim_occurrence(occurrence_id=w["queued"].id, owner_id=v, lease_ms=1000)),
    ],
    "renew": [
        key(lambda s, w, v: s.renew(**{**_running(w), "occurrence_id": v}, lease_ms=1000)),
        key(lambda s, w, v: s.renew(**{**_running(w), "owner_id": v}, lease_ms=1000)),
    ],
    "release_lease": [
        key(lambda s, w, v: s.release_lease(**{**_running(w), "occurrence_id": v})),
        key(lambda s, w, v: s.release_lease(**{**_running(w), "owner_id": v})),
    ],
    "settle": [
        key(lambda s, w, v: s.settle(**{**_running(w), "occurrence_id": v}, outcome="failed")),
        key(lambda s, w, v: s.settle(**{**_running(w), "owner_id": v}, outcome="failed")),
        key(lambda s, w, v: s.settle(**_running(w), outcome="failed", adjudication_request_id=v), 128),
        closed(lambda s, w, v: s.settle(**_running(w), outcome=v)),
        json_value(lambda s, w, v: s.settle(**{**_running(w), "owner_id": "other"}, outcome="failed",
                                            error={"code": v})),
    ],
    "settle_many": [
        key(lambda s, w, v: s.settle_many([{**_running(w), "owner_id": v, "outcome": "failed"}])),
    ],
    "settle_and_claim": [
        key(lambda s, w, v: s.settle_and_claim(**{**_running(w), "occurrence_id": v}, **_CYCLE)),
        key(lambda s, w, v: s.settle_and_claim(**{**_running(w), "owner_id": v}, **_CYCLE)),
        key(lambda s, w, v: s.settle_and_claim(**_running(w), **_CYCLE, job_kind=v), 128),
        key(lambda s, w, v: s.settle_and_claim(**_running(w), **_CYCLE, job_kind=["none", v]), 128),
        key(lambda s, w, v: s.settle_and_claim(**_running(w), **_CYCLE, workspace_id=v)),
        closed(lambda s, w, v: s.settle_and_claim(**_running(w), outcome=v, lease_ms=1000)),
    ],
    "settle_many_and_claim": [
        key(lambda s, w, v: s.settle_many_and_claim([{**_running(w), "owner_id": v, "outcome": "failed"}],
                                                    **_GROUP)),
        key(lambda s, w, v: s.settle_many_and_claim([], **{**_GROUP, "owner_id": v})),
        key(lambda s, w, v: s.settle_many_and_claim([], **_GROUP, job_kind=v), 128),
        key(lambda s, w, v: s.settle_many_and_claim([], **_GROUP, job_kind=["none", v]), 128),
        key(lambda s, w, v: s.settle_many_and_claim([], **_GROUP, workspace_id=v)),
        closed(lambda s, w, v: s.settle_many_and_claim([{**_running(w), "outcome": v}], **_GROUP)),
    ],
    "history": [
        key(lambda s, w, v: s.history(occurrence_id=v)),
        key(lambda s, w, v: s.history(job_id=v)),
    ],
    "list_dead_letters": [key(lambda s, w, v: s.list_dead_letters(job_id=v))],
    "set_authority_policy": [
        key(lambda s, w, v: s.set_authority_policy({"type": v, "id": "p"}, capabilities=["c"], **POLICY), 64),
        key(lambda s, w, v: s.set_authority_policy({"type": "t", "id": v}, capabilities=["c"], **POLICY)),
        key(lambda s, w, v: s.set_authority_policy({"type": "t", "id": "p"}, capabilities=[v], **POLICY)),
    ],
    "get_authority_policy": [
        key(lambda s, w, v: s.get_authority_policy({"type": v, "id": "p"}), 64),
        key(lambda s, w, v: s.get_authority_policy({"type": "t", "id": v})),
    ],
    "ensure_authority_policy": [
        key(lambda s, w, v: s.ensure_authority_policy(principal_authority(v))),
        key(lambda s, w, v: s.ensure_authority_policy({"principal": {"type": "t", "id": "e"},
                                                        "requestedCapabilities": [v]})),
    ],
    "get_authority_reservation": [key(lambda s, w, v: s.get_authority_reservation(v))],
    "reserve_authority": [key(lambda s, w, v: s.reserve_authority(occurrence_id=v, policy_revision=1))],
    "get_adjudication_case": [key(lambda s, w, v: s.get_adjudication_case(v))],
    "get_occurrence_adjudication": [key(lambda s, w, v: s.get_occurrence_adjudication(v))],
    "list_adjudication_cases": [closed(lambda s, w, v: s.list_adjudication_cases(limit=v))],
    "adjudicate_occurrence": [
        key(lambda s, w, v: s.adjudicate_occurrence(
            occurrence_id=v, decision="confirmed_applied", expected_evidence_digest=DIGEST,
            expected_attempt=1, expected_fence=1, reason_digest=DIGEST, operator_digest=DIGEST)),
        closed(lambda s, w, v: s.adjudicate_occurrence(
            occurrence_id="o", decision=v, expected_evidence_digest=DIGEST, expected_attempt=1,
            expected_fence=1, reason_digest=DIGEST, operator_digest=DIGEST)),
        closed(lambda s, w, v: s.adjudicate_occurrence(
            occurrence_id="o", decision="confirmed_applied", expected_evidence_digest=v, expected_attempt=1,
            expected_fence=1, reason_digest=DIGEST, operator_digest=DIGEST)),
    ],
    "prepare_domain_migration": [
        key(lambda s, w, v: s.prepare_domain_migration(_plan(source_id=v))),
        key(lambda s, w, v: s.prepare_domain_migration(_plan(target_id=v))),
        key(lambda s, w, v: s.prepare_domain_migration(_plan(kind=v)), 128),
        key(lambda s, w, v: s.prepare_domain_migration(_plan(authority=principal_authority(v)))),
        json_value(lambda s, w, v: s.prepare_domain_migration(
            _plan(source_id="json-src", target_id="json-target", payload={v: v}))),
    ],
    "apply_domain_migration": [key(lambda s, w, v: s.apply_domain_migration(v))],
    "verify_domain_migration": [
        key(lambda s, w, v: s.verify_domain_migration(v, sources=[])),
        key(lambda s, w, v: s.verify_domain_migration(
            w["migration"].id, sources=[{"entryId": v, "source": {}}])),
    ],
    "begin_domain_migration_retirement": [key(lambda s, w, v: s.begin_domain_migration_retirement(v))],
    "confirm_domain_migration_entry_retired": [
        key(lambda s, w, v: s.confirm_domain_migration_entry_retired(
            migration_id=v, entry_id="e", retirement_token="r", source={})),
        key(lambda s, w, v: s.confirm_domain_migration_entry_retired(
            migration_id=w["migration"].id, entry_id=v, retirement_token="r", source={})),
        key(lambda s, w, v: s.confirm_domain_migration_entry_retired(
            migration_id=w["migration"].id, entry_id=w["entry"], retirement_token=v, source={})),
        json_value(lambda s, w, v: s.confirm_domain_migration_entry_retired(
            migration_id=w["migration"].id, entry_id=w["entry"], retirement_token="r", source={"v": v})),
    ],
    "begin_domain_migration_rollback": [key(lambda s, w, v: s.begin_domain_migration_rollback(v))],
    "rollback_domain_migration_targets": [key(lambda s, w, v: s.rollback_domain_migration_targets(v))],
    "restore_domain_migration_entry_source": [
        key(lambda s, w, v: s.restore_domain_migration_entry_source(
            migration_id=v, entry_id="e", restore_source=dict)),
        key(lambda s, w, v: s.restore_domain_migration_entry_source(
            migration_id=w["migration"].id, entry_id=v, restore_source=dict)),
        key(lambda s, w, v: s.restore_domain_migration_entry_source(
            migration_id=w["migration"].id, entry_id=w["entry"], retirement_token=v, restore_source=dict)),
    ],
    "confirm_domain_migration_entry_source_restored": [
        key(lambda s, w, v: s.confirm_domain_migration_entry_source_restored(
            migration_id=v, entry_id="e", source={})),
        key(lambda s, w, v: s.confirm_domain_migration_entry_source_restored(
            migration_id=w["migration"].id, entry_id=v, source={})),
        key(lambda s, w, v: s.confirm_domain_migration_entry_source_restored(
            migration_id=w["migration"].id, entry_id=w["entry"], retirement_token=v, source={})),
    ],
    "get_domain_migration": [key(lambda s, w, v: s.get_domain_migration(v))],
    "list_domain_migrations": [closed(lambda s, w, v: s.list_domain_migrations(state=v))],
    "get_active_domain_migration_by_source": [
        key(lambda s, w, v: s.get_active_domain_migration_by_source(
            domain="agenda", source_scope={"store": "agent-schedule"}, source_id=v)),
        closed(lambda s, w, v: s.get_active_domain_migration_by_source(
            domain=v, source_scope={}, source_id="x")),
        json_value(lambda s, w, v: s.get_active_domain_migration_by_source(
            domain="agenda", source_scope={"store": v}, source_id="x")),
    ],
    "bind_domain_migration_source_locator": [
        key(lambda s, w, v: s.bind_domain_migration_source_locator(
            migration_id=v, entry_id="e", source_locator={}, expected_source_digest=DIGEST,
            expected_target_job_id="t")),
        key(lambda s, w, v: s.bind_domain_migration_source_locator(
            migration_id=w["migration"].id, entry_id=v, source_locator={}, expected_source_digest=DIGEST,
            expected_target_job_id="t")),
        key(lambda s, w, v: s.bind_domain_migration_source_locator(
            migration_id=w["migration"].id, entry_id=w["entry"], source_locator={},
            expected_source_digest=DIGEST, expected_target_job_id=v)),
        closed(lambda s, w, v: s.bind_domain_migration_source_locator(
            migration_id=w["migration"].id, entry_id=w["entry"], source_locator={},
            expected_source_digest=v, expected_target_job_id="t")),
        other(lambda s, w, v: s.bind_domain_migration_source_locator(
            migration_id=w["migration"].id, entry_id=w["entry"],
            source_locator={"schemaVersion": 1, "type": "agenda-store", "directory": v},
            expected_source_digest=w["source_digest"], expected_target_job_id="migrated-1")),
    ],
    "get_occurrence_control": [key(lambda s, w, v: s.get_occurrence_control(v))],
    "list_runtime_control_occurrences": [
        closed(lambda s, w, v: s.list_runtime_control_occurrences(statuses=[v])),
        closed(lambda s, w, v: s.list_runtime_control_occurrences(job_kinds=["agenda", v])),
    ],
    "request_occurrence_pause": [
        key(lambda s, w, v: s.request_occurrence_pause(occurrence_id=v, expected_fence=1, request_id="p")),
        key(lambda s, w, v: s.request_occurrence_pause(
            occurrence_id=w["running"].id, expected_fence=99, request_id=v), 128),
        closed(lambda s, w, v: s.request_occurrence_pause(
            occurrence_id=w["running"].id, expected_fence=99, request_id="p",
            capability={"pauseResume": "checkpoint_v1", "safePoints": [v]})),
    ],
    "ack_occurrence_pause": [
        key(lambda s, w, v: s.ack_occurrence_pause(
            occurrence_id=v, owner_id="w1", fence=1, request_id="p", expected_revision=1,
            safe_point="adapter_checkpoint")),
        key(lambda s, w, v: s.ack_occurrence_pause(
            occurrence_id=w["running"].id, owner_id=v, fence=1, request_id="p", expected_revision=1,
            safe_point="adapter_checkpoint")),
        key(lambda s, w, v: s.ack_occurrence_pause(
            occurrence_id=w["running"].id, owner_id="w1", fence=1, request_id=v, expected_revision=1,
            safe_point="adapter_checkpoint"), 128),
        closed(lambda s, w, v: s.ack_occurrence_pause(
            occurrence_id=w["running"].id, owner_id="w1", fence=1, request_id="p", expected_revision=1,
            safe_point=v)),
        json_value(lambda s, w, v: s.ack_occurrence_pause(
            occurrence_id=w["running"].id, owner_id="w1", fence=1, request_id="p", expected_revision=1,
            safe_point="adapter_checkpoint", checkpoint={v: v})),
    ],
    "resume_occurrence": [
        key(lambda s, w, v: s.resume_occurrence(occurrence_id=v, expected_revision=1, request_id="r")),
        key(lambda s, w, v: s.resume_occurrence(
            occurrence_id=w["running"].id, expected_revision=1, request_id=v), 128),
    ],
    "list_periodic_jobs": [key(lambda s, w, v: s.list_periodic_jobs(job_kinds=["agenda", v]), 128)],
    "latest_trigger_ticks": [key(lambda s, w, v: s.latest_trigger_ticks(v))],
    "periodic_state": [key(lambda s, w, v: s.periodic_state(v))],
    "enqueue_periodic_tick": [
        key(lambda s, w, v: s.enqueue_periodic_tick(**_tick(job_id=v))),
        key(lambda s, w, v: s.enqueue_periodic_tick(**_tick(trigger_key=v))),
    ],
    "get_occurrence_runtime": [key(lambda s, w, v: s.get_occurrence_runtime(v))],
    "list_controllable_occurrences": [
        closed(lambda s, w, v: s.list_controllable_occurrences(statuses=[v])),
        key(lambda s, w, v: s.list_controllable_occurrences(job_kinds=["agenda", v]), 128),
    ],
    "prune": [closed(lambda s, w, v: s.prune(older_than_ms=0, dry_run=True, statuses=[v]))],
    "cancel_occurrence": [
        key(lambda s, w, v: s.cancel_occurrence(occurrence_id=v)),
        other(lambda s, w, v: s.cancel_occurrence(occurrence_id="occ-missing", reason=v)),
    ],
    "requeue_dead_letter": [
        key(lambda s, w, v: s.requeue_dead_letter(
            occurrence_id=v, expected_fence=1, expected_error_code="E", request_id="r")),
        key(lambda s, w, v: s.requeue_dead_letter(
            occurrence_id=w["queued"].id, expected_fence=1, expected_error_code=v, request_id="r"), 128),
        key(lambda s, w, v: s.requeue_dead_letter(
            occurrence_id=w["queued"].id, expected_fence=1, expected_error_code="E", request_id=v), 128),
    ],
}
# fmt: on


def _tick(**changes: Any) -> dict[str, Any]:
    return {"job_id": "job-a", "job_revision": 1, "scheduled_for": T0, "trigger_key": "t", **changes}


NO_STRING_ARGUMENTS = frozenset(
    {"close", "notify_workers", "schema_info", "transaction", "on_connection", "stats", "queue_depth"}
)


def test_every_public_method_is_driven_with_hostile_text() -> None:
    public = {
        name
        for name in dir(SchedulerStore)
        if not name.startswith("_") and callable(getattr(SchedulerStore, name))
    }
    assert public - NO_STRING_ARGUMENTS == set(METHOD_SLOTS)


SPECIAL = [
    *UNSTORABLE,
    "a\ud800b",
    "\udc00\ud800",
    "\U0001f600",
    "\U0001f600" * 129,
    "a" * 257,
    "a" * 100_000,
    " ",
    "\u3000\u00a0",
    "\ufeff",
    "\t\n",
    " padded ",
    "\u200b",
    "\u202e\u2066",
    "\uffff",
    "\U0010ffff",
    "\x7f",
    "\x1c",
    "\u0085",
    "'; DROP TABLE jobs; --",
    "%",
    "_",
]
any_character = st.characters(exclude_categories=())
hostile_text = st.one_of(
    st.sampled_from(SPECIAL),
    st.text(any_character, max_size=12),
    st.builds(lambda a, b, c: a + b + c, st.text(max_size=4), st.sampled_from(SPECIAL), st.text(max_size=4)),
)


def may_exceed_a_json_size_limit(text: str) -> bool:
    """Whether a slot's JSON (the text may be in it twice, as a key and a value) could pass the
    smallest documented size limit: a runtime checkpoint's 64 KiB (``"a" * 100_000`` does)."""
    return 2 * len(text.encode("utf-8", "surrogatepass")) >= MAX_RUNTIME_CHECKPOINT_BYTES


def expected_key(value: str, max_length: int) -> str | None:
    """The key the store must accept (``None``: it must refuse the value as an invalid argument)."""
    trimmed = value.strip(JS_WHITESPACE)
    units = len(trimmed.encode("utf-16-le", "surrogatepass")) // 2
    control = any(ord(c) <= 31 or ord(c) == 127 for c in trimmed)
    surrogate = any(0xD800 <= ord(c) <= 0xDFFF for c in trimmed)
    return trimmed if trimmed and units <= max_length and not control and not surrogate else None


@pytest.fixture
def world(place: StorePlace) -> Iterator[tuple[SchedulerStore, dict[str, Any]]]:
    """A store with a job, a policy, a queued and a running occurrence and a prepared migration."""
    store = place.open(clock=lambda: T0)
    store.create_job(id="job-a", kind="agenda", authority=AUTHORITY)
    store.ensure_authority_policy(AUTHORITY)
    queued = store.enqueue_occurrence(job_id="job-a", scheduled_for=T0 + 10**9, trigger_key="queued")
    running = store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="running")
    claimed = store.claim_occurrence(occurrence_id=running.id, owner_id="w1", lease_ms=86_400_000)
    migration = store.prepare_domain_migration(_plan())
    entry = migration.entries[0]
    state = {
        "queued": queued,
        "running": claimed,
        "migration": migration,
        "entry": entry.entry_id,
        "source_digest": entry.source_digest,
    }
    yield store, state
    store.close()


def test_hostile_text_in_any_method_gives_a_documented_outcome_and_a_refusal_writes_nothing(
    world: tuple[SchedulerStore, dict[str, Any]], place: StorePlace
) -> None:
    @settings(max_examples=examples(place, 300), deadline=None, database=None)
    @given(data=st.data(), text=hostile_text)
    def hostile_call(data: st.DataObject, text: str) -> None:
        hostile_text_gives_a_documented_outcome(world, data, text)

    hostile_call()


def hostile_text_gives_a_documented_outcome(
    world: tuple[SchedulerStore, dict[str, Any]], data: st.DataObject, text: str
) -> None:
    store, state = world
    method = data.draw(st.sampled_from(sorted(METHOD_SLOTS)), label="method")
    slot = data.draw(st.sampled_from(METHOD_SLOTS[method]), label="slot")
    before = dump_tables(store)
    try:
        slot.call(store, state, text)
    except SchedulerKernelError as error:
        assert error.code in DOCUMENTED, f"{method}: undocumented {error.code}"
        assert dump_tables(store) == before, f"{method} refused with {error.code} but wrote"
        if slot.kind == "closed" or (slot.kind == "key" and expected_key(text, slot.max_length) is None):
            assert error.code == INVALID, f"{method}: {error.code} for {text!r}"
        if slot.kind == "key" and expected_key(text, slot.max_length) is not None:
            assert error.code != INVALID, f"{method} refused the valid key {text!r}: {error.message}"
        if slot.kind == "json" and not may_exceed_a_json_size_limit(text):
            assert error.code != INVALID, f"{method} refused a string inside a JSON value: {error.message}"
        elif slot.kind == "json" and error.code == INVALID:
            assert error.message.endswith("encoded bytes"), f"{method}: {error.message}"
        return
    assert slot.kind in ("json", "other") or (
        slot.kind == "key" and expected_key(text, slot.max_length) is not None
    ), f"{method} accepted {text!r}"
