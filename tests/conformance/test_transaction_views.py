"""Stale and misused transaction() views (issue 15, item 2).

A view kept after its block raises SCHEDULER_STORE_CLOSED (reason "transaction_finished") and
writes nothing; the outer store called (or closed) inside its own block on the same thread raises
SCHEDULER_TRANSACTION_ACTIVE; another thread calling the outer store during a block waits for it.
The property test drives every public store method through a stale view and the outer store.
Every test runs on both backends (``place``).
API §5 Transactions and embedding.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hardening_support import AUTHORITY, T0, expect_code
from sqlalchemy import create_engine
from store_places import PostgresSchemaPlace, StorePlace

from scheduler import SchedulerKernelError, SchedulerStore

CLOSED = "SCHEDULER_STORE_CLOSED"
ACTIVE = "SCHEDULER_TRANSACTION_ACTIVE"


def counts(place: StorePlace) -> tuple[int, int]:
    occurrences = place.sql("SELECT count(*) FROM occurrences")[0][0]
    events = place.sql("SELECT count(*) FROM events")[0][0]
    return occurrences, events


def new_store(place: StorePlace) -> SchedulerStore:
    """A v6 store with one job ``job-a`` and a fixed clock."""
    store = place.open(clock=lambda: T0)
    store.create_job(id="job-a", kind="agenda", authority=AUTHORITY)
    return store


def enqueue(store: SchedulerStore, key: str) -> Any:
    return store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key=key)


@pytest.mark.parametrize("block_outcome", ["committed", "rolled_back"])
def test_a_view_used_after_its_block_writes_nothing(place: StorePlace, block_outcome: str) -> None:
    store = new_store(place)
    kept: list[SchedulerStore] = []
    try:
        with store.transaction() as tx:
            kept.append(tx)
            enqueue(tx, "inside")
            if block_outcome == "rolled_back":
                raise RuntimeError("the application gives up")
    except RuntimeError:
        pass
    before = counts(place)
    error = expect_code(CLOSED, lambda: enqueue(kept[0], "late"))
    assert error.details == {"reason": "transaction_finished"}
    expect_code(CLOSED, lambda: kept[0].get_job("job-a"))
    assert kept[0].closed
    assert counts(place) == before
    # the write lock is free: another store writes at once, and this store keeps working
    other = place.open(clock=lambda: T0, busy_timeout_ms=0)
    assert enqueue(other, "other").deduplicated is False
    other.close()
    assert enqueue(store, "after").deduplicated is False
    store.close()
    occurrences, _ = counts(place)
    assert occurrences == before[0] + 2  # nothing acknowledged was lost at close()


def test_the_outer_store_inside_its_own_block_is_refused(place: StorePlace) -> None:
    store = new_store(place)
    with store.transaction() as tx:
        enqueue(tx, "kept")
        expect_code(ACTIVE, lambda: enqueue(store, "outer"))
        expect_code(ACTIVE, lambda: store.get_job("job-a"))
        expect_code(ACTIVE, lambda: store.enqueue_many([]))
        with pytest.raises(SchedulerKernelError) as nested, store.transaction():
            pass
        assert nested.value.code == ACTIVE
        expect_code(ACTIVE, store.close)
        assert not store.closed
        enqueue(tx, "kept-too")  # the block itself is unharmed
    keys = place.sql("SELECT trigger_key FROM occurrences ORDER BY trigger_key")
    assert keys == [("kept",), ("kept-too",)]
    assert enqueue(store, "after").deduplicated is False
    store.close()


def test_a_nested_block_on_the_view_is_a_savepoint(place: StorePlace) -> None:
    store = new_store(place)
    with store.transaction() as tx:
        enqueue(tx, "outer")
        with pytest.raises(RuntimeError), tx.transaction() as inner:
            enqueue(inner, "inner")
            expect_code(ACTIVE, lambda: enqueue(tx, "middle"))
            raise RuntimeError("roll the inner block back")
        expect_code(CLOSED, lambda: enqueue(inner, "late"))
    assert place.sql("SELECT trigger_key FROM occurrences") == [("outer",)]
    store.close()


def test_another_thread_waits_for_the_block(place: StorePlace) -> None:
    """The other thread's write is serialized after the block: it survives the block's rollback."""
    store = new_store(place)
    results: list[Any] = []
    other = threading.Thread(target=lambda: results.append(enqueue(store, "other-thread")))
    with pytest.raises(RuntimeError), store.transaction() as tx:
        enqueue(tx, "block")
        other.start()
        time.sleep(0.2)  # the other thread is now waiting for the store
        assert results == []
        raise RuntimeError("roll the block back")
    other.join(10)
    assert len(results) == 1 and results[0].deduplicated is False
    assert place.sql("SELECT trigger_key FROM occurrences") == [("other-thread",)]
    store.close()


def test_on_connection_views_follow_the_same_rules(place: StorePlace) -> None:
    new_store(place).close()
    if isinstance(place, PostgresSchemaPlace):
        engine, schema = place.server.engine, place.schema
    else:
        engine, schema = create_engine(f"sqlite:///{place.path}"), "main"
    try:
        with engine.begin() as connection:
            store = SchedulerStore.on_connection(connection, clock=lambda: T0, schema=schema)
            with store.transaction() as tx:
                enqueue(tx, "in-block")
                expect_code(ACTIVE, lambda: enqueue(store, "outer"))
            expect_code(CLOSED, lambda: enqueue(tx, "late"))
            enqueue(store, "after")
    finally:
        engine.dispose()
    assert place.sql("SELECT trigger_key FROM occurrences ORDER BY 1") == [("after",), ("in-block",)]


def _public_methods() -> list[str]:
    return sorted(
        name
        for name, member in inspect.getmembers(SchedulerStore, inspect.isfunction)
        if not name.startswith("_") and name not in {"close", "on_connection", "transaction"}
    )


def _arguments_for(method: Callable[..., Any]) -> tuple[list[Any], dict[str, Any]]:
    """Plausible arguments: enough for the call to reach the store's lifecycle check."""
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    samples: dict[str, Any] = {
        "job_id": "job-a",
        "kind": "agenda",
        "authority": AUTHORITY,
        "principal": AUTHORITY["principal"],
        "requests": [{"job_id": "job-a", "scheduled_for": T0, "trigger_key": "k"}],
        "settlements": [{"occurrence_id": "o" * 64, "owner_id": "w", "fence": 1, "outcome": "succeeded"}],
        "sources": [],
        "plan": {"entries": []},
        "safe_point": "adapter_checkpoint",
        "decision": "confirmed_applied",
        "domain": "agenda",
        "source_scope": {"store": "agent-schedule"},
        "capability": {
            "pauseResume": "checkpoint_v1",
            "safePoints": ["adapter_checkpoint"],
            "schemaVersion": 1,
        },
        "restore_source": lambda *_: None,
        "capabilities": ["calendar.read"],
        "outcome": "succeeded",
        "window_ms": 86_400_000,
    }
    if method.__name__ == "update_job":
        keywords["kind"] = "agenda-2"
    for parameter in list(inspect.signature(method).parameters.values())[1:]:
        if parameter.default is not inspect.Parameter.empty and parameter.name != "capability":
            continue
        value = samples.get(parameter.name, _default_sample(parameter.name))
        if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            positional.append(value)
        else:
            keywords[parameter.name] = value
    return positional, keywords


def _default_sample(name: str) -> Any:
    if name.endswith(("_ms", "fence", "revision", "attempt", "units", "limit", "max_runs", "max_units")):
        return 1000 if name.endswith("_ms") else 1
    if name == "scheduled_for":
        return T0
    if name.endswith("digest"):
        return "sha256:" + "ab" * 32
    return "x-" + name


@pytest.mark.parametrize("name", _public_methods())
def test_every_method_of_a_stale_view_and_of_the_busy_outer_store(place: StorePlace, name: str) -> None:
    """Whatever the method: the stale view and the busy outer store refuse it, writing nothing."""
    store = new_store(place)
    args, kwargs = _arguments_for(getattr(SchedulerStore, name))
    # prepare_domain_migration validates a whole plan before anything else; an empty plan is
    # enough to show it refuses, not enough to reach the lifecycle check
    expected = "SCHEDULER_INVALID_ARGUMENT" if name == "prepare_domain_migration" else None
    with store.transaction() as tx:
        with pytest.raises(SchedulerKernelError) as busy:
            getattr(store, name)(*args, **kwargs)
        assert busy.value.code == (expected or ACTIVE), busy.value
    before = counts(place)
    with pytest.raises(SchedulerKernelError) as stale:
        getattr(tx, name)(*args, **kwargs)
    assert stale.value.code == (expected or CLOSED), stale.value
    assert counts(place) == before
    store.close()
