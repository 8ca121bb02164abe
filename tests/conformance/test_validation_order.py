"""Validation happens where the original validates (issue 15 item 8; seeds 001 → 002 → 000).

* ``ensureAuthorityPolicy`` validates only the envelope before its read; the creation options are
  used, and validated, only when it creates a policy.
* Every read method checks that the store is open before it looks at its arguments; every write
  method validates its arguments first (README §7 of the fixtures).
* ``enqueueOccurrence`` validates the payload inside the transaction, after the job lookup, and
  ``enqueueOccurrenceOncePerTrigger`` returning an earlier occurrence never looks at it.

Every test runs on both backends (``place``).
API §5 (validation order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from recorded import T0
from store_places import StorePlace

from scheduler import SchedulerKernelError, SchedulerStore
from scheduler.testing import dump_tables

INVALID = "SCHEDULER_INVALID_ARGUMENT"
CLOSED = "SCHEDULER_STORE_CLOSED"
PRINCIPAL = {"type": "service", "id": "reports"}
AUTHORITY = {"principal": PRINCIPAL, "requestedCapabilities": ["report.run"]}
NAN = float("nan")


@pytest.fixture
def store(place: StorePlace) -> Iterator[SchedulerStore]:
    with place.open(clock=lambda: T0) as opened:
        opened.create_job(id="job-a", kind="agenda", authority=AUTHORITY, payload={"p": 1})
        yield opened


def raises(code: str, call: Callable[[], Any]) -> SchedulerKernelError:
    with pytest.raises(SchedulerKernelError) as raised:
        call()
    assert raised.value.code == code, raised.value.message
    return raised.value


# --------------------------------------------------------------------------- ensureAuthorityPolicy


@pytest.mark.parametrize(
    ("authority", "options"),
    [
        ({"principal": PRINCIPAL}, {"window_ms": 1}),  # the reported input
        (AUTHORITY, {"window_ms": 1}),
        (AUTHORITY, {"max_runs": None}),
        (AUTHORITY, {"max_units": 2.0}),
        (AUTHORITY, {"max_runs": 0, "max_units": 10**9}),
        ({"principal": PRINCIPAL}, {}),  # no capabilities: could not create, can find
        ({"principal": PRINCIPAL, "requestedCapabilities": ["*"]}, {"window_ms": "day"}),
    ],
)
def test_ensure_returns_an_existing_policy_without_validating_the_creation_options(
    store: SchedulerStore, authority: dict[str, Any], options: dict[str, Any]
) -> None:
    existing = store.set_authority_policy(
        PRINCIPAL, capabilities=["other"], window_ms=60_000, max_runs=5, max_units=5
    )
    before = dump_tables(store)
    assert store.ensure_authority_policy(authority, **options) == existing
    assert dump_tables(store) == before


def test_ensure_still_validates_the_envelope_before_it_reads(store: SchedulerStore) -> None:
    store.ensure_authority_policy(AUTHORITY)
    raises(INVALID, lambda: store.ensure_authority_policy({"principal": PRINCIPAL, "extra": 1}))
    store.close()
    raises(INVALID, lambda: store.ensure_authority_policy(None))
    raises(CLOSED, lambda: store.ensure_authority_policy(AUTHORITY, window_ms=1))


def test_creating_validates_like_set_authority_policy_capabilities_first(store: SchedulerStore) -> None:
    before = dump_tables(store)
    error = raises(INVALID, lambda: store.ensure_authority_policy({"principal": PRINCIPAL}, window_ms=1))
    assert "capabilities" in error.message
    error = raises(INVALID, lambda: store.ensure_authority_policy(AUTHORITY, window_ms=1, max_runs=0))
    assert "windowMs" in error.message
    assert dump_tables(store) == before
    created = store.ensure_authority_policy(AUTHORITY, window_ms=60_000, max_runs=2, max_units=3)
    assert (created.window_ms, created.max_runs, created.max_units) == (60_000, 2, 3)


# --------------------------------------------------------------------------- closed store: reads vs writes

# One call per read method with an invalid argument: the seed checks the store first.
READS: dict[str, Callable[[SchedulerStore], Any]] = {
    "get_job": lambda s: s.get_job(""),
    "get_occurrence": lambda s: s.get_occurrence(None),
    "list_occurrences_by_trigger": lambda s: s.list_occurrences_by_trigger(job_id="", trigger_key="t"),
    "history": lambda s: s.history(limit=0),
    "list_dead_letters": lambda s: s.list_dead_letters(job_id=""),
    "get_authority_policy": lambda s: s.get_authority_policy(None),
    "get_authority_reservation": lambda s: s.get_authority_reservation(""),
    "get_adjudication_case": lambda s: s.get_adjudication_case(""),
    "list_adjudication_cases": lambda s: s.list_adjudication_cases(limit=0),
    "get_occurrence_adjudication": lambda s: s.get_occurrence_adjudication(""),
    "get_domain_migration": lambda s: s.get_domain_migration(""),
    "list_domain_migrations": lambda s: s.list_domain_migrations(state="nope"),
    "get_active_domain_migration_by_source": lambda s: s.get_active_domain_migration_by_source(
        domain="nope", source_scope={}, source_id="x"
    ),
    "get_occurrence_control": lambda s: s.get_occurrence_control(""),
    "list_runtime_control_occurrences": lambda s: s.list_runtime_control_occurrences(statuses=[]),
    # beyond the original (scheduler.worker's reads), built by the same rule
    "list_periodic_jobs": lambda s: s.list_periodic_jobs(job_kinds="agenda"),
    "latest_trigger_ticks": lambda s: s.latest_trigger_ticks(""),
    "periodic_state": lambda s: s.periodic_state(""),
    "get_occurrence_runtime": lambda s: s.get_occurrence_runtime(""),
    "list_controllable_occurrences": lambda s: s.list_controllable_occurrences(statuses=[]),
}
_RUN = {"occurrence_id": "o", "owner_id": "w", "fence": 0}
_DIGEST = "sha256:" + "ab" * 32
# One call per write method with an invalid argument: validated before the closed check.
WRITES: dict[str, Callable[[SchedulerStore], Any]] = {
    "create_job": lambda s: s.create_job(id="", kind="k", authority=AUTHORITY),
    "update_job": lambda s: s.update_job("job-a", 0, enabled=True),
    "enqueue_occurrence": lambda s: s.enqueue_occurrence(job_id="job-a", scheduled_for=-1, trigger_key="t"),
    "enqueue_occurrence_once_per_trigger": lambda s: s.enqueue_occurrence_once_per_trigger(
        job_id="job-a", scheduled_for=T0, trigger_key=""
    ),
    "enqueue_many": lambda s: s.enqueue_many([{"job_id": "", "scheduled_for": T0, "trigger_key": "t"}]),
    "enqueue_periodic_tick": lambda s: s.enqueue_periodic_tick(
        job_id="job-a", job_revision=0, scheduled_for=T0, trigger_key="interval:0"
    ),
    "claim_next": lambda s: s.claim_next(owner_id="w", lease_ms=0),
    "claim_batch": lambda s: s.claim_batch(owner_id="w", lease_ms=10, limit=0),
    "claim_occurrence": lambda s: s.claim_occurrence(occurrence_id="", owner_id="w", lease_ms=10),
    "renew": lambda s: s.renew(**_RUN, lease_ms=10),
    "release_lease": lambda s: s.release_lease(**_RUN),
    "settle": lambda s: s.settle(**_RUN, outcome="succeeded"),
    "settle_many": lambda s: s.settle_many([{**_RUN, "outcome": "done"}]),
    "settle_and_claim": lambda s: s.settle_and_claim(**_RUN, outcome="succeeded", lease_ms=0),
    "settle_many_and_claim": lambda s: s.settle_many_and_claim([], owner_id="w", lease_ms=10, limit=-1),
    "set_authority_policy": lambda s: s.set_authority_policy(
        PRINCIPAL, capabilities=[], window_ms=60_000, max_runs=1, max_units=1
    ),
    "ensure_authority_policy": lambda s: s.ensure_authority_policy({"principal": None}),
    "reserve_authority": lambda s: s.reserve_authority(occurrence_id="o", policy_revision=0),
    "adjudicate_occurrence": lambda s: s.adjudicate_occurrence(
        occurrence_id="o",
        decision="maybe",
        expected_evidence_digest=_DIGEST,
        expected_attempt=1,
        expected_fence=1,
        reason_digest=_DIGEST,
        operator_digest=_DIGEST,
    ),
    "prepare_domain_migration": lambda s: s.prepare_domain_migration({"entries": []}),
    "apply_domain_migration": lambda s: s.apply_domain_migration(""),
    "verify_domain_migration": lambda s: s.verify_domain_migration("m", sources=None),
    "begin_domain_migration_retirement": lambda s: s.begin_domain_migration_retirement(""),
    "confirm_domain_migration_entry_retired": lambda s: s.confirm_domain_migration_entry_retired(
        migration_id="m", entry_id="e", retirement_token="", source={}
    ),
    "begin_domain_migration_rollback": lambda s: s.begin_domain_migration_rollback(""),
    "rollback_domain_migration_targets": lambda s: s.rollback_domain_migration_targets(""),
    "restore_domain_migration_entry_source": lambda s: s.restore_domain_migration_entry_source(
        migration_id="m", entry_id="e", restore_source=None
    ),
    "confirm_domain_migration_entry_source_restored": lambda s: (
        s.confirm_domain_migration_entry_source_restored(migration_id="", entry_id="e", source={})
    ),
    "bind_domain_migration_source_locator": lambda s: s.bind_domain_migration_source_locator(
        migration_id="m",
        entry_id="e",
        source_locator={},
        expected_source_digest="sha256:x",
        expected_target_job_id="t",
    ),
    "request_occurrence_pause": lambda s: s.request_occurrence_pause(
        occurrence_id="o", expected_fence=1, request_id="r", capability=None
    ),
    "ack_occurrence_pause": lambda s: s.ack_occurrence_pause(
        occurrence_id="o", owner_id="w", fence=1, request_id="r", expected_revision=1, safe_point="x"
    ),
    "resume_occurrence": lambda s: s.resume_occurrence(
        occurrence_id="o", expected_revision=0, request_id="r"
    ),
    "requeue_dead_letter": lambda s: s.requeue_dead_letter(
        occurrence_id="o", expected_fence=1, expected_error_code="", request_id="r"
    ),
    # beyond the original: cancellation and maintenance, validated like writes
    "cancel_occurrence": lambda s: s.cancel_occurrence(occurrence_id="o", reason=7),
    "prune": lambda s: s.prune(older_than_ms=-1),
}
NO_ARGUMENTS = frozenset(
    {"close", "notify_workers", "schema_info", "transaction", "on_connection", "stats", "queue_depth"}
)
# request_occurrence_pause without a checkpoint capability is not an invalid argument:
EXPECTED_ON_CLOSED = {"request_occurrence_pause": "SCHEDULER_PAUSE_UNSUPPORTED"}


def test_every_public_method_is_classified_as_a_read_or_a_write() -> None:
    public = {
        n for n in dir(SchedulerStore) if not n.startswith("_") and callable(getattr(SchedulerStore, n))
    }
    assert public - NO_ARGUMENTS == set(READS) | set(WRITES)
    assert not set(READS) & set(WRITES)


@pytest.mark.parametrize("method", sorted(READS))
def test_a_read_checks_the_store_before_its_arguments(store: SchedulerStore, method: str) -> None:
    raises(INVALID, lambda: READS[method](store))
    store.close()
    raises(CLOSED, lambda: READS[method](store))


@pytest.mark.parametrize("method", sorted(WRITES))
def test_a_write_checks_its_arguments_before_the_store(store: SchedulerStore, method: str) -> None:
    store.close()
    raises(EXPECTED_ON_CLOSED.get(method, INVALID), lambda: WRITES[method](store))


# --------------------------------------------------------------------------- the enqueue payload


def test_a_missing_or_disabled_job_is_reported_before_a_bad_payload(store: SchedulerStore) -> None:
    before = dump_tables(store)
    raises(
        "SCHEDULER_NOT_FOUND",
        lambda: store.enqueue_occurrence(job_id="missing", scheduled_for=T0, trigger_key="t", payload=NAN),
    )
    store.update_job("job-a", 1, enabled=False)
    disabled = dump_tables(store)
    raises(
        "SCHEDULER_JOB_DISABLED",
        lambda: store.enqueue_occurrence(
            job_id="job-a", scheduled_for=T0, trigger_key="t", payload={"bad": NAN}
        ),
    )
    raises(
        "SCHEDULER_JOB_DISABLED",
        lambda: store.enqueue_occurrence_once_per_trigger(
            job_id="job-a", scheduled_for=T0, trigger_key="t", payload={1: "non-str key"}
        ),
    )
    assert dump_tables(store) == disabled
    assert before["occurrences"] == disabled["occurrences"] == []


def test_a_bad_payload_of_an_enabled_job_is_invalid_and_writes_nothing(store: SchedulerStore) -> None:
    before = dump_tables(store)
    error = raises(
        INVALID,
        lambda: store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="t", payload=[NAN]),
    )
    assert error.message.startswith("occurrence.payload")
    assert dump_tables(store) == before


def test_once_per_trigger_returns_the_earlier_occurrence_without_looking_at_the_payload(
    store: SchedulerStore,
) -> None:
    first = store.enqueue_occurrence_once_per_trigger(job_id="job-a", scheduled_for=T0, trigger_key="daily")
    before = dump_tables(store)
    again = store.enqueue_occurrence_once_per_trigger(
        job_id="job-a", scheduled_for=T0 + 5, trigger_key="daily", payload=NAN
    )
    assert again.deduplicated and again.id == first.id
    assert dump_tables(store) == before


def test_a_batch_reports_items_in_order_with_the_seed_s_codes(store: SchedulerStore) -> None:
    before = dump_tables(store)
    items = [
        {"job_id": "job-a", "scheduled_for": T0, "trigger_key": "ok"},
        {"job_id": "missing", "scheduled_for": T0, "trigger_key": "t", "payload": NAN},
        {"job_id": "job-a", "scheduled_for": T0, "trigger_key": "bad", "payload": NAN},
    ]
    error = raises("SCHEDULER_NOT_FOUND", lambda: store.enqueue_many(items))
    assert error.details == {"index": 1}
    error = raises(INVALID, lambda: store.enqueue_many([items[0], items[2]]))
    assert error.details == {"index": 1}
    assert dump_tables(store) == before
