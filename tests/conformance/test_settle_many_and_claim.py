"""settle_many_and_claim: a batched worker's settlements and claims in one commit.

Every test runs on both backends (``place``). The central property: one ``settle_many_and_claim``
returns exactly the records and leaves exactly the rows that ``settle_many`` then ``claim_batch``
return and leave inside one ``transaction()`` block of a twin store (the same calls, clock and
uuids), including when a settlement fails (then nothing at all is written). The same on the
claim-equivalence harness's randomized states: ``test_claim_equivalence.py``.
API §5 Batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastpath_support import Clock
from lifecycle_support import (
    AUTHORITY,
    INVALID,
    T0,
    Env,
    env_at,
    expect_error,
    refused_claims,
    settlement,
)
from store_places import StorePlace

from scheduler import SchedulerKernelError, SchedulerStore, SettledManyAndClaimed
from scheduler.contract.constants import MAX_SAFE_INTEGER

LEASE = 60_000
LOST = "SCHEDULER_LEASE_LOST"
OTHER_WORKSPACE = {"principal": {"type": "service", "id": "billing"}, "workspaceId": "ws-billing"}


@pytest.fixture
def env(place: StorePlace) -> Iterator[Env]:
    with env_at(place) as opened:
        yield opened


def held(env: Env, count: int, owner: str = "w1", lease_ms: int = LEASE) -> list[Any]:
    """``count`` occurrences of ``agenda-a`` claimed by ``owner``."""
    return [
        env.running(trigger_key=f"held-{owner}-{n}", owner=owner, lease_ms=lease_ms) for n in range(count)
    ]


# ------------------------------------------------------------------ = settle_many + claim_batch


def build(env: Env) -> list[Any]:
    """Two kinds in two workspaces, queued work, four leases of ``w1`` and an expired final
    attempt (the claims' sweep dead-letters it); returns the four leases."""
    env.job("agenda-a", max_attempts=3)
    env.job("mail-b", kind="mail", authority=OTHER_WORKSPACE, max_attempts=1)
    leases = held(env, 4)
    env.running("mail-b", "expiring", lease_ms=1000)
    for n in range(5):
        env.enqueue("agenda-a", f"queued-{n}", scheduled_for=T0 + n % 2)
        env.enqueue("mail-b", f"mail-{n}", scheduled_for=T0 + n % 3)
    env.tick(5000)
    return leases


def as_data(call: Callable[[], SettledManyAndClaimed]) -> Any:
    try:
        return ("ok", call().to_dict())
    except SchedulerKernelError as error:
        return ("error", error.code, error.details)


def one_block(
    store: SchedulerStore, settlements: list[dict[str, Any]], **claims: Any
) -> SettledManyAndClaimed:
    """What ``settle_many_and_claim`` stands for: the two calls in one ``transaction()`` block."""
    with store.transaction() as tx:
        settled = tx.settle_many(settlements) if settlements else []
        claimed = tx.claim_batch(**claims) if claims["limit"] else []
    return SettledManyAndClaimed(settled=settled, claimed=claimed)


def test_equals_settle_many_then_claim_batch_in_one_transaction(place: StorePlace) -> None:
    twins = place.sibling("cycle"), place.sibling("block")
    with (
        env_at(twins[0], uuid_factory=Clock().uuid) as cycle,
        env_at(twins[1], uuid_factory=Clock().uuid) as block,
    ):
        leases = build(cycle)
        assert [lease.to_dict() for lease in build(block)] == [lease.to_dict() for lease in leases]
        assert cycle.dump() == block.dump()
        first, second, third, fourth = leases
        cycles: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
            # a stale fence at index 2: nothing is written, on either side
            (
                [settlement(first), settlement(second), settlement(third, fence=third.fence + 1)],
                {"limit": 4},
            ),
            # another owner's lease (index 0)
            ([settlement(first, owner_id="w2")], {"limit": 2}),
            # the same settlement twice: the second finds the lease gone (index 1)
            ([settlement(first), settlement(first)], {"limit": 1}),
            # every outcome; the retry due at once is claimed again by the same call
            (
                [
                    settlement(first, result={"ok": 1}),
                    settlement(second, "failed", error={"code": "E", "message": "again"}),
                    settlement(third, "failed", retry_at=T0 + 10**6),
                    settlement(fourth, "failed", retryable=False),
                ],
                {"limit": 20, "job_kind": ["agenda", "mail"]},
            ),
            # claims only, filtered by workspace
            ([], {"limit": 10, "workspace_id": "ws-billing"}),
            # claims only, by kind: what is left
            ([], {"limit": 1000, "job_kind": "agenda"}),
        ]
        for number, (settlements, claims) in enumerate(cycles):
            claims = {"owner_id": "w1", "lease_ms": LEASE, **claims}
            got = twin_calls(cycle, block, settlements, claims)
            assert got[0] == ("error" if number < 3 else "ok"), number
            if number < 3:  # the failing settlement's position
                assert got[1:] == (LOST, {"index": [2, 0, 1][number]}), number
            if number == 3:  # settle what this cycle claimed, claiming nothing more
                assert second.id in [item["id"] for item in got[1]["claimed"]]
                settlements = [
                    {
                        "occurrence_id": item["id"],
                        "owner_id": "w1",
                        "fence": item["fence"],
                        "outcome": "succeeded",
                    }
                    for item in got[1]["claimed"]
                ]
                got = twin_calls(cycle, block, settlements, {"owner_id": "w1", "lease_ms": LEASE, "limit": 0})
                assert len(got[1]["settled"]) == len(settlements) and got[1]["claimed"] == []


def twin_calls(cycle: Env, block: Env, settlements: list[dict[str, Any]], claims: dict[str, Any]) -> Any:
    """The cycle on one twin, the block on the other: the same results and rows; then both clocks move."""
    got = as_data(lambda: cycle.store.settle_many_and_claim(settlements, **claims))
    assert got == as_data(lambda: one_block(block.store, settlements, **claims))
    assert cycle.dump() == block.dump()
    cycle.tick(100)
    block.tick(100)
    return got


def test_settles_in_input_order_then_claims_in_the_seed_order(env: Env) -> None:
    env.job()
    leases = held(env, 3)
    queued = [env.enqueue(trigger_key=f"q{n}", scheduled_for=T0 + 10 - n) for n in range(4)]
    env.tick()
    reads = env.clock_reads
    order = [leases[2], leases[0], leases[1]]
    cycle = env.store.settle_many_and_claim(
        [settlement(lease, result={"n": n}) for n, lease in enumerate(order)],
        owner_id="w9",
        lease_ms=5000,
        limit=3,
    )
    assert env.clock_reads == reads + 1  # one clock sample for both halves
    assert isinstance(cycle, SettledManyAndClaimed)
    assert [(o.id, o.status, o.result) for o in cycle.settled] == [
        (lease.id, "succeeded", {"n": n}) for n, lease in enumerate(order)
    ]
    assert [o.id for o in cycle.claimed] == [queued[3].id, queued[2].id, queued[1].id]
    assert {(o.lease_owner, o.lease_expires_at, o.updated_at) for o in cycle.claimed} == {
        ("w9", env.now + 5000, env.now)
    }
    assert {o.settled_at for o in cycle.settled} == {env.now}
    assert cycle.to_dict() == {
        "settled": [o.to_dict() for o in cycle.settled],
        "claimed": [o.to_dict() for o in cycle.claimed],
    }
    for occurrence in [*cycle.settled, *cycle.claimed]:
        assert env.store.get_occurrence(occurrence.id) == occurrence


# ------------------------------------------------------------------ all or nothing


def test_a_lease_lost_in_the_middle_writes_nothing(env: Env) -> None:
    env.job()
    first = env.running(trigger_key="first", lease_ms=LEASE)
    middle = env.running(trigger_key="middle", lease_ms=1000)
    last = env.running(trigger_key="last", lease_ms=LEASE)
    env.enqueue(trigger_key="next")
    env.tick(5000)
    leases = [first, middle, last]
    before = env.dump()
    for reclaimed in (False, True):  # the middle lease expired, then another worker took it
        if reclaimed:
            assert env.store.claim_occurrence(occurrence_id=middle.id, owner_id="w2", lease_ms=LEASE)
            before = env.dump()
        error = expect_error(
            LOST,
            lambda: env.store.settle_many_and_claim(
                [settlement(lease) for lease in leases], owner_id="w1", lease_ms=LEASE, limit=5
            ),
        )
        assert error.details == {"index": 1}
        assert env.dump() == before
    # The other leases are still held: the call without the lost one goes through.
    cycle = env.store.settle_many_and_claim(
        [settlement(first), settlement(last)], owner_id="w1", lease_ms=LEASE, limit=5
    )
    assert [o.status for o in cycle.settled] == ["succeeded", "succeeded"]
    assert [o.id for o in cycle.claimed] == [
        env.store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="next")[0].id
    ]


@pytest.mark.parametrize(
    "change",
    [
        {"fence": 1},  # an older fence
        {"fence": 99},
        {"owner_id": "w2"},
        {"occurrence_id": "occ_missing"},
    ],
)
def test_a_stale_fence_or_owner_writes_nothing(env: Env, change: dict[str, Any]) -> None:
    env.job(max_attempts=3)
    first, second = held(env, 2)
    env.fail(second)  # retry due now: claimed again at fence 2
    second = env.claim(second.id)
    assert second.fence == 2
    env.enqueue(trigger_key="next")
    before = env.dump()
    reads = env.clock_reads
    error = expect_error(
        LOST,
        lambda: env.store.settle_many_and_claim(
            [settlement(first), settlement(second, **change)], owner_id="w1", lease_ms=LEASE, limit=2
        ),
    )
    assert error.details == {"index": 1}
    assert env.clock_reads == reads + 1
    assert env.dump() == before


def test_a_failed_claim_half_writes_nothing(env: Env) -> None:
    env.job()
    leases = held(env, 2)
    env.enqueue(trigger_key="next")
    before = env.dump()
    with refused_claims(env), pytest.raises(Exception, match="claim refused"):
        env.store.settle_many_and_claim(
            [settlement(lease) for lease in leases], owner_id="w1", lease_ms=LEASE, limit=1
        )
    assert env.dump() == before


def test_an_unrepresentable_lease_is_refused_before_any_lease_is_judged(env: Env) -> None:
    env.job()
    (lease,) = held(env, 1, lease_ms=86_400_000)
    env.set(MAX_SAFE_INTEGER - 10)  # the lease has expired by now
    before = env.dump()
    error = expect_error(
        INVALID,
        lambda: env.store.settle_many_and_claim([settlement(lease)], owner_id="w", lease_ms=11, limit=1),
    )
    assert error.message == "lease expiry exceeds the safe integer range"
    assert env.dump() == before
    error = expect_error(
        LOST, lambda: env.store.settle_many_and_claim([settlement(lease)], owner_id="w", lease_ms=10, limit=1)
    )
    assert error.details == {"index": 0}
    error = expect_error(
        LOST, lambda: env.store.settle_many_and_claim([settlement(lease)], owner_id="w", lease_ms=11, limit=0)
    )  # no claim, no lease to grant
    assert env.dump() == before


def test_inside_a_transaction_block_it_commits_or_rolls_back_with_the_block(env: Env) -> None:
    env.job()
    (lease,) = held(env, 1)
    env.enqueue(trigger_key="next")
    before = env.dump()
    with pytest.raises(RuntimeError), env.store.transaction() as tx:
        cycle = tx.settle_many_and_claim([settlement(lease)], owner_id="w1", lease_ms=LEASE, limit=1)
        assert len(cycle.settled) == len(cycle.claimed) == 1
        raise RuntimeError("roll back")
    assert env.dump() == before
    with env.store.transaction() as tx:
        cycle = tx.settle_many_and_claim([settlement(lease)], owner_id="w1", lease_ms=LEASE, limit=1)
    assert env.store.get_occurrence(lease.id) == cycle.settled[0]
    assert env.store.get_occurrence(cycle.claimed[0].id) == cycle.claimed[0]


# ------------------------------------------------------------------ the edges


def test_limit_0_settles_and_neither_claims_nor_sweeps(env: Env) -> None:
    env.job(max_attempts=1)
    (lease,) = held(env, 1)
    expiring = env.running(trigger_key="expiring", lease_ms=1000)
    env.enqueue(trigger_key="queued")
    env.tick(2000)
    cycle = env.store.settle_many_and_claim([settlement(lease)], owner_id="w1", lease_ms=LEASE, limit=0)
    assert [o.status for o in cycle.settled] == ["succeeded"] and cycle.claimed == []
    still = env.store.get_occurrence(expiring.id)
    assert still is not None and (still.status, still.lease_owner) == ("running", "w1")
    assert [
        o.status for o in env.store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="queued")
    ] == ["queued"]


def test_no_settlements_is_claim_batch(place: StorePlace) -> None:
    def setup(env: Env) -> None:
        env.job(max_attempts=1)
        env.running(trigger_key="expiring", lease_ms=1000)
        for n in range(4):
            env.enqueue(trigger_key=f"q{n}", scheduled_for=T0 + n)
        env.tick(2000)

    with env_at(place.sibling("cycle")) as cycle, env_at(place.sibling("batch")) as batch:
        setup(cycle)
        setup(batch)
        got = cycle.store.settle_many_and_claim(
            [], owner_id="w", lease_ms=LEASE, limit=3, job_kind=("agenda",)
        )
        assert got.settled == []
        assert got.claimed == batch.store.claim_batch(
            owner_id="w", lease_ms=LEASE, limit=3, job_kind=("agenda",)
        )
        assert cycle.dump() == batch.dump()


def test_nothing_to_do_reads_nothing_but_needs_an_open_store(env: Env) -> None:
    env.job()
    before, reads = env.dump(), env.clock_reads
    assert env.store.settle_many_and_claim(
        [], owner_id="w", lease_ms=LEASE, limit=0
    ) == SettledManyAndClaimed(settled=[], claimed=[])
    assert (env.dump(), env.clock_reads) == (before, reads)
    env.store.close()
    expect_error(
        "SCHEDULER_STORE_CLOSED",
        lambda: env.store.settle_many_and_claim([], owner_id="w", lease_ms=1, limit=0),
    )
    expect_error(INVALID, lambda: env.store.settle_many_and_claim([], owner_id="w", lease_ms=1, limit=-1))


# ------------------------------------------------------------------ validation


GOOD = {"owner_id": "w1", "lease_ms": LEASE, "limit": 2}


@pytest.mark.parametrize(
    ("settlements", "claims", "message", "details"),
    [
        (None, {}, "settlements must be a list", None),
        ("abc", {}, "settlements must be a list", None),
        ({"a": 1}, {}, "settlements must be a list", None),
        ([0, "bad"], {}, "settlement must be a dict", {"index": 1}),
        ([0, {"outcome": "done"}], {}, "outcome must be succeeded or failed", {"index": 1}),
        ([0, {"fence": 0}], {}, "fence must be a positive integer", {"index": 1}),
        ([0, {"owner_id": ""}], {}, "ownerId is not a valid identifier", {"index": 1}),
        ([0, {"result": float("nan")}], {}, "result contains a non-finite number", {"index": 1}),
        (
            [0, {"outcome": "failed", "retry_at": -1}],
            {},
            "retryAt must be a non-negative safe-integer epoch ms",
            {"index": 1},
        ),
        (
            [0, {"jobKind": "x"}],
            {},
            "settlement contains unknown fields",
            {"fields": ["jobKind"], "index": 1},
        ),
        ([0], {"owner_id": ""}, "ownerId is not a valid identifier", None),
        ([0], {"owner_id": None}, "ownerId must be a string", None),
        ([0], {"lease_ms": 0}, "leaseMs must be a positive integer", None),
        ([0], {"lease_ms": 86_400_001}, "leaseMs must not exceed 86400000", None),
        ([0], {"limit": -1}, "limit must be an integer between 0 and 1000", None),
        ([0], {"limit": 1001}, "limit must be an integer between 0 and 1000", None),
        ([0], {"limit": True}, "limit must be an integer between 0 and 1000", None),
        ([0], {"limit": 1.0}, "limit must be an integer between 0 and 1000", None),
        ([0], {"limit": None}, "limit must be an integer between 0 and 1000", None),
        ([0], {"job_kind": []}, "jobKind must be a job kind or a non-empty list of job kinds", None),
        ([0], {"job_kind": ["agenda", ""]}, "jobKind is not a valid identifier", None),
        ([0], {"workspace_id": ""}, "workspaceId is not a valid identifier", None),
        ([], {"lease_ms": None}, "leaseMs must be a positive integer", None),
    ],
)
def test_every_argument_is_validated_before_anything_is_read(
    env: Env, settlements: Any, claims: dict[str, Any], message: str, details: Any
) -> None:
    env.job()
    first, second = held(env, 2)
    env.enqueue(trigger_key="next")
    valid = [settlement(first), settlement(second)]
    if isinstance(settlements, list):  # 0: the first valid settlement; a dict: changes to the second
        settlements = [
            valid[0] if item == 0 else {**valid[1], **item} if isinstance(item, dict) else item
            for item in settlements
        ]
    before = env.dump()
    reads = env.clock_reads
    error = expect_error(INVALID, lambda: env.store.settle_many_and_claim(settlements, **{**GOOD, **claims}))
    assert error.message == message
    assert error.details == details
    assert env.clock_reads == reads
    assert env.dump() == before
    env.store.close()  # validated before the store is looked at
    expect_error(INVALID, lambda: env.store.settle_many_and_claim(settlements, **{**GOOD, **claims}))


def test_job_kind_and_workspace_filter_the_claims(env: Env) -> None:
    env.job("agenda-a", kind="agenda")
    env.job("mail-b", kind="mail", authority={**AUTHORITY, "workspaceId": "ws-other"})
    (lease,) = held(env, 1)
    mail = env.enqueue("mail-b", "m1")
    agenda = env.enqueue("agenda-a", "a1")
    env.tick()
    by_kind = env.store.settle_many_and_claim([], owner_id="w", lease_ms=LEASE, limit=5, job_kind="agenda")
    assert [o.id for o in by_kind.claimed] == [agenda.id]
    by_workspace = env.store.settle_many_and_claim(
        [settlement(lease)], owner_id="w", lease_ms=LEASE, limit=5, workspace_id="ws-main"
    )
    assert by_workspace.claimed == [] and by_workspace.settled[0].status == "succeeded"
    other = env.store.settle_many_and_claim(
        [], owner_id="w", lease_ms=LEASE, limit=5, job_kind=["mail", "agenda"], workspace_id="ws-other"
    )
    assert [o.id for o in other.claimed] == [mail.id]
