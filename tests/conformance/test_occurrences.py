"""Enqueue (idempotent), once-per-trigger, reads and enqueue_many, on both backends (``place``).

API §5 Jobs and occurrences, Batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lifecycle_support import INVALID, T0, Env, env_at, expect_error
from store_places import StorePlace, examples

from scheduler import SchedulerKernelError, derive_occurrence_identity
from scheduler.store.records import Occurrence

OCCURRENCE_KEYS = [
    "id",
    "jobId",
    "jobRevision",
    "idempotencyKey",
    "triggerKey",
    "scheduledFor",
    "availableAt",
    "status",
    "attempt",
    "maxAttempts",
    "fence",
    "leaseOwner",
    "leaseExpiresAt",
    "authority",
    "payload",
    "lastError",
    "result",
    "createdAt",
    "updatedAt",
    "settledAt",
]


@pytest.fixture
def env(place: StorePlace) -> Iterator[Env]:
    with env_at(place) as environment:
        environment.job("agenda-a", max_attempts=2)
        yield environment


def test_enqueue_creates_a_queued_occurrence_with_the_derived_identity(env: Env) -> None:
    occurrence = env.enqueue(trigger_key="cron:1", scheduled_for=T0 + 5000)
    identity = derive_occurrence_identity(
        job_id="agenda-a", job_revision=1, scheduled_for=T0 + 5000, trigger_key="cron:1"
    )
    assert occurrence.to_dict() == {
        "id": identity.occurrence_id,
        "jobId": "agenda-a",
        "jobRevision": 1,
        "idempotencyKey": identity.idempotency_key,
        "triggerKey": "cron:1",
        "scheduledFor": T0 + 5000,
        "availableAt": T0 + 5000,
        "status": "queued",
        "attempt": 0,
        "maxAttempts": 2,
        "fence": 0,
        "leaseOwner": None,
        "leaseExpiresAt": None,
        "authority": env.store.get_job("agenda-a").authority,  # type: ignore[union-attr]
        "payload": {"job": "agenda-a"},
        "lastError": None,
        "result": None,
        "createdAt": env.now,
        "updatedAt": env.now,
        "settledAt": None,
        "deduplicated": False,
    }
    assert list(occurrence.to_dict())[:-1] == OCCURRENCE_KEYS
    assert env.store.get_occurrence(occurrence.id) == occurrence.replace(deduplicated=None)
    [event] = env.events(occurrence.id)
    assert event["type"] == "occurrence_enqueued"
    assert event["data"] == {"jobRevision": 1, "scheduledFor": T0 + 5000, "triggerKey": "cron:1"}
    assert (event["ownerId"], event["fence"], event["occurredAt"]) == (None, None, env.now)


def test_stored_json_is_canonical(env: Env) -> None:
    occurrence = env.enqueue(payload={"b": 1.0, "a": [1, {"d": None, "c": 2.5}], "10": True, "2": -0.0})
    [(payload_json, authority_json)] = env.sql(
        "SELECT payload_json, authority_json FROM occurrences WHERE occurrence_id = ?", (occurrence.id,)
    )
    assert payload_json == '{"2":0,"10":true,"a":[1,{"c":2.5,"d":null}],"b":1}'
    [(job_authority,)] = env.sql("SELECT authority_json FROM jobs WHERE job_id = 'agenda-a'")
    assert authority_json == job_authority


def test_second_enqueue_of_the_same_identity_is_deduplicated(env: Env) -> None:
    first = env.enqueue(trigger_key="k", available_at=T0 + 9)
    env.tick()
    second = env.store.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="k")
    assert second.deduplicated is True
    assert second.replace(deduplicated=False) == first
    assert second.available_at == T0 + 9  # the stored row wins
    assert len(env.events(first.id)) == 1


def test_available_at_defaults_to_scheduled_for_and_none_means_absent(env: Env) -> None:
    assert env.enqueue(trigger_key="a", scheduled_for=T0 + 7).available_at == T0 + 7
    assert env.enqueue(trigger_key="b", scheduled_for=T0 + 7, available_at=None).available_at == T0 + 7
    assert env.enqueue(trigger_key="c", scheduled_for=T0 + 7, available_at=T0 + 1).available_at == T0 + 1


def test_omitted_payload_uses_the_job_payload_and_none_is_json_null(env: Env) -> None:
    assert env.enqueue(trigger_key="a").payload == {"job": "agenda-a"}
    explicit_null = env.enqueue(trigger_key="b", payload=None)
    assert explicit_null.payload is None
    assert env.sql("SELECT payload_json FROM occurrences WHERE occurrence_id = ?", (explicit_null.id,)) == [
        ("null",)
    ]


def test_identity_reused_with_another_payload_is_rejected(env: Env) -> None:
    env.enqueue(trigger_key="k", payload={"v": 1})
    before = env.dump()
    error = expect_error(
        "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH", lambda: env.enqueue(trigger_key="k", payload={"v": 2})
    )
    assert error.details == {"jobId": "agenda-a", "triggerKey": "k"}
    # the omitted payload is the job's payload, which differs too
    expect_error("SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH", lambda: env.enqueue(trigger_key="k"))
    assert env.dump() == before
    assert env.enqueue(trigger_key="k", payload={"v": 1}).deduplicated is True


def test_missing_and_disabled_jobs(env: Env) -> None:
    error = expect_error("SCHEDULER_NOT_FOUND", lambda: env.enqueue(job_id="nope"))
    assert error.message == "Scheduler job does not exist: nope"
    env.tick()
    env.store.update_job("agenda-a", 1, enabled=False)
    error = expect_error("SCHEDULER_JOB_DISABLED", lambda: env.enqueue())
    assert error.message == "Scheduler job is disabled: agenda-a"
    assert env.rows("occurrences") == []


def test_a_new_job_revision_gives_a_new_identity(env: Env) -> None:
    first = env.enqueue(trigger_key="k")
    env.tick()
    env.store.update_job("agenda-a", 1, payload={"v": 2})
    second = env.enqueue(trigger_key="k")
    assert second.id != first.id
    assert (second.job_revision, second.payload, second.deduplicated) == (2, {"v": 2}, False)


def test_once_per_trigger_returns_any_earlier_occurrence_without_comparing(env: Env) -> None:
    env.tick()
    first = env.store.enqueue_occurrence_once_per_trigger(
        job_id="agenda-a", scheduled_for=T0, trigger_key="once", payload={"v": 1}
    )
    assert first.deduplicated is False
    env.tick()
    again = env.store.enqueue_occurrence_once_per_trigger(
        job_id="agenda-a", scheduled_for=T0 + 99, trigger_key="once", payload={"v": 2}
    )
    assert again == first.replace(deduplicated=True)
    # an earlier occurrence is returned even when the job is now disabled
    env.tick()
    env.store.update_job("agenda-a", 1, enabled=False)
    env.tick()
    disabled = env.store.enqueue_occurrence_once_per_trigger(
        job_id="agenda-a", scheduled_for=T0, trigger_key="once"
    )
    assert disabled.id == first.id
    assert len(env.rows("occurrences")) == 1


def test_once_per_trigger_with_two_occurrences_is_data_corrupt(env: Env) -> None:
    env.enqueue(trigger_key="k")
    env.tick()
    env.store.update_job("agenda-a", 1, payload={"v": 2})
    env.enqueue(trigger_key="k")
    error = expect_error(
        "SCHEDULER_DATA_CORRUPT",
        lambda: env.store.enqueue_occurrence_once_per_trigger(
            job_id="agenda-a", scheduled_for=T0, trigger_key="k"
        ),
    )
    assert error.message == "Multiple occurrences exist for a unique job trigger"


def test_get_occurrence_and_list_by_trigger(env: Env) -> None:
    assert env.store.get_occurrence("occ_missing") is None
    made = [env.enqueue(trigger_key="k", scheduled_for=T0 + i) for i in range(4)]
    env.enqueue(trigger_key="other")
    listed = env.store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="k")
    assert [o.id for o in listed] == [o.id for o in made[:2]]
    assert all(o.deduplicated is None for o in listed)
    assert [
        o.id for o in env.store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="k", limit=10)
    ] == [o.id for o in made]
    assert len(env.store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="k", limit=0)) == 1
    assert len(env.store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="k", limit=-5)) == 1
    assert len(env.store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="k", limit=10**6)) == 4


def test_list_by_trigger_orders_by_created_at_then_id(env: Env) -> None:
    with env.store.transaction() as tx:  # one clock sample: equal created_at
        made = [
            tx.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0 + i, trigger_key="same")
            for i in range(5)
        ]
    listed = env.store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="same", limit=5)
    assert [o.id for o in listed] == sorted(o.id for o in made)


@pytest.mark.parametrize("limit", [True, 2.0, "2", None, 2**53])
def test_list_by_trigger_limit_must_be_an_int(env: Env, limit: Any) -> None:
    expect_error(
        INVALID,
        lambda: env.store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="k", limit=limit),
    )


def test_enqueue_many_runs_each_request_in_one_transaction(env: Env) -> None:
    env.job("routine-b", kind="routine")
    env.tick()
    results = env.store.enqueue_many(
        [
            {"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "m1"},
            {"job_id": "routine-b", "scheduled_for": T0, "trigger_key": "m1", "payload": None},
            {"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "m1"},
        ]
    )
    assert [o.deduplicated for o in results] == [False, False, True]
    assert results[2].id == results[0].id
    assert results[1].payload is None
    assert {o.created_at for o in results} == {env.now}
    assert len(env.rows("occurrences")) == 2
    assert env.store.enqueue_many([]) == []


def test_enqueue_many_failure_rolls_back_and_reports_the_index(env: Env) -> None:
    env.enqueue(trigger_key="taken", payload={"v": 1})
    before = env.dump()
    error = expect_error(
        "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH",
        lambda: env.store.enqueue_many(
            [
                {"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "new"},
                {"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "taken", "payload": {"v": 2}},
            ]
        ),
    )
    assert error.details == {"jobId": "agenda-a", "triggerKey": "taken", "index": 1}
    error = expect_error(
        "SCHEDULER_NOT_FOUND",
        lambda: env.store.enqueue_many([{"job_id": "nope", "scheduled_for": T0, "trigger_key": "x"}]),
    )
    assert error.details == {"index": 0}
    assert env.dump() == before


@pytest.mark.parametrize(
    ("requests", "details"),
    [
        (
            [{"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "ok"}, {"job_id": "agenda-a"}],
            {"index": 1},
        ),
        (
            [{"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "ok", "jobId": "x"}],
            {"fields": ["jobId"], "index": 0},
        ),
        ([{"job_id": "agenda-a", "scheduled_for": -1, "trigger_key": "ok"}], {"index": 0}),
        ([["agenda-a"]], {"index": 0}),
    ],
)
def test_enqueue_many_validates_every_item_first(env: Env, requests: Any, details: Any) -> None:
    reads = env.clock_reads
    before = env.dump()
    error = expect_error(INVALID, lambda: env.store.enqueue_many(requests))
    assert error.details == details
    assert env.clock_reads == reads
    assert env.dump() == before


def test_enqueue_many_requires_a_list(env: Env) -> None:
    expect_error(INVALID, lambda: env.store.enqueue_many({"job_id": "agenda-a"}))  # type: ignore[arg-type]
    expect_error(INVALID, lambda: env.store.enqueue_many(None))  # type: ignore[arg-type]


def test_enqueue_many_raises_the_first_failing_item_in_order(env: Env) -> None:
    env.job("disabled-b", enabled=False)
    env.enqueue(trigger_key="taken", payload={"v": 1})
    before = env.dump()
    requests: list[dict[str, Any]] = [
        {"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "fresh"},
        {"job_id": "disabled-b", "scheduled_for": T0, "trigger_key": "x"},
        {"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "taken", "payload": {"v": 2}},
        {"job_id": "missing", "scheduled_for": T0, "trigger_key": "x"},
    ]
    error = expect_error("SCHEDULER_JOB_DISABLED", lambda: env.store.enqueue_many(requests))
    assert error.details == {"index": 1}
    error = expect_error(
        "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH", lambda: env.store.enqueue_many(requests[2:])
    )
    assert error.details == {"jobId": "agenda-a", "triggerKey": "taken", "index": 0}
    duplicate = [
        {"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "dup", "payload": 1},
        {"job_id": "agenda-a", "scheduled_for": T0, "trigger_key": "dup", "payload": 2},
    ]
    error = expect_error("SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH", lambda: env.store.enqueue_many(duplicate))
    assert error.details == {"jobId": "agenda-a", "triggerKey": "dup", "index": 1}
    assert env.dump() == before


REQUEST = st.fixed_dictionaries(
    {
        "job_id": st.sampled_from(["agenda-a", "routine-b", "disabled-c", "missing"]),
        "scheduled_for": st.sampled_from([T0, T0 + 1]),
        "trigger_key": st.sampled_from(["k1", "k2"]),
    },
    optional={
        "payload": st.sampled_from([None, 1, {"v": 2}, {"job": "agenda-a"}]),
        "available_at": st.sampled_from([None, T0 + 5]),
    },
)


def outcome_of(call: Any) -> Any:
    try:
        return [o.to_dict() for o in call()]
    except SchedulerKernelError as error:
        return (error.code, error.details)


def test_enqueue_many_equals_successive_enqueues(place: StorePlace) -> None:
    @settings(
        max_examples=examples(place, 40),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(requests=st.lists(REQUEST, max_size=6))
    def batch_equals_successive(requests: list[dict[str, Any]]) -> None:
        with env_at(place.sibling("batch")) as batch, env_at(place.sibling("single")) as single:
            for environment in (batch, single):
                environment.job("agenda-a")
                environment.job("routine-b", kind="routine")
                environment.job("disabled-c", enabled=False)
                environment.enqueue("agenda-a", "k1", payload={"v": 2})
                environment.tick()
            got = outcome_of(lambda: batch.store.enqueue_many(requests))

            def sequential() -> list[Occurrence]:
                results = []
                with single.store.transaction() as tx:
                    for index, request in enumerate(requests):
                        try:
                            results.append(tx.enqueue_occurrence(**request))
                        except SchedulerKernelError as error:
                            error.details = {**(error.details or {}), "index": index}
                            raise
                return results

            assert got == outcome_of(sequential)
            assert batch.dump()["tables"] == single.dump()["tables"]

    batch_equals_successive()


@pytest.mark.parametrize("size", [150, 85])
def test_a_large_batch_equals_successive_enqueues(place: StorePlace, size: int) -> None:
    """Batches long enough to be written in multi-row chunks of every size (64, 16, 4, 1 rows
    where the backend writes them so): new identities, identities stored before the call, the
    same identity twice in the batch, in a shuffled order; then the same batch with one
    payload mismatch near its end, which leaves nothing written."""
    import random

    shuffle = random.Random(size).shuffle
    requests: list[dict[str, Any]] = [
        {"job_id": "agenda-a", "scheduled_for": T0 + n % 7, "trigger_key": f"k{n}", "payload": {"n": n}}
        for n in range(size)
    ]
    requests += [dict(requests[n]) for n in range(0, size, 9)]  # repeated within the batch
    shuffle(requests)
    with env_at(place.sibling("batch")) as batch, env_at(place.sibling("single")) as single:
        for environment in (batch, single):
            environment.job("agenda-a")
            for n in range(0, size, 5):  # stored before the call
                environment.enqueue("agenda-a", f"k{n}", scheduled_for=T0 + n % 7, payload={"n": n})
            environment.tick()
        got = outcome_of(lambda: batch.store.enqueue_many(requests))
        with single.store.transaction() as tx:
            expected = [tx.enqueue_occurrence(**request).to_dict() for request in requests]
        assert got == expected
        assert sum(1 for item in got if not item["deduplicated"]) == size - len(range(0, size, 5))
        assert batch.dump()["tables"] == single.dump()["tables"]
        before = batch.dump()
        spoiled = [*requests[:-1], {**requests[-1], "payload": "other"}]
        mismatch = "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH"
        error = expect_error(mismatch, lambda: batch.store.enqueue_many(spoiled))
        assert error.details is not None and error.details["index"] == len(requests) - 1
        assert batch.dump() == before
