"""settle_and_claim (one commit per worker cycle) and job_kind given as a sequence of kinds.

The equivalence property runs on the claim-equivalence harness's randomized states: one
``settle_and_claim`` must leave exactly the database (and return exactly the records) that
``settle`` then ``claim_next`` leave inside one ``store.transaction()`` block, including when
either half fails (then nothing at all is written).

Every test runs on both backends (``place``) except that property, which uses the
claim-equivalence harness's raw SQLite states (``test_claim_equivalence``): SQLite only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from backends import SQLITE
from hypothesis import event as note
from hypothesis import given
from hypothesis import strategies as st
from lifecycle_support import INVALID, T0, Env, env_at, expect_error
from sqlalchemy.exc import IntegrityError
from store_places import StorePlace
from test_claim_equivalence import (
    EQUIVALENCE,
    FILTERS,
    LEASE,
    NOW,
    build_state,
    raw,
    snapshot,
    states_strategy,
)

from scheduler import SchedulerKernelError, SchedulerStore, SettledAndClaimed, open_store


@pytest.fixture
def env(place: StorePlace) -> Iterator[Env]:
    with env_at(place) as opened:
        yield opened


def test_settles_and_claims_the_next_occurrence_in_one_transaction(env: Env) -> None:
    env.job()
    first = env.running(trigger_key="t1", owner="w1")
    second = env.enqueue(trigger_key="t2")
    env.tick()
    reads = env.clock_reads
    outcome = env.store.settle_and_claim(
        occurrence_id=first.id,
        owner_id="w1",
        fence=first.fence,
        outcome="succeeded",
        result={"ok": 1},
        lease_ms=5000,
    )
    assert env.clock_reads == reads + 1  # one clock sample for both halves
    assert isinstance(outcome, SettledAndClaimed)
    assert outcome.settled.status == "succeeded" and outcome.settled.result == {"ok": 1}
    assert outcome.claimed is not None and outcome.claimed.id == second.id
    assert outcome.claimed.lease_owner == "w1" and outcome.claimed.lease_expires_at == env.now + 5000
    assert outcome.settled.settled_at == outcome.claimed.updated_at == env.now
    assert outcome.to_dict() == {"settled": outcome.settled.to_dict(), "claimed": outcome.claimed.to_dict()}
    assert env.store.get_occurrence(first.id) == outcome.settled
    assert env.store.get_occurrence(second.id) == outcome.claimed
    assert [event["type"] for event in env.events(second.id)][-1] == "occurrence_claimed"


def test_nothing_left_to_claim_returns_none(env: Env) -> None:
    env.job()
    held = env.running()
    outcome = env.store.settle_and_claim(
        occurrence_id=held.id,
        owner_id="w1",
        fence=held.fence,
        outcome="failed",
        retryable=False,
        lease_ms=1000,
    )
    assert outcome.settled.status == "dead_letter"
    assert outcome.claimed is None


@contextmanager
def refused_claims(env: Env) -> Iterator[None]:
    """A trigger that makes every claim UPDATE fail ('claim refused') while the block runs.

    SQLite: a TEMP trigger on the store's own connection (not part of the stored catalog).
    PostgreSQL: a trigger and its function in the store's schema, dropped afterwards.
    """
    if env.place.backend == SQLITE:
        dbapi: Any = env.store.connection.connection.dbapi_connection
        dbapi.execute(
            "CREATE TEMP TRIGGER refuse_claim BEFORE UPDATE OF lease_owner ON main.occurrences "
            "WHEN NEW.lease_owner IS NOT NULL BEGIN SELECT RAISE(ABORT, 'claim refused'); END"
        )
        try:
            yield
        finally:
            dbapi.execute("DROP TRIGGER refuse_claim")
        return
    env.sql(
        "CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql "
        "AS $$ BEGIN RAISE EXCEPTION 'claim refused'; END $$"
    )
    env.sql(
        "CREATE TRIGGER refuse_claim BEFORE UPDATE OF lease_owner ON occurrences FOR EACH ROW "
        "WHEN (NEW.lease_owner IS NOT NULL) EXECUTE FUNCTION refuse_claim()"
    )
    try:
        yield
    finally:
        env.sql("DROP TRIGGER refuse_claim ON occurrences")
        env.sql("DROP FUNCTION refuse_claim()")


def test_a_failed_claim_half_writes_nothing(env: Env) -> None:
    env.job()
    held = env.running(trigger_key="t1")
    other = env.enqueue(trigger_key="t2")
    before = env.dump()
    with refused_claims(env), pytest.raises(Exception, match="claim refused"):
        env.store.settle_and_claim(
            occurrence_id=held.id, owner_id="w1", fence=held.fence, outcome="succeeded", lease_ms=1000
        )
    assert env.dump() == before
    # The lease is still held: the same call now succeeds.
    outcome = env.store.settle_and_claim(
        occurrence_id=held.id, owner_id="w1", fence=held.fence, outcome="succeeded", lease_ms=1000
    )
    assert outcome.claimed is not None and outcome.claimed.id == other.id


def test_a_lost_lease_writes_nothing_and_claims_nothing(env: Env) -> None:
    env.job()
    held = env.running(trigger_key="t1")
    env.enqueue(trigger_key="t2")
    before = env.dump()
    expect_error(
        "SCHEDULER_LEASE_LOST",
        lambda: env.store.settle_and_claim(
            occurrence_id=held.id, owner_id="w1", fence=held.fence + 1, outcome="succeeded", lease_ms=1000
        ),
    )
    assert env.dump() == before


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lease_ms": 0}, "leaseMs must be a positive integer"),
        ({"lease_ms": None}, "leaseMs must be a positive integer"),
        ({"job_kind": []}, "jobKind must be a job kind or a non-empty list of job kinds"),
        ({"job_kind": ["agenda", ""]}, "jobKind is not a valid identifier"),
        ({"job_kind": [["agenda"]]}, "jobKind must be a string"),
        ({"job_kind": b"agenda"}, "jobKind must be a string"),
        ({"job_kind": {"agenda"}}, "jobKind must be a string"),
        ({"workspace_id": ""}, "workspaceId is not a valid identifier"),
        ({"outcome": "done"}, "outcome must be succeeded or failed"),
        ({"fence": 0}, "fence must be a positive integer"),
    ],
)
def test_both_halves_are_validated_before_anything_is_read(
    env: Env, overrides: dict[str, Any], message: str
) -> None:
    env.job()
    held = env.running()
    before = env.dump()
    reads = env.clock_reads
    arguments: dict[str, Any] = {
        "occurrence_id": held.id,
        "owner_id": "w1",
        "fence": held.fence,
        "outcome": "succeeded",
        "lease_ms": 1000,
        **overrides,
    }
    error = expect_error(INVALID, lambda: env.store.settle_and_claim(**arguments))
    assert error.message == message
    assert env.clock_reads == reads
    assert env.dump() == before


@pytest.mark.parametrize("method", ["claim_next", "claim_batch"])
@pytest.mark.parametrize("bad", [[], (), [""], ["agenda", 5], [["agenda"]], b"agenda", {"agenda": 1}])
def test_a_bad_job_kind_sequence_is_invalid(env: Env, method: str, bad: Any) -> None:
    env.job()
    env.enqueue()
    extra = {"limit": 2} if method == "claim_batch" else {}
    expect_error(
        INVALID, lambda: getattr(env.store, method)(owner_id="w", lease_ms=1000, job_kind=bad, **extra)
    )
    assert (
        env.store.get_occurrence(
            env.store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="t1")[0].id
        ).status
        == "queued"
    )  # type: ignore[union-attr]


def test_job_kind_sequence_takes_any_of_the_kinds_in_the_seed_order(env: Env) -> None:
    env.job("agenda-a", kind="agenda")
    env.job("cron-a", kind="cowork-cron")
    env.job("loop-a", kind="loop-iteration")
    loop = env.enqueue("loop-a", "t1", scheduled_for=T0)
    cron = env.enqueue("cron-a", "t1", scheduled_for=T0 + 1)
    agenda = env.enqueue("agenda-a", "t1", scheduled_for=T0 + 2)
    env.tick()
    kinds = ("agenda", "cowork-cron", "agenda")
    claimed = env.store.claim_batch(owner_id="w", lease_ms=1000, limit=5, job_kind=list(kinds))
    assert [item.id for item in claimed] == [cron.id, agenda.id]
    assert env.store.claim_next(owner_id="w", lease_ms=1000, job_kind=("loop-iteration",)).id == loop.id  # type: ignore[union-attr]


# ------------------------------------------------------------------ equivalence with the two calls


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SchedulerStore, Any]]:
    path = tmp_path_factory.mktemp("settle_and_claim") / "pair.sqlite"
    store = open_store(path, clock=lambda: NOW)
    db = raw(path)
    try:
        yield store, db
    finally:
        db.close()
        store.close()


def _outcome(call: Any) -> Any:
    try:
        return call()
    except SchedulerKernelError as error:
        return ("error", error.code)
    except IntegrityError:  # a state the seed's own statements also refuse (see the seed harness)
        return ("error", "constraint")


SETTLEMENTS = st.fixed_dictionaries(
    {
        "outcome": st.sampled_from(["succeeded", "failed"]),
        "retryable": st.booleans(),
        "retry_at": st.sampled_from([None, NOW - 5, NOW + 500]),
        "owner_id": st.sampled_from(["w-old", "w-old", "w-other"]),
        "fence_offset": st.sampled_from([0, 0, 0, 1]),
        "held": st.sampled_from([True, True, True, False]),
        "spare": st.booleans(),
    }
)


@EQUIVALENCE
@given(state=states_strategy, filters=FILTERS, pick=st.integers(0, 20), settlement=SETTLEMENTS)
def test_settle_and_claim_equals_settle_then_claim_next(
    pair: Any, state: Any, filters: tuple[Any, str | None], pick: int, settlement: dict[str, Any]
) -> None:
    store, db = pair
    jobs, occurrences = state
    index = pick % len(occurrences)
    target = occurrences[index]
    if settlement["held"]:  # make the target a live lease of "w-old" (the states' lease owner)
        target = replace(
            target, status="running", lease_expires_at=NOW + 1000, attempt=max(1, target.attempt)
        )
        occurrences = [*occurrences[:index], target, *occurrences[index + 1 :]]
    if settlement["spare"]:  # a plainly claimable occurrence, so the claim half often has work
        spare = replace(
            target, occurrence_id="occ_spare", status="queued", available_at=NOW - 1000, attempt=0
        )
        occurrences = [*occurrences, replace(spare, control=None, retry=None, job=0)]
    build_state(db, jobs, occurrences)
    job_kind, workspace_id = filters
    settle_arguments = {
        "occurrence_id": target.occurrence_id,
        "owner_id": settlement["owner_id"],
        "fence": target.fence + settlement["fence_offset"],
        "outcome": settlement["outcome"],
        "retryable": settlement["retryable"],
        "retry_at": settlement["retry_at"],
    }
    claim_arguments = {"lease_ms": LEASE, "job_kind": job_kind, "workspace_id": workspace_id}

    def two_calls() -> Any:
        with store.transaction() as tx:
            settled = tx.settle(**settle_arguments)
            claimed = tx.claim_next(owner_id=settlement["owner_id"], **claim_arguments)
        return SettledAndClaimed(settled=settled, claimed=claimed)

    expected = (_outcome(two_calls), snapshot(db))
    build_state(db, jobs, occurrences)
    actual = (_outcome(lambda: store.settle_and_claim(**settle_arguments, **claim_arguments)), snapshot(db))
    note("error" if isinstance(expected[0], tuple) else "claimed" if expected[0].claimed else "settled only")
    assert actual == expected
