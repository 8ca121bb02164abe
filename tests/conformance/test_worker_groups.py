"""commit_group: a batched worker's group as ONE store write call
(``scheduler.store.capabilities.worker_groups``, internal to ``scheduler.worker``).

Every test runs on both backends (``place``). A group settles its members, claims for the free
lanes (the worker's claim steps: its kinds, or a Tasks worker's queues in order with caps) and
reads the claimed runs' job kinds and controls in one transaction with one clock sample and no
savepoint; it writes what ``settle_many_and_claim`` writes; it is all or nothing, and a failure
says whether it arose in the settlements (then with the member's ``details["index"]``) or not.
Statements are counted on the store's own connection (SQLAlchemy's ``before_cursor_execute``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastpath_support import Clock
from lifecycle_support import T0, Env, env_at, settlement
from sqlalchemy import Connection, event
from store_places import StorePlace

from scheduler import SchedulerKernelError
from scheduler.store.capabilities.worker_groups import (
    CommittedGroup,
    GroupClaims,
    GroupFailure,
    commit_group,
    group_claims,
)
from scheduler.store.capabilities.worker_reads import OccurrenceRuntime

LEASE = 60_000
LOST = "SCHEDULER_LEASE_LOST"
INVALID = "SCHEDULER_INVALID_ARGUMENT"


@pytest.fixture
def env(place: StorePlace) -> Iterator[Env]:
    with env_at(place) as opened:
        yield opened


def held(env: Env, count: int, job_id: str = "agenda-a", owner: str = "w1") -> list[Any]:
    return [env.running(job_id, f"held-{job_id}-{owner}-{n}", owner=owner) for n in range(count)]


def agenda(owner: str = "w1") -> GroupClaims:
    return group_claims(owner, LEASE, [("agenda", None)])


def committed(done: CommittedGroup | GroupFailure) -> CommittedGroup:
    assert isinstance(done, CommittedGroup), done
    return done


def failed(done: CommittedGroup | GroupFailure) -> GroupFailure:
    assert isinstance(done, GroupFailure), done
    return done


def test_a_group_writes_what_settle_many_and_claim_writes_and_reads_the_runtimes(place: StorePlace) -> None:
    twins = place.sibling("group"), place.sibling("call")
    with (
        env_at(twins[0], uuid_factory=Clock().uuid) as group,
        env_at(twins[1], uuid_factory=Clock().uuid) as call,
    ):
        for env in (group, call):
            env.job("agenda-a", max_attempts=3)
            env.running("agenda-a", "expiring", owner="gone", lease_ms=1000)  # the claims reclaim it
            for n in range(4):
                env.enqueue("agenda-a", f"queued-{n}", scheduled_for=T0 + n % 2)
        leases = held(group, 3)
        assert [lease.to_dict() for lease in held(call, 3)] == [lease.to_dict() for lease in leases]
        for env in (group, call):
            env.tick(5000)
        settlements = [
            settlement(leases[0], result={"ok": 1}),
            settlement(leases[1], "failed", error={"code": "E", "message": "again"}),  # due at once
            settlement(leases[2], "failed", retryable=False),
        ]
        reads = group.clock_reads
        done = committed(commit_group(group.store, settlements, agenda(), 4))
        assert group.clock_reads == reads + 1  # one clock sample for the whole group
        expected = call.store.settle_many_and_claim(settlements, owner_id="w1", lease_ms=LEASE, limit=4)
        assert [record.to_dict() for record in done.settled] == [
            record.to_dict() for record in expected.settled
        ]
        assert [record.to_dict() for record in done.claimed] == [
            record.to_dict() for record in expected.claimed
        ]
        assert len(done.claimed) == 4
        assert group.dump() == call.dump()
        assert done.runtimes == {
            record.id: OccurrenceRuntime(occurrence_id=record.id, job_kind="agenda", control=None)
            for record in done.claimed
        }


def test_a_lease_lost_in_the_middle_writes_nothing_and_names_its_member(env: Env) -> None:
    env.job(max_attempts=3)
    leases = held(env, 3)
    env.enqueue(trigger_key="next")
    env.store.release_lease(occurrence_id=leases[1].id, owner_id="w1", fence=leases[1].fence)  # lost to w1
    before = env.dump()
    settlements = [settlement(lease) for lease in leases]
    failure = failed(commit_group(env.store, settlements, agenda(), 2))
    assert (failure.error.code, failure.error.details, failure.in_settlements) == (LOST, {"index": 1}, True)
    assert env.dump() == before  # nothing written: no settlement, no claim, no event
    done = committed(commit_group(env.store, [settlements[0], settlements[2]], agenda(), 2))
    assert [record.status for record in done.settled] == ["succeeded", "succeeded"]
    assert {record.id for record in done.claimed} == {
        leases[1].id,
        env.store.list_occurrences_by_trigger(job_id="agenda-a", trigger_key="next")[0].id,
    }
    second = env.store.get_occurrence(leases[1].id)
    assert second is not None and (second.status, second.fence) == ("running", leases[1].fence + 1)


def test_a_claim_failure_is_told_from_the_settlements_and_the_group_settles_alone(env: Env) -> None:
    env.job()
    (lease,) = held(env, 1)
    corrupt = env.enqueue(trigger_key="corrupt")
    env.sql(  # a stored row the claim cannot map (SCHEDULER_DATA_CORRUPT)
        "UPDATE occurrences SET authority_json = '{\"x\":1}' WHERE occurrence_id = ?", (corrupt.id,)
    )
    before = env.dump()
    failure = failed(commit_group(env.store, [settlement(lease)], agenda(), 1))
    assert failure.error.code == "SCHEDULER_DATA_CORRUPT" and failure.in_settlements is False
    assert env.dump() == before
    done = committed(commit_group(env.store, [settlement(lease)], agenda(), 0))
    assert [record.status for record in done.settled] == ["succeeded"] and done.claimed == []


def test_a_bad_settlement_is_refused_with_its_index_before_anything_is_read(env: Env) -> None:
    env.job()
    leases = held(env, 2)
    before = env.dump()
    failure = failed(
        commit_group(env.store, [settlement(leases[0]), settlement(leases[1], "maybe")], agenda(), 1)
    )
    assert (failure.error.code, failure.error.details["index"], failure.in_settlements) == (INVALID, 1, True)
    failure = failed(commit_group(env.store, [settlement(leases[0])], agenda(), 1001))
    assert (failure.error.code, failure.in_settlements) == (INVALID, False)
    assert env.dump() == before


def test_a_closed_store_is_store_closed(env: Env) -> None:
    env.job()
    (lease,) = held(env, 1)
    env.store.close()
    for settlements, limit in (([settlement(lease)], 1), ([], 0)):
        assert (
            failed(commit_group(env.store, settlements, agenda(), limit)).error.code
            == "SCHEDULER_STORE_CLOSED"
        )


def test_claim_steps_take_the_queues_in_order_and_a_capped_queue_up_to_its_room(env: Env) -> None:
    for kind in ("first", "capped", "last"):
        env.job(kind, kind=kind)
    held(env, 1, "capped", owner="other")  # one live lease of the capped queue already
    for n in range(3):
        for kind in ("last", "capped", "first"):
            env.enqueue(kind, f"{kind}-{n}")
    steps = group_claims("w1", LEASE, [("first", None), ("capped", 2), ("last", None)])
    done = committed(commit_group(env.store, [], steps, 6))
    kinds = [done.runtimes[record.id].job_kind for record in done.claimed]
    assert kinds == ["first", "first", "first", "capped", "last", "last"]
    done = committed(commit_group(env.store, [], steps, 6))  # the capped queue is full now
    assert [done.runtimes[record.id].job_kind for record in done.claimed] == ["last"]


def test_claim_steps_are_validated_once() -> None:
    bad: list[Any] = [[], [("a", 0)], [(("a", "b"), 2)], [("", None)], [(["a"], 100_001)]]
    for steps in bad:
        with pytest.raises(SchedulerKernelError) as raised:
            group_claims("w1", LEASE, steps)
        assert raised.value.code == INVALID
    with pytest.raises(SchedulerKernelError, match="leaseMs"):
        group_claims("w1", 0, [("a", None)])


class Statements:
    """The statements and commits of ``connection`` (SQLAlchemy events: the fast path steps aside)."""

    def __init__(self, connection: Connection) -> None:
        self.seen: list[str] = []
        self.commits = 0
        self._connection = connection
        event.listen(connection, "before_cursor_execute", self._statement)
        event.listen(connection, "commit", self._commit)

    def _statement(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        self.seen.append(statement)

    def _commit(self, _conn: Any) -> None:
        self.commits += 1

    def savepoints(self) -> list[str]:
        return [sql for sql in self.seen if re.match(r"\s*(SAVEPOINT|RELEASE|ROLLBACK TO)\b", sql, re.I)]

    def close(self) -> None:
        event.remove(self._connection, "before_cursor_execute", self._statement)
        event.remove(self._connection, "commit", self._commit)


def test_a_group_is_one_transaction_without_savepoints(env: Env) -> None:
    env.job()
    leases = held(env, 3)
    for n in range(3):
        env.enqueue(trigger_key=f"next-{n}")
    statements = Statements(env.store.connection)
    try:
        done = committed(commit_group(env.store, [settlement(lease) for lease in leases], agenda(), 3))
    finally:
        statements.close()
    assert len(done.settled) == 3 and len(done.claimed) == 3 and len(done.runtimes) == 3
    assert statements.savepoints() == []
    assert statements.commits == 1
    begins = [sql for sql in statements.seen if re.match(r"\s*BEGIN\b", sql, re.I)]
    assert len(begins) <= 1  # (psycopg begins by itself, without a statement of its own)
