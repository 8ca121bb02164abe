"""Authority policies, budgets and reservations (schema v2), on both backends (``place``).

API §5 Authority (v2).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from governance_support import (
    ALICE,
    ALICE_AUTHORITY,
    T0,
    Env,
    create_job,
    enqueue,
    env_at,
    expect_error,
    running,
    set_policy,
    settle_failed,
    settle_succeeded,
)
from store_places import StorePlace

import scheduler.store.capabilities.authority as authority_module
from scheduler.contract.constants import MAX_AUTHORITY_WINDOW_MS

INVALID = "SCHEDULER_INVALID_ARGUMENT"
HOUR = 3_600_000


@pytest.fixture
def env(place: StorePlace) -> Any:
    with env_at(place) as environment:
        yield environment


def _table(env: Env, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = env.dump()["tables"][name]
    return rows


# --------------------------------------------------------------------------- policies


def test_set_policy_creates_revision_one_with_sorted_unique_capabilities(env: Env) -> None:
    policy = set_policy(env, capabilities=["notify.desktop", "calendar.read", "notify.desktop"], max_runs=2)
    assert policy.to_dict() == {
        "principal": ALICE,
        "revision": 1,
        "enabled": True,
        "capabilities": ["calendar.read", "notify.desktop"],
        "windowMs": HOUR,
        "maxRuns": 2,
        "maxUnits": 100,
        "createdAt": env.now,
        "updatedAt": env.now,
    }
    assert env.store.get_authority_policy(ALICE) == policy
    [row] = _table(env, "scheduler_authority_policies")
    assert row["capabilities_json"] == '["calendar.read","notify.desktop"]'
    assert row["enabled"] == 1


def test_set_policy_replaces_and_bumps_revision_keeping_created_at(env: Env) -> None:
    first = set_policy(env)
    second = set_policy(env, capabilities=["x.y"], enabled=False, max_units=7, expected_revision=1)
    assert (second.revision, second.enabled, second.capabilities, second.max_units) == (2, False, ["x.y"], 7)
    assert second.created_at == first.created_at
    assert second.updated_at == env.now > first.updated_at
    third = set_policy(env)  # no expected revision: unconditional replace
    assert third.revision == 3 and third.enabled is True


def test_set_policy_revision_compare_and_set(env: Env) -> None:
    error = expect_error("SCHEDULER_AUTHORITY_POLICY_CONFLICT", lambda: set_policy(env, expected_revision=4))
    assert error.details == {"expectedRevision": 4, "actualRevision": 0}
    assert env.store.get_authority_policy(ALICE) is None
    assert set_policy(env, expected_revision=0).revision == 1
    error = expect_error("SCHEDULER_AUTHORITY_POLICY_CONFLICT", lambda: set_policy(env, expected_revision=0))
    assert error.details == {"expectedRevision": 0, "actualRevision": 1}
    assert set_policy(env, expected_revision=1).revision == 2


def test_get_policy_ignores_extra_principal_keys_and_returns_none_when_absent(env: Env) -> None:
    set_policy(env)
    assert env.store.get_authority_policy({**ALICE, "name": "Alice"}) is not None
    assert env.store.get_authority_policy({"type": "user", "id": "nobody"}) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("capabilities", []),
        ("capabilities", ["*"]),
        ("capabilities", ["ok", "*"]),
        ("capabilities", "calendar.read"),
        ("capabilities", ["ok", ""]),
        ("capabilities", [f"c{index}" for index in range(257)]),
        ("window_ms", 59_999),
        ("window_ms", MAX_AUTHORITY_WINDOW_MS + 1),
        ("window_ms", 3_600_000.0),
        ("max_runs", 0),
        ("max_runs", 1_000_001),
        ("max_runs", True),
        ("max_units", "5"),
        ("max_units", None),
        ("enabled", 1),
        ("enabled", None),
        ("expected_revision", -1),
        ("expected_revision", 1.0),
        ("expected_revision", False),
    ],
)
def test_set_policy_rejects_invalid_arguments_without_writing(env: Env, field: str, value: Any) -> None:
    before = env.dump()
    expect_error(INVALID, lambda: set_policy(env, **{field: value}))
    assert env.dump() == before


@pytest.mark.parametrize(
    "principal", [None, "user-alice", [], {}, {"type": "user"}, {"type": "t" * 65, "id": "x"}]
)
def test_policy_principal_must_be_an_object_with_type_and_id(env: Env, principal: Any) -> None:
    expect_error(INVALID, lambda: set_policy(env, principal=principal))
    expect_error(INVALID, lambda: env.store.get_authority_policy(principal))


def test_window_and_budget_bounds_are_inclusive(env: Env) -> None:
    low = set_policy(env, window_ms=60_000, max_runs=1, max_units=1)
    assert (low.window_ms, low.max_runs, low.max_units) == (60_000, 1, 1)
    high = set_policy(env, window_ms=MAX_AUTHORITY_WINDOW_MS, max_runs=1_000_000, max_units=1_000_000)
    assert (high.window_ms, high.max_runs, high.max_units) == (MAX_AUTHORITY_WINDOW_MS, 1_000_000, 1_000_000)


# --------------------------------------------------------------------------- ensure


def test_ensure_creates_a_default_policy_from_the_envelope(env: Env) -> None:
    env.tick()
    policy = env.store.ensure_authority_policy(ALICE_AUTHORITY)
    assert policy.to_dict() == {
        "principal": ALICE,
        "revision": 1,
        "enabled": True,
        "capabilities": ["calendar.read", "notify.desktop"],
        "windowMs": 86_400_000,
        "maxRuns": 100_000,
        "maxUnits": 100_000,
        "createdAt": env.now,
        "updatedAt": env.now,
    }


def test_ensure_returns_the_existing_policy_unchanged(env: Env) -> None:
    existing = set_policy(env, capabilities=["other.cap"], enabled=False)
    before = env.dump()
    env.tick()
    assert env.store.ensure_authority_policy(ALICE_AUTHORITY, window_ms=60_000) == existing
    # An envelope without capabilities cannot create a policy, but it can find one.
    assert env.store.ensure_authority_policy({"principal": ALICE}) == existing
    assert env.dump() == before


def test_ensure_with_options(env: Env) -> None:
    authority = {
        "principal": {"type": "service", "id": "cowork-daemon"},
        "requestedCapabilities": ["cowork.sync"],
    }
    policy = env.store.ensure_authority_policy(authority, window_ms=600_000, max_runs=3, max_units=4)
    assert (policy.window_ms, policy.max_runs, policy.max_units, policy.capabilities) == (
        600_000,
        3,
        4,
        ["cowork.sync"],
    )


@pytest.mark.parametrize(
    ("authority", "options"),
    [
        ({"principal": ALICE}, {}),
        ({"principal": ALICE, "requestedCapabilities": ["*"]}, {}),
        ({"principal": ALICE, "extra": 1}, {}),
        (None, {}),
        (ALICE_AUTHORITY, {"window_ms": 1}),
        (ALICE_AUTHORITY, {"max_runs": None}),
        (ALICE_AUTHORITY, {"max_units": 2.0}),
    ],
)
def test_ensure_rejects_what_cannot_become_a_policy(
    env: Env, authority: Any, options: dict[str, Any]
) -> None:
    before = env.dump()
    expect_error(INVALID, lambda: env.store.ensure_authority_policy(authority, **options))
    assert env.dump() == before


def test_ensure_tolerates_a_concurrent_creation(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    winner = set_policy(env, capabilities=["winner.cap"])
    real = authority_module.load_authority_policy
    calls = {"n": 0}

    def first_read_misses(tx: Any, principal: dict[str, str]) -> Any:
        calls["n"] += 1
        return None if calls["n"] == 1 else real(tx, principal)

    monkeypatch.setattr(authority_module, "load_authority_policy", first_read_misses)
    assert env.store.ensure_authority_policy(ALICE_AUTHORITY) == winner


def test_ensure_reraises_the_conflict_when_the_policy_stays_invisible(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_policy(env)
    monkeypatch.setattr(authority_module, "load_authority_policy", lambda tx, principal: None)
    expect_error(
        "SCHEDULER_AUTHORITY_POLICY_CONFLICT", lambda: env.store.ensure_authority_policy(ALICE_AUTHORITY)
    )


# --------------------------------------------------------------------------- reservations


def _budget_job(env: Env, **policy: Any) -> None:
    set_policy(env, **policy)
    create_job(env, "agenda-budget")


def test_reserve_books_the_current_window(env: Env) -> None:
    _budget_job(env, max_runs=2, max_units=5)
    occurrence = running(env, "agenda-budget", "b1")
    env.tick()
    reservation = env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1, units=2)
    window = env.now // HOUR * HOUR
    assert reservation.to_dict() == {
        "occurrenceId": occurrence.id,
        "jobId": "agenda-budget",
        "principal": ALICE,
        "policyRevision": 1,
        "windowStartedAt": window,
        "units": 2,
        "status": "reserved",
        "outcome": None,
        "createdAt": env.now,
        "settledAt": None,
        "deduplicated": False,
    }
    assert env.store.get_authority_reservation(occurrence.id) == reservation.replace(deduplicated=None)
    assert _table(env, "scheduler_authority_usage") == [
        {
            "principal_type": "user",
            "principal_id": "user-alice",
            "policy_revision": 1,
            "window_started_at": window,
            "runs": 1,
            "units": 2,
            "updated_at": env.now,
        }
    ]


def test_reserve_is_idempotent_and_detects_mismatches(env: Env) -> None:
    _budget_job(env)
    occurrence = running(env, "agenda-budget", "b1")
    first = env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1, units=2)
    env.tick()
    again = env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1, units=2)
    assert again == first.replace(deduplicated=True)
    before = env.dump()
    for arguments in ({"policy_revision": 1, "units": 3}, {"policy_revision": 2, "units": 2}):
        expect_error(
            "SCHEDULER_AUTHORITY_RESERVATION_MISMATCH",
            lambda arguments=arguments: env.store.reserve_authority(occurrence_id=occurrence.id, **arguments),
        )
    assert env.dump() == before


def test_reserve_dedupes_even_after_the_policy_was_disabled_or_revised(env: Env) -> None:
    _budget_job(env)
    occurrence = running(env, "agenda-budget", "b1")
    first = env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1)
    set_policy(env, enabled=False)
    again = env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1)
    assert again.deduplicated is True and again.created_at == first.created_at


def test_reserve_requires_a_running_existing_occurrence(env: Env) -> None:
    _budget_job(env)
    queued = enqueue(env, "agenda-budget", "later")
    error = expect_error(
        "SCHEDULER_AUTHORITY_OCCURRENCE_NOT_RUNNING",
        lambda: env.store.reserve_authority(occurrence_id=queued.id, policy_revision=1),
    )
    assert error.details is None
    expect_error(
        "SCHEDULER_NOT_FOUND",
        lambda: env.store.reserve_authority(occurrence_id="occ_missing", policy_revision=1),
    )


def test_reserve_requires_an_enabled_policy(env: Env) -> None:
    create_job(env, "agenda-budget")
    occurrence = running(env, "agenda-budget", "b1")
    error = expect_error(
        "SCHEDULER_AUTHORITY_POLICY_REQUIRED",
        lambda: env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1),
    )
    assert error.message.endswith("user:user-alice")
    set_policy(env, enabled=False)
    expect_error(
        "SCHEDULER_AUTHORITY_POLICY_REQUIRED",
        lambda: env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1),
    )


def test_reserve_refuses_a_stale_policy_revision(env: Env) -> None:
    _budget_job(env)
    set_policy(env)
    occurrence = running(env, "agenda-budget", "b1")
    error = expect_error(
        "SCHEDULER_AUTHORITY_POLICY_STALE",
        lambda: env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1),
    )
    assert error.details == {"expectedRevision": 1, "actualRevision": 2}


def test_reserve_denies_capabilities_the_policy_lacks(env: Env) -> None:
    set_policy(env, capabilities=["calendar.read"])
    authority = {
        **ALICE_AUTHORITY,
        "requestedCapabilities": ["zz.unknown", "calendar.read", "network.egress"],
    }
    create_job(env, "agenda-exfil", authority=authority)
    occurrence = running(env, "agenda-exfil", "x")
    before = env.dump()
    error = expect_error(
        "SCHEDULER_AUTHORITY_PERMISSION_DENIED",
        lambda: env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1),
    )
    assert error.details == {"denied": ["network.egress", "zz.unknown"]}
    assert env.dump() == before


def test_budget_exhaustion_reports_the_window(env: Env) -> None:
    _budget_job(env, max_runs=2, max_units=5)
    occurrences = [running(env, "agenda-budget", f"b{index}", owner=f"w{index}") for index in range(4)]
    env.store.reserve_authority(occurrence_id=occurrences[0].id, policy_revision=1, units=2)
    env.store.reserve_authority(occurrence_id=occurrences[1].id, policy_revision=1, units=3)
    window = env.now // HOUR * HOUR
    before = env.dump()
    error = expect_error(
        "SCHEDULER_AUTHORITY_BUDGET_EXHAUSTED",
        lambda: env.store.reserve_authority(occurrence_id=occurrences[2].id, policy_revision=1),
    )
    assert error.details == {
        "windowStartedAt": window,
        "windowEndsAt": window + HOUR,
        "usedRuns": 2,
        "usedUnits": 5,
        "requestedUnits": 1,
        "maxRuns": 2,
        "maxUnits": 5,
    }
    assert env.dump() == before


def test_unit_budget_is_checked_independently_of_runs(env: Env) -> None:
    _budget_job(env, max_runs=10, max_units=3)
    first = running(env, "agenda-budget", "b1")
    second = running(env, "agenda-budget", "b2", owner="w2")
    env.store.reserve_authority(occurrence_id=first.id, policy_revision=1, units=2)
    error = expect_error(
        "SCHEDULER_AUTHORITY_BUDGET_EXHAUSTED",
        lambda: env.store.reserve_authority(occurrence_id=second.id, policy_revision=1, units=2),
    )
    assert (error.details["usedRuns"], error.details["usedUnits"], error.details["requestedUnits"]) == (
        1,
        2,
        2,
    )
    assert env.store.reserve_authority(occurrence_id=second.id, policy_revision=1, units=1).units == 1


def test_a_new_window_starts_a_new_budget(env: Env) -> None:
    _budget_job(env, max_runs=1, max_units=1)
    first = running(env, "agenda-budget", "b1")
    second = running(env, "agenda-budget", "b2", owner="w2", lease_ms=2 * HOUR)
    env.store.reserve_authority(occurrence_id=first.id, policy_revision=1)
    expect_error(
        "SCHEDULER_AUTHORITY_BUDGET_EXHAUSTED",
        lambda: env.store.reserve_authority(occurrence_id=second.id, policy_revision=1),
    )
    next_window = (env.now // HOUR + 1) * HOUR
    env.at(next_window)  # exactly on the boundary: floor(now / window) * window
    reservation = env.store.reserve_authority(occurrence_id=second.id, policy_revision=1)
    assert reservation.window_started_at == next_window
    assert [(row["window_started_at"], row["runs"]) for row in _table(env, "scheduler_authority_usage")] == [
        (next_window - HOUR, 1),
        (next_window, 1),
    ]


def test_usage_is_counted_per_policy_revision(env: Env) -> None:
    _budget_job(env, max_runs=1, max_units=1)
    first = running(env, "agenda-budget", "b1")
    second = running(env, "agenda-budget", "b2", owner="w2")
    env.store.reserve_authority(occurrence_id=first.id, policy_revision=1)
    set_policy(env, max_runs=1, max_units=1)
    reservation = env.store.reserve_authority(occurrence_id=second.id, policy_revision=2)
    assert reservation.policy_revision == 2
    assert sorted(row["policy_revision"] for row in _table(env, "scheduler_authority_usage")) == [1, 2]


def test_usage_that_disagrees_with_reservations_is_refused(env: Env) -> None:
    _budget_job(env)
    first = running(env, "agenda-budget", "b1")
    second = running(env, "agenda-budget", "b2", owner="w2")
    env.store.reserve_authority(occurrence_id=first.id, policy_revision=1, units=2)
    env.sql("UPDATE scheduler_authority_usage SET runs = 5, units = 9")
    error = expect_error(
        "SCHEDULER_AUTHORITY_BUDGET_STATE_INVALID",
        lambda: env.store.reserve_authority(occurrence_id=second.id, policy_revision=1),
    )
    assert error.details == {"usage": {"runs": 5, "units": 9}, "reservations": {"runs": 1, "units": 2}}
    env.sql("DELETE FROM scheduler_authority_usage")  # a missing usage row counts as zero
    error = expect_error(
        "SCHEDULER_AUTHORITY_BUDGET_STATE_INVALID",
        lambda: env.store.reserve_authority(occurrence_id=second.id, policy_revision=1),
    )
    assert error.details == {"usage": {"runs": 0, "units": 0}, "reservations": {"runs": 1, "units": 2}}


@pytest.mark.parametrize(
    "arguments",
    [
        {"occurrence_id": None, "policy_revision": 1},
        {"occurrence_id": "", "policy_revision": 1},
        {"occurrence_id": "occ", "policy_revision": 0},
        {"occurrence_id": "occ", "policy_revision": None},
        {"occurrence_id": "occ", "policy_revision": 2**53},
        {"occurrence_id": "occ", "policy_revision": 1, "units": 0},
        {"occurrence_id": "occ", "policy_revision": 1, "units": 1_000_001},
        {"occurrence_id": "occ", "policy_revision": 1, "units": 1.0},
    ],
)
def test_reserve_rejects_invalid_arguments(env: Env, arguments: dict[str, Any]) -> None:
    expect_error(INVALID, lambda: env.store.reserve_authority(**arguments))


def test_policy_revision_may_be_any_positive_safe_integer(env: Env) -> None:
    error = expect_error(
        "SCHEDULER_NOT_FOUND",
        lambda: env.store.reserve_authority(occurrence_id="occ", policy_revision=2**53 - 1),
    )
    assert error.message == "Scheduler occurrence does not exist: occ"


def test_get_reservation_validates_and_returns_none_when_absent(env: Env) -> None:
    assert env.store.get_authority_reservation("occ_none") is None
    expect_error(INVALID, lambda: env.store.get_authority_reservation(" "))


# --------------------------------------------------------------------------- settlement (leases.py)


def test_success_settles_the_reservation(env: Env) -> None:
    _budget_job(env)
    occurrence = running(env, "agenda-budget", "b1")
    env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1, units=2)
    settle_succeeded(env, occurrence, {"sent": 2})
    reservation = env.store.get_authority_reservation(occurrence.id)
    assert reservation is not None
    assert (reservation.status, reservation.outcome, reservation.settled_at) == (
        "succeeded",
        {"status": "succeeded", "result": {"sent": 2}},
        env.now,
    )
    [event] = [event for event in env.events(occurrence.id) if event["type"] == "occurrence_succeeded"]
    assert event["data"] == {
        "attempt": 1,
        "maxAttempts": 3,
        "authorityPolicyRevision": 1,
        "authorityUnits": 2,
    }


def test_retryable_failure_keeps_the_reservation_and_dead_letter_fails_it(env: Env) -> None:
    _budget_job(env)
    occurrence = running(env, "agenda-budget", "b1")
    env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1)
    waiting = settle_failed(env, occurrence, {"code": "SMTP_DOWN"})
    assert waiting.status == "retry_wait"
    assert env.store.get_authority_reservation(occurrence.id).status == "reserved"  # type: ignore[union-attr]
    retry = running_again(env, occurrence.id)
    dead = settle_failed(env, retry, {"code": "CALENDAR_GONE"}, retryable=False)
    assert dead.status == "dead_letter"
    reservation = env.store.get_authority_reservation(occurrence.id)
    assert reservation is not None
    assert reservation.status == "failed"
    assert reservation.outcome == {"status": "dead_letter", "error": {"code": "CALENDAR_GONE"}}
    assert reservation.settled_at == env.now
    row = _table(env, "scheduler_authority_reservations")[0]
    assert json.loads(row["outcome_json"]) == reservation.outcome
    assert row["outcome_json"] == '{"error":{"code":"CALENDAR_GONE"},"status":"dead_letter"}'


def running_again(env: Env, occurrence_id: str) -> Any:
    env.tick()
    claimed = env.store.claim_occurrence(occurrence_id=occurrence_id, owner_id="w9", lease_ms=600_000)
    assert claimed is not None
    return claimed


def test_expired_final_attempt_without_adjudication_keeps_its_reservation(env: Env) -> None:
    """Seed 000: the sweep settles a reservation only while a pending adjudication exists."""
    _budget_job(env)
    create_job(env, "agenda-once", max_attempts=1)
    occurrence = running(env, "agenda-once", "once", lease_ms=60_000)
    env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1)
    env.tick(120_000)
    env.store.claim_next(owner_id="sweeper", lease_ms=60_000)
    assert env.store.get_occurrence(occurrence.id).status == "dead_letter"  # type: ignore[union-attr]
    assert env.store.get_authority_reservation(occurrence.id).status == "reserved"  # type: ignore[union-attr]


def test_window_is_floor_of_now_over_window(place: StorePlace) -> None:
    with env_at(place, now=T0 + 59 * 60_000 + 59_999) as env:
        set_policy(env, window_ms=60_000)
        create_job(env, "agenda-budget")
        occurrence = running(env, "agenda-budget", "b1")
        reservation = env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1)
        assert reservation.window_started_at == env.now - env.now % 60_000
