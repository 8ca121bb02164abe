"""Every lifecycle method rejects bad arguments with SCHEDULER_INVALID_ARGUMENT and writes nothing.

A hypothesis property: take a valid call (one that would write), replace one argument by a wrong
type, an out-of-range number, a malformed identifier or a non-JSON value, and check the error
code, that the database dump is unchanged and that the clock was never read. The exception is an
enqueue payload: the seed validates it inside the transaction, once the job is known (the clock
has been read by then; still nothing is written). Runs on both backends (``place``).
API §5 (argument validation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lifecycle_support import INVALID, T0, Env
from store_places import StorePlace, examples

from scheduler import SchedulerKernelError

MAX_SAFE = 2**53 - 1
CONTROL_CHARACTERS = [chr(code) for code in range(32)] + ["\x7f"]


def cycle() -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    value["self"] = value
    return value


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def wrong_types(*, none: bool = True) -> st.SearchStrategy[Any]:
    options: list[st.SearchStrategy[Any]] = [
        st.booleans(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.binary(max_size=3),
        st.lists(st.integers(), max_size=2),
        st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
        st.tuples(st.integers()),
    ]
    if none:
        options.append(st.none())
    return st.one_of(*options)


def bad_identifier(max_length: int = 256, *, none: bool = True) -> st.SearchStrategy[Any]:
    return st.one_of(
        wrong_types(none=none),
        st.integers(),
        st.sampled_from(["", " ", "\t\n ", "\ufeff", "\u3000\u00a0"]),
        st.builds(
            lambda a, c, b: a + c + b,
            st.text("ab", min_size=1, max_size=3),
            st.sampled_from(CONTROL_CHARACTERS),
            st.text("ab", min_size=1, max_size=3),
        ),
        st.integers(max_length + 1, max_length + 40).map(lambda n: "a" * n),
        st.just("\U0001f600" * (max_length // 2 + 1)),
    )


def bad_epoch(*, none: bool = True) -> st.SearchStrategy[Any]:
    return st.one_of(
        wrong_types(none=none),
        st.text(max_size=3),
        st.integers(max_value=-1),
        st.integers(min_value=MAX_SAFE + 1),
    )


def bad_positive(*, none: bool = True, maximum: int = MAX_SAFE) -> st.SearchStrategy[Any]:
    return st.one_of(
        wrong_types(none=none),
        st.text(max_size=3),
        st.integers(max_value=0),
        st.integers(min_value=maximum + 1),
    )


BAD_JSON = st.sampled_from(
    [
        float("nan"),
        float("inf"),
        -float("inf"),
        {1: "non-str key"},
        {"a": {1, 2}},
        (1, 2),
        b"bytes",
        2**53,
        -(2**53),
        {"deep": nested(70)},
        [object()],
    ]
).map(lambda value: value) | st.builds(cycle)
BAD_OUTCOME = st.one_of(
    st.text(max_size=12).filter(lambda text: text not in ("succeeded", "failed")),
    st.sampled_from(["Succeeded", "failed ", "SUCCEEDED"]),
    wrong_types(),
    st.integers(),
)
BAD_LEASE = bad_positive(maximum=86_400_000)
BAD_HISTORY_LIMIT = bad_positive()
BAD_TRIGGER_LIMIT = st.one_of(wrong_types(), st.text(max_size=3), st.integers(min_value=MAX_SAFE + 1))
BAD_BATCH_LIMIT = bad_positive(maximum=1000)
BAD_CYCLE_LIMIT = st.one_of(
    wrong_types(), st.text(max_size=3), st.integers(max_value=-1), st.integers(min_value=1001)
)
BAD_BOOLEAN = st.one_of(
    st.integers(), st.none(), st.text(max_size=2), st.floats(), st.lists(st.booleans(), max_size=1)
)


class Fixture:
    """A store with a job, a queued and a running occurrence: a valid call would write."""

    def __init__(self, env: Env) -> None:
        self.env = env
        env.job("agenda-a")
        self.queued = env.enqueue(trigger_key="queued")
        self.running = env.running(trigger_key="running")


ENQUEUE = {
    "job_id": bad_identifier(),
    "scheduled_for": bad_epoch(),
    "trigger_key": bad_identifier(),
    "available_at": bad_epoch(none=False),
    "payload": BAD_JSON,
}


def method_table(fx: Fixture) -> dict[str, tuple[Callable[..., Any], dict[str, Any], dict[str, Any]]]:
    """name -> (callable taking kwargs, valid kwargs, {parameter: invalid strategy})."""
    store = fx.env.store
    running = {"occurrence_id": fx.running.id, "owner_id": "w1", "fence": fx.running.fence}
    enqueue = {"job_id": "agenda-a", "scheduled_for": T0 + 7, "trigger_key": "fresh"}
    return {
        "enqueue_occurrence": (store.enqueue_occurrence, enqueue, ENQUEUE),
        "enqueue_occurrence_once_per_trigger": (store.enqueue_occurrence_once_per_trigger, enqueue, ENQUEUE),
        "get_occurrence": (
            lambda **kw: store.get_occurrence(kw["occurrence_id"]),
            {"occurrence_id": fx.queued.id},
            {"occurrence_id": bad_identifier()},
        ),
        "list_occurrences_by_trigger": (
            store.list_occurrences_by_trigger,
            {"job_id": "agenda-a", "trigger_key": "queued", "limit": 5},
            {"job_id": bad_identifier(), "trigger_key": bad_identifier(), "limit": BAD_TRIGGER_LIMIT},
        ),
        "claim_next": (
            store.claim_next,
            {"owner_id": "w2", "lease_ms": 1000, "job_kind": "agenda", "workspace_id": "ws-main"},
            {
                "owner_id": bad_identifier(),
                "lease_ms": BAD_LEASE,
                "job_kind": bad_identifier(128, none=False),
                "workspace_id": bad_identifier(256, none=False),
            },
        ),
        "claim_batch": (
            store.claim_batch,
            {"owner_id": "w2", "lease_ms": 1000, "limit": 3},
            {
                "owner_id": bad_identifier(),
                "lease_ms": BAD_LEASE,
                "limit": BAD_BATCH_LIMIT,
                "job_kind": bad_identifier(128, none=False),
                "workspace_id": bad_identifier(256, none=False),
            },
        ),
        "settle_many_and_claim": (
            store.settle_many_and_claim,
            {
                "settlements": [{**running, "outcome": "succeeded"}],
                "owner_id": "w2",
                "lease_ms": 1000,
                "limit": 3,
            },
            {
                "owner_id": bad_identifier(),
                "lease_ms": BAD_LEASE,
                "limit": BAD_CYCLE_LIMIT,
                "job_kind": bad_identifier(128, none=False),
                "workspace_id": bad_identifier(256, none=False),
            },
        ),
        "claim_occurrence": (
            store.claim_occurrence,
            {"occurrence_id": fx.queued.id, "owner_id": "w2", "lease_ms": 1000},
            {"occurrence_id": bad_identifier(), "owner_id": bad_identifier(), "lease_ms": BAD_LEASE},
        ),
        "renew": (
            store.renew,
            {**running, "lease_ms": 120_000},
            {
                "occurrence_id": bad_identifier(),
                "owner_id": bad_identifier(),
                "fence": bad_positive(),
                "lease_ms": BAD_LEASE,
            },
        ),
        "settle_succeeded": (
            store.settle,
            {**running, "outcome": "succeeded"},
            {
                "occurrence_id": bad_identifier(),
                "owner_id": bad_identifier(),
                "fence": bad_positive(),
                "outcome": BAD_OUTCOME,
                "retryable": BAD_BOOLEAN,
                "result": BAD_JSON,
                "adjudication_request_id": bad_identifier(128, none=False),
            },
        ),
        "settle_failed": (
            store.settle,
            {**running, "outcome": "failed"},
            {
                "retryable": BAD_BOOLEAN,
                "error": BAD_JSON,
                "retry_at": bad_epoch(none=False),
                "adjudication_request_id": bad_identifier(128, none=False),
            },
        ),
        "history": (
            store.history,
            {"occurrence_id": fx.queued.id, "job_id": "agenda-a", "limit": 5},
            {
                "occurrence_id": bad_identifier(none=False),
                "job_id": bad_identifier(none=False),
                "limit": BAD_HISTORY_LIMIT,
            },
        ),
        "list_dead_letters": (
            store.list_dead_letters,
            {"job_id": "agenda-a", "limit": 5},
            {"job_id": bad_identifier(none=False), "limit": BAD_HISTORY_LIMIT},
        ),
    }


@pytest.fixture
def fixture(place: StorePlace) -> Iterator[Fixture]:
    env = Env(place)
    try:
        yield Fixture(env)
    finally:
        env.store.close()


def assert_rejected(
    fx: Fixture, call: Callable[[], Any], *, clock_may_be_read: bool = False
) -> SchedulerKernelError:
    before = fx.env.dump()
    reads = fx.env.clock_reads
    with pytest.raises(SchedulerKernelError) as caught:
        call()
    assert caught.value.code == INVALID, (caught.value.code, caught.value.message)
    assert clock_may_be_read or fx.env.clock_reads == reads
    assert fx.env.dump() == before
    return caught.value


def property_settings(fixture: Fixture) -> settings:
    """400 examples on SQLite (fewer on PostgreSQL: ``store_places.examples``)."""
    return settings(
        max_examples=examples(fixture.env.place, 400),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def test_one_bad_argument_is_rejected_without_writing(fixture: Fixture) -> None:
    @property_settings(fixture)
    @given(data=st.data())
    def one_bad_argument(data: st.DataObject) -> None:
        one_bad_argument_is_rejected(fixture, data)

    one_bad_argument()


def one_bad_argument_is_rejected(fixture: Fixture, data: st.DataObject) -> None:
    table = method_table(fixture)
    name = data.draw(st.sampled_from(sorted(table)), label="method")
    call, valid, invalid = table[name]
    parameter = data.draw(st.sampled_from(sorted(invalid)), label="parameter")
    value = data.draw(invalid[parameter], label="value")
    assert_rejected(
        fixture, lambda: call(**{**valid, parameter: value}), clock_may_be_read=parameter == "payload"
    )


def bad_enqueue_item(data: st.DataObject) -> tuple[Any, dict[str, Any] | None, bool]:
    """(item, extra details expected, validated inside the transaction) for one invalid item."""
    kind = data.draw(st.sampled_from(["field", "unknown", "not-a-dict"]), label="item kind")
    valid = {"job_id": "agenda-a", "scheduled_for": T0 + 9, "trigger_key": "batch-bad"}
    if kind == "not-a-dict":
        item = data.draw(st.one_of(st.none(), st.integers(), st.lists(st.text(max_size=2), max_size=2)))
        return item, None, False
    if kind == "unknown":
        key = data.draw(st.sampled_from(["jobId", "scheduledFor", "extra", "availableAt"]))
        return {**valid, key: 1}, {"fields": [key]}, False
    field = data.draw(st.sampled_from(sorted(ENQUEUE)), label="field")
    return {**valid, field: data.draw(ENQUEUE[field], label="value")}, None, field == "payload"


def test_one_bad_batch_item_is_rejected_with_its_index(fixture: Fixture) -> None:
    @property_settings(fixture)
    @given(data=st.data())
    def one_bad_item(data: st.DataObject) -> None:
        one_bad_batch_item_is_rejected(fixture, data)

    one_bad_item()


def one_bad_batch_item_is_rejected(fixture: Fixture, data: st.DataObject) -> None:
    store = fixture.env.store
    valid_count = data.draw(st.integers(0, 3), label="valid items")
    index = data.draw(st.integers(0, valid_count), label="bad index")
    if data.draw(st.booleans(), label="settlements"):
        good: list[Any] = [
            {"occurrence_id": fixture.running.id, "owner_id": "w1", "fence": 1, "outcome": "succeeded"}
            for _ in range(valid_count)
        ]
        parameter = data.draw(st.sampled_from(["fence", "outcome", "occurrence_id", "retryable", "result"]))
        strategies = {
            "fence": bad_positive(),
            "outcome": BAD_OUTCOME,
            "occurrence_id": bad_identifier(),
            "retryable": BAD_BOOLEAN,
            "result": BAD_JSON,
        }
        bad: Any = (
            {**good[0], parameter: data.draw(strategies[parameter])}
            if good
            else {
                "occurrence_id": fixture.running.id,
                "owner_id": "w1",
                "fence": 1,
                "outcome": "succeeded",
                parameter: data.draw(strategies[parameter]),
            }
        )
        extra, in_transaction = None, False
        call: Callable[[list[Any]], Any] = (
            store.settle_many
            if data.draw(st.booleans(), label="without claims")
            else lambda items: store.settle_many_and_claim(items, owner_id="w2", lease_ms=1000, limit=2)
        )
    else:
        good = [
            {"job_id": "agenda-a", "scheduled_for": T0 + i, "trigger_key": f"batch-{i}"}
            for i in range(valid_count)
        ]
        bad, extra, in_transaction = bad_enqueue_item(data)
        call = store.enqueue_many
    items = [*good[:index], bad, *good[index:]]
    error = assert_rejected(fixture, lambda: call(items), clock_may_be_read=in_transaction)
    assert isinstance(error.details, dict)
    assert error.details["index"] == index
    if extra:
        assert {key: error.details[key] for key in extra} == extra


@pytest.mark.parametrize("requests", [None, "x", {"job_id": "agenda-a"}, 5])
def test_batches_must_be_lists(fixture: Fixture, requests: Any) -> None:
    assert_rejected(fixture, lambda: fixture.env.store.enqueue_many(requests))
    assert_rejected(fixture, lambda: fixture.env.store.settle_many(requests))
    assert_rejected(
        fixture,
        lambda: fixture.env.store.settle_many_and_claim(requests, owner_id="w", lease_ms=1000, limit=1),
    )


def test_unknown_keywords_are_pythons_type_error(fixture: Fixture) -> None:
    store = fixture.env.store
    with pytest.raises(TypeError):
        store.claim_next(owner_id="w", lease_ms=1000, jobKind="agenda")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        store.enqueue_occurrence(job_id="agenda-a", scheduled_for=T0, trigger_key="k", extra=1)  # type: ignore[call-arg]


def test_validation_precedes_the_closed_check(place: StorePlace) -> None:
    env = Env(place)
    env.store.close()
    with pytest.raises(SchedulerKernelError) as caught:
        env.store.claim_next(owner_id="", lease_ms=1000)
    assert caught.value.code == INVALID
    with pytest.raises(SchedulerKernelError) as caught:
        env.store.claim_next(owner_id="w", lease_ms=1000)
    assert caught.value.code == "SCHEDULER_STORE_CLOSED"
    with pytest.raises(SchedulerKernelError) as caught:
        env.store.enqueue_many([{"job_id": "a", "scheduled_for": T0, "trigger_key": "k"}])
    assert caught.value.code == "SCHEDULER_STORE_CLOSED"
