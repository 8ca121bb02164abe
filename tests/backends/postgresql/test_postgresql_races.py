"""Every write method on PostgreSQL gives the result of some serial order (API §8).

Each test races 8 stores — 8 connections to the real server, one thread each, released together
by a barrier — on the same key, then checks the invariant a serial execution guarantees: one
winner per compare-and-set, one row per identity, one occurrence per trigger, a budget never
overspent. (SQLite needs no such test: ``BEGIN IMMEDIATE`` runs its writers one at a time.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from migration_fixtures import agenda_entry, plan
from sqlalchemy import Engine

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.store.plumbing.fastpath import FastPath
from scheduler.testing import dump_tables

T0 = 1767225600000
RACERS = 8
AUTHORITY = {
    "principal": {"type": "user", "id": "user-alice"},
    "workspaceId": "ws-main",
    "requestedCapabilities": ["calendar.read"],
}
Outcome = tuple[str, Any]  # ("ok", result) or ("error", code)


@pytest.fixture
def stores(pg_engine: Engine, pg_schema: str) -> Iterator[list[SchedulerStore]]:
    """``RACERS`` stores (one connection each) on one fresh schema, clock fixed at ``T0``."""
    opened = [open_store(pg_engine, schema=pg_schema, clock=lambda: T0) for _ in range(RACERS)]
    yield opened
    for store in opened:
        store.close()


def race(stores: list[SchedulerStore], call: Callable[[SchedulerStore, int], Any]) -> list[Outcome]:
    """``call(store, i)`` on every store at once; each outcome in racer order."""
    barrier = threading.Barrier(len(stores))
    outcomes: list[Outcome | None] = [None] * len(stores)

    def run(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = ("ok", call(stores[index], index))
        except SchedulerKernelError as error:
            outcomes[index] = ("error", error.code)
        except Exception as error:  # reported, so the assertion shows it
            outcomes[index] = ("unexpected", repr(error))

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(outcome is not None for outcome in outcomes), "a racer did not finish"
    return [outcome for outcome in outcomes if outcome is not None]


def oks(outcomes: list[Outcome]) -> list[Any]:
    return [value for kind, value in outcomes if kind == "ok"]


def errors(outcomes: list[Outcome]) -> list[Any]:
    assert not [value for kind, value in outcomes if kind == "unexpected"], outcomes
    return [value for kind, value in outcomes if kind == "error"]


def test_create_job_has_one_winner(stores: list[SchedulerStore]) -> None:
    outcomes = race(stores, lambda store, i: store.create_job(id="job-1", kind=f"k{i}", authority=AUTHORITY))
    assert len(oks(outcomes)) == 1
    assert errors(outcomes) == ["SCHEDULER_CONFLICT"] * (RACERS - 1)
    tables = dump_tables(stores[0])
    assert [row["kind"] for row in tables["jobs"]] == [oks(outcomes)[0].kind]
    assert [row["event_type"] for row in tables["events"]] == ["job_created"]


def test_update_job_compare_and_set_has_one_winner(stores: list[SchedulerStore]) -> None:
    stores[0].create_job(id="job-1", kind="email", authority=AUTHORITY)
    outcomes = race(stores, lambda store, i: store.update_job("job-1", 1, payload={"racer": i}))
    [winner] = oks(outcomes)
    assert winner.revision == 2
    assert errors(outcomes) == ["SCHEDULER_REVISION_CONFLICT"] * (RACERS - 1)
    assert stores[0].get_job("job-1") == winner  # type: ignore[comparison-overlap]
    assert [row["event_type"] for row in dump_tables(stores[0])["events"]] == ["job_created", "job_updated"]


def test_enqueue_of_one_identity_inserts_once(stores: list[SchedulerStore]) -> None:
    stores[0].create_job(id="job-1", kind="email", authority=AUTHORITY)
    outcomes = race(
        stores, lambda store, i: store.enqueue_occurrence(job_id="job-1", scheduled_for=T0, trigger_key="t")
    )
    results = oks(outcomes)
    assert sorted(occurrence.deduplicated for occurrence in results) == [False] + [True] * (RACERS - 1)
    assert len({occurrence.id for occurrence in results}) == 1
    tables = dump_tables(stores[0])
    assert len(tables["occurrences"]) == 1
    assert [row["event_type"] for row in tables["events"]] == ["job_created", "occurrence_enqueued"]


def test_enqueue_many_with_overlapping_identities(stores: list[SchedulerStore]) -> None:
    stores[0].create_job(id="job-1", kind="email", authority=AUTHORITY)

    def enqueue(store: SchedulerStore, i: int) -> Any:
        keys = [f"t{(i + k) % 4}" for k in range(3)]  # every racer shares keys with the others
        return store.enqueue_many(
            [{"job_id": "job-1", "scheduled_for": T0, "trigger_key": key} for key in keys]
        )

    outcomes = race(stores, enqueue)
    created = [
        occurrence.trigger_key
        for batch in oks(outcomes)
        for occurrence in batch
        if not occurrence.deduplicated
    ]
    assert sorted(created) == ["t0", "t1", "t2", "t3"]  # each identity created by exactly one batch
    tables = dump_tables(stores[0])
    assert len(tables["occurrences"]) == 4
    assert sum(row["event_type"] == "occurrence_enqueued" for row in tables["events"]) == 4


def test_copied_batches_race_single_enqueues_of_their_identities(
    stores: list[SchedulerStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of 100 go as a COPY of the identities read as new under their locks; racers
    enqueueing the same identities one at a time or in other batches never make it fail."""
    stores[0].create_job(id="job-1", kind="email", authority=AUTHORITY)
    copies: list[str] = []
    real_copy = FastPath.copy_rows

    def counted(self: FastPath, conn: Any, table: Any, columns: Any, rows: Any) -> bool:
        copied = real_copy(self, conn, table, columns, rows)
        if copied:
            copies.append(table.name)
        return copied

    monkeypatch.setattr(FastPath, "copy_rows", counted)

    for round_ in range(4):  # a lost lock shows in some rounds only

        def request(key: int, round_: int = round_) -> dict[str, Any]:
            return {"job_id": "job-1", "scheduled_for": T0 + round_, "trigger_key": f"t{key}"}

        def enqueue(store: SchedulerStore, i: int) -> Any:
            if i >= RACERS - 2:  # one at a time, every third identity, in opposite orders
                keys = range(0, 200, 3) if i % 2 else range(198, -1, -3)
                return [store.enqueue_occurrence(**request(key)) for key in keys]
            return store.enqueue_many([request((i * 50 + k) % 200) for k in range(100)])

        outcomes = race(stores, enqueue)
        assert len(oks(outcomes)) == RACERS, outcomes
        created = [
            occurrence.trigger_key
            for done in oks(outcomes)
            for occurrence in done
            if not occurrence.deduplicated
        ]
        assert sorted(created) == sorted(f"t{key}" for key in range(200))  # each created exactly once
    tables = dump_tables(stores[0])
    assert len(tables["occurrences"]) == 800
    assert sum(row["event_type"] == "occurrence_enqueued" for row in tables["events"]) == 800
    assert "occurrences" in copies and "events" in copies


def test_once_per_trigger_enqueues_one_occurrence_per_tick(stores: list[SchedulerStore]) -> None:
    stores[0].create_job(id="job-1", kind="email", authority=AUTHORITY)
    outcomes = race(
        stores,
        lambda store, i: store.enqueue_occurrence_once_per_trigger(
            job_id="job-1", scheduled_for=T0 + i, trigger_key="cron:tick"
        ),
    )
    results = oks(outcomes)
    assert len({occurrence.id for occurrence in results}) == 1
    assert sorted(occurrence.deduplicated for occurrence in results) == [False] + [True] * (RACERS - 1)
    assert len(dump_tables(stores[0])["occurrences"]) == 1


def test_authority_policy_creation_and_compare_and_set(stores: list[SchedulerStore]) -> None:
    ensured = oks(race(stores, lambda store, i: store.ensure_authority_policy(AUTHORITY)))
    assert len(ensured) == RACERS and len({policy.revision for policy in ensured}) == 1
    principal = AUTHORITY["principal"]
    outcomes = race(
        stores,
        lambda store, i: store.set_authority_policy(
            principal,
            capabilities=["calendar.read"],
            window_ms=60_000,
            max_runs=i + 1,
            max_units=10,
            expected_revision=1,
        ),
    )
    assert len(oks(outcomes)) == 1, outcomes
    [winner] = oks(outcomes)
    assert errors(outcomes) == ["SCHEDULER_AUTHORITY_POLICY_CONFLICT"] * (RACERS - 1)
    assert stores[0].get_authority_policy(principal) == winner
    assert len(dump_tables(stores[0])["scheduler_authority_policies"]) == 1


def test_prepare_of_one_plan_journals_one_migration(stores: list[SchedulerStore]) -> None:
    migration_plan = plan(agenda_entry())
    results = oks(race(stores, lambda store, i: store.prepare_domain_migration(migration_plan)))
    assert len(results) == RACERS
    assert sorted(migration.deduplicated for migration in results) == [False] + [True] * (RACERS - 1)
    assert len({migration.id for migration in results}) == 1
    assert len(dump_tables(stores[0])["scheduler_domain_migrations"]) == 1


# ------------------------------------------------- writes on running and dead-lettered occurrences

CHECKPOINTS = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint"]}


def running_occurrences(store: SchedulerStore, count: int, kind: str = "agenda") -> list[Any]:
    """``count`` occurrences of one job, each claimed by its own owner."""
    store.create_job(id="job-r", kind=kind, authority=AUTHORITY, max_attempts=1)
    for index in range(count):
        store.enqueue_occurrence(job_id="job-r", scheduled_for=T0, trigger_key=f"t{index}")
    claimed = store.claim_batch(owner_id="w", limit=count, lease_ms=600_000)
    assert len(claimed) == count
    return claimed


def test_reserve_authority_never_overspends_a_budget(stores: list[SchedulerStore]) -> None:
    """8 occurrences of one principal reserve at once against a budget of 3 runs: 3 reservations."""
    occurrences = running_occurrences(stores[0], RACERS)
    stores[0].ensure_authority_policy(AUTHORITY, window_ms=3_600_000, max_runs=3, max_units=100)
    outcomes = race(
        stores,
        lambda store, i: store.reserve_authority(occurrence_id=occurrences[i].id, policy_revision=1),
    )
    refused = errors(outcomes)
    assert len(oks(outcomes)) == 3, outcomes
    assert len(refused) == RACERS - 3 and len(set(refused)) == 1, refused
    assert len(dump_tables(stores[0])["scheduler_authority_reservations"]) == 3


def test_reserve_authority_for_one_occurrence_reserves_once(stores: list[SchedulerStore]) -> None:
    [occurrence] = running_occurrences(stores[0], 1)
    stores[0].ensure_authority_policy(AUTHORITY, window_ms=3_600_000, max_runs=100, max_units=100)
    outcomes = race(
        stores, lambda store, i: store.reserve_authority(occurrence_id=occurrence.id, policy_revision=1)
    )
    reservations = dump_tables(stores[0])["scheduler_authority_reservations"]
    assert len(reservations) == 1
    assert len(oks(outcomes)) + len(errors(outcomes)) == RACERS
    assert len({(r.occurrence_id, r.units) for r in oks(outcomes)}) <= 1


def test_settle_of_one_lease_settles_once(stores: list[SchedulerStore]) -> None:
    [occurrence] = running_occurrences(stores[0], 1)
    outcomes = race(
        stores,
        lambda store, i: store.settle(
            occurrence_id=occurrence.id,
            owner_id="w",
            fence=occurrence.fence,
            outcome="succeeded",
            result={"racer": i},
        ),
    )
    assert len(oks(outcomes)) == 1, outcomes
    assert set(errors(outcomes)) == {"SCHEDULER_LEASE_LOST"}
    events = [e["event_type"] for e in dump_tables(stores[0])["events"]]
    assert events.count("occurrence_succeeded") == 1


def test_requeue_of_one_dead_letter_has_one_winner(stores: list[SchedulerStore]) -> None:
    [occurrence] = running_occurrences(stores[0], 1)
    dead = stores[0].settle(
        occurrence_id=occurrence.id,
        owner_id="w",
        fence=occurrence.fence,
        outcome="failed",
        error={"code": "SMTP_DOWN", "message": "down"},
        retryable=False,
    )
    assert dead.status == "dead_letter"
    outcomes = race(
        stores,
        lambda store, i: store.requeue_dead_letter(
            occurrence_id=dead.id,
            expected_fence=dead.fence,
            expected_error_code="SMTP_DOWN",
            request_id=f"rq-{i}",
        ),
    )
    assert len(oks(outcomes)) == 1, outcomes
    assert len(errors(outcomes)) == RACERS - 1
    assert len(dump_tables(stores[0])["scheduler_occurrence_retries"]) == 1


def test_pause_requests_on_one_occurrence_have_one_winner(stores: list[SchedulerStore]) -> None:
    [occurrence] = running_occurrences(stores[0], 1)
    outcomes = race(
        stores,
        lambda store, i: store.request_occurrence_pause(
            occurrence_id=occurrence.id,
            expected_fence=occurrence.fence,
            request_id=f"pause-{i}",
            capability=CHECKPOINTS,
        ),
    )
    assert len(oks(outcomes)) == 1, outcomes
    assert len(errors(outcomes)) == RACERS - 1
    assert len(dump_tables(stores[0])["scheduler_occurrence_controls"]) == 1
