"""``release_lease``: a worker hands back an occurrence it holds but will not finish (shutdown).

Fenced like ``renew``/``settle``; the occurrence goes back to ``queued``, claimable at once, and
the attempt the claim counted is given back (unless the next claim will not count one: a resumed
run). Every test runs on both backends (``place``); the async API on its three drivers.
API §9 (shutdown: release_lease).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backends import PostgresServer
from lifecycle_support import INVALID, Env, env_at, expect_error
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool
from store_places import PostgresSchemaPlace, SqliteFilePlace, StorePlace

from scheduler import SchedulerStore
from scheduler.aio import open_async_store
from tests.reliability.invariants import assert_invariants

LEASE = 60_000
LOST = "SCHEDULER_LEASE_LOST"


@pytest.fixture
def env(place: StorePlace) -> Iterator[Env]:
    with env_at(place) as environment:
        environment.job("agenda-a", max_attempts=2)
        yield environment


def replays(env: Env) -> None:
    """Every history, releases included, replays to the rows it left (tests/reliability's model)."""
    assert_invariants(env.dump()["tables"], "after the releases")


def release(env: Env, occurrence: Any, **overrides: Any) -> Any:
    arguments = {
        "occurrence_id": occurrence.id,
        "owner_id": occurrence.lease_owner,
        "fence": occurrence.fence,
    }
    arguments.update(overrides)
    env.tick()
    return env.store.release_lease(**arguments)


def test_release_gives_the_occurrence_back_at_once_without_consuming_the_attempt(env: Env) -> None:
    first = env.running()
    retried = env.fail(first)
    assert (retried.status, retried.attempt) == ("retry_wait", 1)
    env.set(retried.available_at)
    final = env.claim(first.id)  # attempt 2 of 2: the lease a stopping worker used to leave behind
    assert (final.attempt, final.fence) == (2, 2)
    released = release(env, final)
    assert (released.status, released.attempt, released.fence) == ("queued", 1, 2)
    assert (released.lease_owner, released.lease_expires_at, released.settled_at) == (None, None, None)
    assert released.available_at == retried.available_at and released.updated_at == env.now
    assert env.store.get_occurrence(first.id) == released
    event = env.events(first.id)[-1]
    assert (event["type"], event["ownerId"], event["fence"]) == ("occurrence_released", "w1", 2)
    assert event["data"] == {"attempt": 1, "maxAttempts": 2, "attemptReturned": True}
    # another worker takes it at once, on the attempt the released claim had
    taken = env.store.claim_next(owner_id="w2", lease_ms=LEASE)
    assert taken is not None and (taken.id, taken.attempt, taken.fence) == (first.id, 2, 3)
    assert env.events(first.id)[-1]["data"]["previousStatus"] == "queued"
    replays(env)


def test_a_wrong_owner_fence_or_expired_lease_is_lease_lost_and_writes_nothing(env: Env) -> None:
    occurrence = env.running(lease_ms=10_000)
    before = env.dump()
    for owner, fence in (("w2", 1), ("w1", 2)):
        expect_error(LOST, lambda o=owner, f=fence: release(env, occurrence, owner_id=o, fence=f))
    expect_error(LOST, lambda: release(env, occurrence, occurrence_id="occ_missing"))
    env.set(occurrence.lease_expires_at)  # type: ignore[arg-type]
    expect_error(LOST, lambda: env.store.release_lease(occurrence_id=occurrence.id, owner_id="w1", fence=1))
    assert env.dump() == before
    settled = env.store.claim_next(owner_id="w2", lease_ms=LEASE)  # reclaimed after expiry, as always
    assert settled is not None and settled.fence == 2
    env.succeed(settled)
    before = env.dump()
    expect_error(LOST, lambda: release(env, settled))  # settled: nothing held any more
    assert env.dump() == before


@pytest.mark.parametrize(
    "arguments",
    [
        {"occurrence_id": ""},
        {"occurrence_id": 7},
        {"owner_id": None},
        {"fence": 0},
        {"fence": True},
        {"fence": "1"},
    ],
)
def test_bad_arguments_are_refused_before_anything_is_read(env: Env, arguments: dict[str, Any]) -> None:
    occurrence = env.running()
    before, reads = env.dump(), env.clock_reads
    call = {"occurrence_id": occurrence.id, "owner_id": "w1", "fence": 1, **arguments}
    expect_error(INVALID, lambda: env.store.release_lease(**call))
    assert env.dump() == before and env.clock_reads == reads


def test_a_requeued_run_released_is_claimable_again(env: Env) -> None:
    """A requeued dead letter's claim consumed its requeue request without counting an attempt:
    released at ``attempt == max_attempts`` it would never be claimable again."""
    occurrence = env.running()
    dead = env.fail(occurrence, retryable=False)
    assert (dead.status, dead.attempt) == ("dead_letter", 1)
    env.store.requeue_dead_letter(
        occurrence_id=dead.id, expected_fence=1, expected_error_code="execution_failed", request_id="rq-1"
    )
    env.tick()
    rerun = env.claim(dead.id)
    assert (rerun.attempt, rerun.fence) == (1, 2)
    released = release(env, rerun)
    assert (released.status, released.attempt) == ("queued", 0)
    again = env.store.claim_next(owner_id="w2", lease_ms=LEASE)
    assert again is not None and (again.id, again.attempt) == (dead.id, 1)
    replays(env)


PAUSABLE = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint"]}


def pause_requested(env: Env, occurrence: Any) -> Any:
    env.tick()
    return env.store.request_occurrence_pause(
        occurrence_id=occurrence.id,
        expected_fence=occurrence.fence,
        request_id="pause-1",
        capability=PAUSABLE,
    )


def test_a_resumed_run_keeps_its_attempt_and_its_control(env: Env) -> None:
    """The next claim of a resumed run does not count an attempt: the release gives none back."""
    occurrence = env.running()
    control = pause_requested(env, occurrence)
    env.tick()
    paused = env.store.ack_occurrence_pause(
        occurrence_id=occurrence.id,
        owner_id="w1",
        fence=1,
        request_id="pause-1",
        expected_revision=control.revision,
        safe_point="adapter_checkpoint",
        checkpoint={"step": 7},
    )
    env.tick()
    env.store.resume_occurrence(
        occurrence_id=occurrence.id, expected_revision=paused.control.revision, request_id="resume-1"
    )
    env.tick()
    resumed = env.store.claim_next(owner_id="w2", lease_ms=LEASE)
    assert resumed is not None and (resumed.attempt, resumed.fence) == (1, 2)
    released = release(env, resumed)
    assert (released.status, released.attempt) == ("queued", 1)
    assert env.events(occurrence.id)[-1]["data"] == {"attempt": 1, "maxAttempts": 2, "attemptReturned": False}
    again = env.store.claim_next(owner_id="w3", lease_ms=LEASE)
    assert again is not None and (again.attempt, again.fence) == (1, 3)
    after = env.store.get_occurrence_control(occurrence.id)
    assert after is not None and (after.state, after.expected_fence) == ("resumed", 3)
    assert after.checkpoint["data"] == {"step": 7}
    replays(env)


def test_a_pending_pause_request_is_refused_and_nothing_is_written(env: Env) -> None:
    """A queued occurrence with a pending pause could never be claimed again; the lease is left to
    expire (the reclaim does not count an attempt and the sweep skips it)."""
    occurrence = env.running()
    pause_requested(env, occurrence)
    before = env.dump()
    error = expect_error("SCHEDULER_OCCURRENCE_CONTROL_CONFLICT", lambda: release(env, occurrence))
    assert error.details == {"state": "pause_requested"}
    assert env.dump() == before
    replays(env)


def test_release_inside_a_transaction_block_commits_or_rolls_back_with_it(env: Env) -> None:
    occurrence = env.running()
    env.tick()
    with pytest.raises(RuntimeError), env.store.transaction() as tx:
        tx.release_lease(occurrence_id=occurrence.id, owner_id="w1", fence=1)
        raise RuntimeError("roll the block back")
    assert env.store.get_occurrence(occurrence.id).status == "running"  # type: ignore[union-attr]
    with env.store.transaction() as tx:
        released = tx.release_lease(occurrence_id=occurrence.id, owner_id="w1", fence=1)
        assert tx.get_occurrence(occurrence.id) == released
    assert env.store.get_occurrence(occurrence.id).status == "queued"  # type: ignore[union-attr]
    replays(env)


def _engine_and_schema(place: StorePlace) -> tuple[Any, str | None]:
    if isinstance(place, SqliteFilePlace):
        return create_engine(f"sqlite:///{place.path}", poolclass=NullPool), None
    assert isinstance(place, PostgresSchemaPlace)
    return create_engine(place.server.url, poolclass=NullPool), place.schema


def test_release_on_a_callers_connection_is_part_of_its_transaction(env: Env) -> None:
    occurrence = env.running()
    engine, schema = _engine_and_schema(env.place)
    try:
        for commit in (False, True):
            with engine.connect() as connection:
                transaction = connection.begin()
                outbox = SchedulerStore.on_connection(connection, clock=lambda: env.now, schema=schema)
                released = outbox.release_lease(occurrence_id=occurrence.id, owner_id="w1", fence=1)
                assert released.status == "queued"
                transaction.commit() if commit else transaction.rollback()
            expected = "queued" if commit else "running"
            assert env.store.get_occurrence(occurrence.id).status == expected  # type: ignore[union-attr]
    finally:
        engine.dispose()


ASYNC_DRIVERS = [
    pytest.param("aiosqlite", id="aiosqlite"),
    pytest.param("asyncpg", id="asyncpg", marks=pytest.mark.postgresql),
    pytest.param("psycopg", id="psycopg_async", marks=pytest.mark.postgresql),
]


@pytest.mark.parametrize("driver", ASYNC_DRIVERS)
def test_the_async_store_releases_with_the_same_result_and_errors(
    driver: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server: PostgresServer | None = None
    schema = None
    if driver != "aiosqlite":
        server = request.getfixturevalue("postgres_server")
        schema = request.getfixturevalue("pg_schema")

    async def body() -> tuple[Any, str]:
        if server is None:
            store = await open_async_store(tmp_path / "aio.sqlite")
        else:
            url = server.url.set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)
            store = await open_async_store(url, schema=schema)
        async with store:
            await store.create_job(id="job", kind="job", authority={"principal": {"type": "s", "id": "x"}})
            await store.enqueue_occurrence(job_id="job", scheduled_for=0, trigger_key="k")
            claimed = await store.claim_next(owner_id="w1", lease_ms=LEASE)
            assert claimed is not None
            released = await store.release_lease(occurrence_id=claimed.id, owner_id="w1", fence=claimed.fence)
            try:
                await store.release_lease(occurrence_id=claimed.id, owner_id="w1", fence=claimed.fence)
            except Exception as error:
                code = getattr(error, "code", repr(error))
            return released, code

    released, code = asyncio.run(body())
    assert (released.status, released.attempt, released.lease_owner) == ("queued", 0, None)
    assert code == LOST
