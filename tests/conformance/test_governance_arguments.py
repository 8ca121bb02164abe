"""Every governance method rejects bad input with SCHEDULER_INVALID_ARGUMENT and writes nothing.

A property test over authority, adjudication, runtime-control and requeue methods: one argument of an
otherwise valid call is replaced by an invalid value, and a dump of the database must not change.
On both backends (``place``).
API §5 (argument validation of the v2, v3, v6 methods).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from governance_support import (
    ALICE,
    ALICE_AUTHORITY,
    CHECKPOINT_CAPABILITY,
    create_job,
    env_at,
    expect_error,
    outcome_unknown_dead_letter,
    paused,
    request_pause,
    running,
    set_policy,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_places import StorePlace, examples

from scheduler import SchedulerKernelError, SchedulerStore
from scheduler.contract.canonical import sha256_payload_digest
from scheduler.contract.constants import MAX_AUTHORITY_WINDOW_MS, MAX_SAFE_INTEGER

INVALID = "SCHEDULER_INVALID_ARGUMENT"


_NOBODY = {"type": "service", "id": "no-policy-yet"}
_identifier = st.one_of(
    st.none(),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.lists(st.text(max_size=3), max_size=2),
    st.just(""),
    st.lists(st.sampled_from([" ", "\t", "\n", "\u3000", "\ufeff", "\u00a0"]), min_size=1).map("".join),
    st.text(alphabet="abc", max_size=5).map(lambda text: f"a{text}\x01"),
    st.text(alphabet="abc", max_size=5).map(lambda text: f"{text}\x7fz"),
    st.integers(min_value=257, max_value=400).map(lambda size: "x" * size),
)
_identifier_128 = st.one_of(
    _identifier, st.integers(min_value=129, max_value=256).map(lambda size: "r" * size)
)
_positive = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(max_value=0),
    st.integers(min_value=MAX_SAFE_INTEGER + 1, max_value=2**64),
    st.text(max_size=4),
)
_budget = st.one_of(_positive, st.integers(min_value=1_000_001, max_value=2**40))
_window = st.one_of(
    _positive,
    st.integers(min_value=1, max_value=59_999),
    st.integers(min_value=MAX_AUTHORITY_WINDOW_MS + 1, max_value=2**50),
)
_optional_revision = st.one_of(st.booleans(), st.floats(), st.integers(max_value=-1), st.text(max_size=3))
_capability_declarations = st.sampled_from(
    [
        "checkpoint_v1",
        ["checkpoint_v1"],
        7,
        {"pauseResume": "bogus"},
        {"pauseResume": "checkpoint_v1"},
        {"pauseResume": "checkpoint_v1", "safePoints": []},
        {"pauseResume": "none", "safePoints": ["before_execute"]},
        {"pauseResume": "checkpoint_v1", "safePoints": ["nowhere"]},
        {"pauseResume": "checkpoint_v1", "safePoints": "before_execute"},
        {**CHECKPOINT_CAPABILITY, "extra": 1},
        {**CHECKPOINT_CAPABILITY, "schemaVersion": 2},
    ]
)
_principal = st.one_of(
    st.none(),
    st.text(max_size=5),
    st.lists(st.text(max_size=3), max_size=2),
    st.just({}),
    st.builds(lambda value: {"type": value, "id": "x"}, _identifier),
    st.builds(lambda value: {"type": "user", "id": value}, _identifier),
    st.just({"type": "t" * 65, "id": "x"}),
)
_envelope = st.one_of(
    st.none(),
    st.text(max_size=5),
    st.just({"principal": ALICE, "extra": 1}),
    st.just({"principal": ALICE, "schemaVersion": 2}),
    st.just({"principal": ALICE, "requestedCapabilities": "calendar.read"}),
    st.just({"principal": {**ALICE, "name": "Alice"}}),
    st.builds(lambda principal: {"principal": principal}, _principal),
    st.just({"principal": _NOBODY}),  # no capability to grant a new policy
    st.just({"principal": _NOBODY, "requestedCapabilities": ["*"]}),
)
_capabilities = st.one_of(
    st.none(),
    st.text(max_size=5),
    st.just([]),
    st.just(["*"]),
    st.lists(st.integers(), min_size=1, max_size=3),
    st.lists(_identifier, min_size=1, max_size=2),
    st.just([f"c{index}" for index in range(257)]),
)
_digest = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=10).filter(lambda text: re.fullmatch("sha256:[a-f0-9]{64}", text) is None),
    st.sampled_from(
        ["sha256:" + "A" * 64, "sha256:" + "a" * 63, "SHA256:" + "a" * 64, "sha256:" + "a" * 64 + "\n"]
    ),
)
_decision = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=12).filter(lambda text: text not in ("confirmed_applied", "confirmed_not_applied")),
)
_safe_point = st.one_of(
    _identifier,
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=20).filter(
        lambda text: text not in ("before_execute", "adapter_checkpoint")
    ),
)
_checkpoint = st.sampled_from(
    [
        float("nan"),
        float("inf"),
        {1: "x"},
        {"a": {1, 2}},
        b"bytes",
        (1, 2),
        "x" * 70_000,
        2**60,
        {"deep": [[[[object()]]]]},
    ]
)
_enumeration = st.sampled_from(
    [None, "running", [], ["bogus"], [1], ["running", ""], {"running"}, ["r" * 129]]
)
_bool = st.one_of(st.none(), st.integers(), st.text(max_size=3), st.floats())

INVALID_VALUES: dict[str, dict[str, Any]] = {
    "set_authority_policy": {
        "principal": _principal,
        "capabilities": _capabilities,
        "window_ms": _window,
        "max_runs": _budget,
        "max_units": _budget,
        "enabled": _bool,
        "expected_revision": _optional_revision,
    },
    "get_authority_policy": {"principal": _principal},
    "ensure_authority_policy": {
        "authority": _envelope,
        "window_ms": _window,
        "max_runs": _budget,
        "max_units": _budget,
    },
    "get_authority_reservation": {"occurrence_id": _identifier},
    "reserve_authority": {"occurrence_id": _identifier, "policy_revision": _positive, "units": _budget},
    "get_adjudication_case": {"occurrence_id": _identifier},
    "get_occurrence_adjudication": {"occurrence_id": _identifier},
    "list_adjudication_cases": {"limit": _positive},
    "adjudicate_occurrence": {
        "occurrence_id": _identifier,
        "decision": _decision,
        "expected_evidence_digest": _digest,
        "expected_attempt": _positive,
        "expected_fence": _positive,
        "reason_digest": _digest,
        "operator_digest": _digest,
    },
    "get_occurrence_control": {"occurrence_id": _identifier},
    "list_runtime_control_occurrences": {
        "statuses": _enumeration,
        "job_kinds": _enumeration,
        "limit": _positive,
    },
    "request_occurrence_pause": {
        "occurrence_id": _identifier,
        "expected_fence": _positive,
        "request_id": _identifier_128,
        "capability": _capability_declarations,
        "expected_revision": _optional_revision,
    },
    "ack_occurrence_pause": {
        "occurrence_id": _identifier,
        "owner_id": _identifier,
        "fence": _positive,
        "request_id": _identifier_128,
        "expected_revision": _positive,
        "safe_point": _safe_point,
        "checkpoint": _checkpoint,
    },
    "resume_occurrence": {
        "occurrence_id": _identifier,
        "expected_revision": _positive,
        "request_id": _identifier_128,
    },
    "requeue_dead_letter": {
        "occurrence_id": _identifier,
        "expected_fence": _positive,
        "expected_error_code": _identifier_128,
        "request_id": _identifier_128,
    },
}
POSITIONAL = {
    "get_authority_policy": "principal",
    "get_authority_reservation": "occurrence_id",
    "get_adjudication_case": "occurrence_id",
    "get_occurrence_adjudication": "occurrence_id",
    "get_occurrence_control": "occurrence_id",
    "set_authority_policy": "principal",
    "ensure_authority_policy": "authority",
}


@pytest.fixture
def governed(place: StorePlace) -> Any:
    """A store holding one of everything, and valid arguments that would change it."""
    with env_at(place) as env:
        set_policy(env)
        create_job(env, "agenda-pause", max_attempts=2)
        reserved = running(env, "agenda-pause", "reserved")
        env.store.reserve_authority(occurrence_id=reserved.id, policy_revision=1)
        pending = running(env, "agenda-pause", "pending", owner="w2")
        request_pause(env, pending, "pause-pending")
        parked = paused(env, "parked")
        unknown = outcome_unknown_dead_letter(env, "agenda-pause", "unknown")
        case = env.store.get_adjudication_case(unknown.id)
        assert case is not None
        valid: dict[str, dict[str, Any]] = {
            "set_authority_policy": {
                "principal": ALICE,
                "capabilities": ["a.b"],
                "window_ms": 60_000,
                "max_runs": 1,
                "max_units": 1,
                "enabled": True,
                "expected_revision": 1,
            },
            "get_authority_policy": {"principal": ALICE},
            "ensure_authority_policy": {
                "authority": {**ALICE_AUTHORITY, "principal": _NOBODY},
                "window_ms": 60_000,
                "max_runs": 1,
                "max_units": 1,
            },
            "get_authority_reservation": {"occurrence_id": reserved.id},
            "reserve_authority": {"occurrence_id": pending.id, "policy_revision": 1, "units": 1},
            "get_adjudication_case": {"occurrence_id": unknown.id},
            "get_occurrence_adjudication": {"occurrence_id": unknown.id},
            "list_adjudication_cases": {"limit": 5},
            "adjudicate_occurrence": {
                "occurrence_id": unknown.id,
                "decision": "confirmed_applied",
                "expected_evidence_digest": case.evidence_digest,
                "expected_attempt": 1,
                "expected_fence": 1,
                "reason_digest": sha256_payload_digest("why"),
                "operator_digest": sha256_payload_digest("who"),
            },
            "get_occurrence_control": {"occurrence_id": parked.id},
            "list_runtime_control_occurrences": {"statuses": ["paused"], "job_kinds": ["agenda"], "limit": 3},
            "request_occurrence_pause": {
                "occurrence_id": reserved.id,
                "expected_fence": 1,
                "request_id": "p-new",
                "capability": CHECKPOINT_CAPABILITY,
                "expected_revision": 0,
            },
            "ack_occurrence_pause": {
                "occurrence_id": pending.id,
                "owner_id": "w2",
                "fence": 1,
                "request_id": "pause-pending",
                "expected_revision": 1,
                "safe_point": "before_execute",
                "checkpoint": {"at": 1},
            },
            "resume_occurrence": {
                "occurrence_id": parked.id,
                "expected_revision": 2,
                "request_id": "resume-new",
            },
            "requeue_dead_letter": {
                "occurrence_id": unknown.id,
                "expected_fence": 1,
                "expected_error_code": "AGENDA_OUTCOME_UNKNOWN",
                "request_id": "rq-new",
            },
        }
        yield env, valid


def _call(store: SchedulerStore, method: str, arguments: dict[str, Any]) -> Any:
    function = getattr(store, method)
    if method in POSITIONAL:
        rest = dict(arguments)
        return function(rest.pop(POSITIONAL[method]), **rest)
    return function(**arguments)


def test_invalid_arguments_are_rejected_and_nothing_is_written(governed: Any) -> None:
    @settings(
        max_examples=examples(governed[0].place, 400),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(data=st.data())
    def one_invalid_argument(data: st.DataObject) -> None:
        invalid_argument_is_rejected(governed, data)

    one_invalid_argument()


def invalid_argument_is_rejected(governed: Any, data: st.DataObject) -> None:
    env, valid = governed
    method = data.draw(st.sampled_from(sorted(INVALID_VALUES)), label="method")
    parameter = data.draw(st.sampled_from(sorted(INVALID_VALUES[method])), label="parameter")
    value = data.draw(INVALID_VALUES[method][parameter], label="value")
    before = env.dump()
    env.tick()
    with pytest.raises(SchedulerKernelError) as caught:
        _call(env.store, method, {**valid[method], parameter: value})
    assert caught.value.code == INVALID, caught.value.message
    assert env.dump() == before


# Seed: every read method calls _assertOpen() before it reads its arguments; write methods (and
# ensureAuthorityPolicy, whose envelope is checked before its first read) validate first.
READS = frozenset(
    {
        "get_authority_policy",
        "get_authority_reservation",
        "get_adjudication_case",
        "get_occurrence_adjudication",
        "list_adjudication_cases",
        "get_occurrence_control",
        "list_runtime_control_occurrences",
    }
)


def test_validation_precedes_the_closed_store_check_except_in_reads(governed: Any) -> None:
    env, valid = governed
    with env_at(env.place.sibling("closed")) as closed_env:
        closed = closed_env.store
        closed.close()
        for method, arguments in valid.items():
            parameter = sorted(INVALID_VALUES[method])[0]
            invalid = {**arguments, parameter: {1}}
            expected = "SCHEDULER_STORE_CLOSED" if method in READS else INVALID
            expect_error(expected, lambda method=method, invalid=invalid: _call(closed, method, invalid))
            expect_error(
                "SCHEDULER_STORE_CLOSED",
                lambda method=method, arguments=arguments: _call(closed, method, arguments),
            )


class _Rollback(Exception):
    pass


def test_the_valid_baseline_arguments_are_accepted(governed: Any) -> None:
    """Guards the property test: each baseline call succeeds, so only the corrupted value can fail."""
    env, valid = governed
    before = env.dump()
    for method in sorted(valid):
        with pytest.raises(_Rollback), env.store.transaction() as tx:
            _call(tx, method, valid[method])
            raise _Rollback
    assert env.dump() == before
