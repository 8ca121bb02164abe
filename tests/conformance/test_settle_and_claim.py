"""settle_and_claim (one commit per worker cycle) and job_kind given as a sequence of kinds.

Every test runs on both backends (``place``). The equivalence property (one ``settle_and_claim``
leaves exactly what ``settle`` then ``claim_next`` leave in one ``transaction()`` block, on the
claim-equivalence harness's randomized states) is in ``test_claim_equivalence.py``.
API §5 Batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lifecycle_support import INVALID, T0, Env, env_at, expect_error, refused_claims
from store_places import StorePlace

from scheduler import SettledAndClaimed
from scheduler.store.capabilities import settlement


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


# ------------------------------------------------------------------ writes kept for later
# (On PostgreSQL the settle is sent with the claim's reads or runs again; the results are SQLite's:
# tests/backends/postgresql/test_kept_writes.py checks the statements.)


def test_a_retry_due_at_once_is_claimed_again_by_the_same_cycle(env: Env) -> None:
    """The settled row becomes due at ``now``: the claim must see the settlement (it is written
    before the claim reads), and takes the same occurrence again."""
    env.job(max_attempts=3)
    held = env.running()
    env.tick()
    cycle = env.store.settle_and_claim(
        occurrence_id=held.id, owner_id="w1", fence=held.fence, outcome="failed", lease_ms=5000
    )
    assert cycle.settled.status == "retry_wait"
    assert cycle.claimed is not None
    assert (cycle.claimed.id, cycle.claimed.fence, cycle.claimed.attempt) == (held.id, held.fence + 1, 2)
    assert env.store.get_occurrence(held.id).status == "running"


def test_a_later_retry_is_not_claimed_and_the_next_due_row_is(env: Env) -> None:
    env.job(max_attempts=3)
    held = env.running(trigger_key="t1")
    other = env.enqueue(trigger_key="t2")
    env.tick()
    cycle = env.store.settle_and_claim(
        occurrence_id=held.id,
        owner_id="w1",
        fence=held.fence,
        outcome="failed",
        retry_at=env.now + 60_000,
        lease_ms=5000,
    )
    assert cycle.settled.status == "retry_wait" and cycle.settled.available_at == env.now + 60_000
    assert cycle.claimed is not None and cycle.claimed.id == other.id
    assert env.store.get_occurrence(held.id).status == "retry_wait"
    types = [event.type for event in env.store.history(occurrence_id=held.id)]
    assert "occurrence_retry_scheduled" in types


def test_a_settlement_that_changes_no_row_is_refused_and_nothing_is_written(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count of a kept write is checked like a rowcount: a settle ``UPDATE`` that matches no
    row (its lease check skipped here, the fence wrong) is ``SCHEDULER_LEASE_LOST`` once the
    combined statement ran, and the claim and events sent with it are rolled back."""
    env.job()
    held = env.running(trigger_key="t1")
    env.enqueue(trigger_key="t2")
    env.tick()
    before = env.dump()
    monkeypatch.setattr(settlement, "_lease_held", lambda *_args: True)
    expect_error(
        "SCHEDULER_LEASE_LOST",
        lambda: env.store.settle_and_claim(
            occurrence_id=held.id, owner_id="w1", fence=held.fence + 7, outcome="succeeded", lease_ms=5000
        ),
    )
    assert env.dump() == before


def test_a_call_run_again_reads_the_injected_clock_once(env: Env) -> None:
    """The call read its clock once on SQLite; on PostgreSQL the call that runs again (the retry
    below is due at once after the cycle's first statement read the heads) keeps that sample,
    so the results and tables are the same as on SQLite."""
    env.job(max_attempts=3)
    held = env.running()
    env.tick()
    reads = env.clock_reads
    cycle = env.store.settle_and_claim(
        occurrence_id=held.id,
        owner_id="w1",
        fence=held.fence,
        outcome="failed",
        retry_at=env.now - 5,
        lease_ms=5000,
    )
    assert env.clock_reads == reads + 1
    assert cycle.settled.updated_at == env.now and cycle.claimed is not None
    assert (cycle.claimed.id, cycle.claimed.lease_expires_at) == (held.id, env.now + 5000)
