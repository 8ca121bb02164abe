"""No cliffs: the claim and listing paths stay bounded on queues full of rows they are not asked for.

Small versions of the bench's adversarial queues (``scheduler/bench/adversarial.py``): the
query plans SQLite chooses for them (no scan of ``occurrences``, no sort of an unbounded set),
and the behaviour of the bounded expired-lease probe (every expired lease is still reclaimed or
swept, at most 100 per call as the seed's sweep).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from claim_seed import captured_plans

from scheduler import SchedulerStore, open_store
from scheduler.bench.adversarial import dead_letter_all
from scheduler.bench.context import BENCH_AUTHORITY
from scheduler.bench.depth import DepthBuilder, depth_job
from scheduler.bench.stores import PAST_MS, wall_ms
from scheduler.store.capabilities import claim_query

ROWS = 300
LEASE = 60_000
OCCURRENCE_SCAN = re.compile(
    r"^SCAN (o|occurrences|w|m)\b(?! USING COVERING INDEX scheduler_occurrences_job)"
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SchedulerStore]:
    opened = open_store(tmp_path / "adversarial.sqlite")
    try:
        yield opened
    finally:
        opened.close()


def path_of(store: SchedulerStore) -> Path:
    return Path(store.connection.engine.url.database or "")


def bulk(store: SchedulerStore, job_id: str, rows: int = ROWS, **job: Any) -> None:
    """``rows`` due occurrences of a new job (bulk insert, as the bench builds its queues)."""
    store.create_job(
        id=job_id, kind=job.get("kind", "bench"), authority=job.get("authority", BENCH_AUTHORITY)
    )
    DepthBuilder(path_of(store), depth_job(store, job_id), prefix=job_id).add(rows)


def later(store: SchedulerStore, job_id: str, count: int) -> None:
    base = wall_ms() - PAST_MS // 2
    store.enqueue_many(
        [{"job_id": job_id, "scheduled_for": base + i, "trigger_key": f"later-{i}"} for i in range(count)]
    )


def sql(store: SchedulerStore, statement: str) -> None:
    connection = sqlite3.connect(path_of(store))
    try:
        connection.execute(statement)
        connection.commit()
    finally:
        connection.close()


def assert_bounded(plans: list[tuple[str, list[str]]]) -> None:
    """No full scan of occurrences; a sort only of the bounded set read through the eligible jobs."""
    assert plans
    for statement, plan in plans:
        assert not any(OCCURRENCE_SCAN.match(step.strip()) for step in plan), (statement, plan)
        if any("TEMP B-TREE" in step for step in plan):
            assert "members" in statement and any("MATERIALIZE members" in step for step in plan), plan


def test_a_disabled_backlog_ahead_is_skipped_through_the_eligible_jobs(store: SchedulerStore) -> None:
    bulk(store, "off")
    store.update_job("off", 1, enabled=False)
    store.create_job(id="on", kind="bench", authority=BENCH_AUTHORITY)
    later(store, "on", 3)
    claimed: list[Any] = []
    plans = captured_plans(store, [lambda: claimed.append(store.claim_next(owner_id="w", lease_ms=LEASE))])
    assert claimed[0] is not None and claimed[0].job_id == "on"
    assert_bounded(plans)
    assert any("members" in statement for statement, _ in plans)  # the beyond-the-window probe ran


def test_a_kind_behind_another_kinds_backlog(store: SchedulerStore) -> None:
    bulk(store, "kind-a", kind="a")
    store.create_job(id="kind-b", kind="b", authority=BENCH_AUTHORITY)
    later(store, "kind-b", 2)
    claimed: list[Any] = []
    plans = captured_plans(
        store,
        [
            lambda: claimed.append(store.claim_next(owner_id="w", lease_ms=LEASE, job_kind="b")),
            lambda: claimed.append(store.claim_next(owner_id="w", lease_ms=LEASE, job_kind=["c", "b"])),
        ],
    )
    assert [item.job_id for item in claimed] == ["kind-b", "kind-b"]
    assert_bounded(plans)


def test_a_workspace_without_a_match(store: SchedulerStore) -> None:
    bulk(store, "ws", authority={**BENCH_AUTHORITY, "workspaceId": "ws-bench"})
    claimed: list[Any] = []
    plans = captured_plans(
        store,
        [lambda: claimed.append(store.claim_next(owner_id="w", lease_ms=LEASE, workspace_id="nowhere"))],
    )
    assert claimed == [None]
    assert_bounded(plans)


def dead_letters(store: SchedulerStore) -> int:
    connection = sqlite3.connect(path_of(store))
    try:
        return int(
            connection.execute("SELECT count(*) FROM occurrences WHERE status = 'dead_letter'").fetchone()[0]
        )
    finally:
        connection.close()


def expire_all(store: SchedulerStore, attempt: int, max_attempts: int = 3) -> None:
    past = wall_ms() - PAST_MS // 2
    sql(
        store,
        f"UPDATE occurrences SET status = 'running', attempt = {attempt}, max_attempts = {max_attempts}, "
        f"fence = 1, lease_owner = 'dead', lease_expires_at = {past} + (rowid % 7)",
    )


def test_an_expired_fleet_is_reclaimed_through_a_bounded_probe(store: SchedulerStore) -> None:
    bulk(store, "bench")
    expire_all(store, attempt=1)
    claimed: list[Any] = []
    plans = captured_plans(store, [lambda: claimed.append(store.claim_next(owner_id="w", lease_ms=LEASE))])
    assert_bounded(plans)
    assert claimed[0] is not None and claimed[0].lease_owner == "w"
    # Every expired lease is reclaimed, each exactly once, although one claim reads at most
    # EXPIRED_PROBE + limit of them.
    seen = {claimed[0].id}
    for _ in range(ROWS - 1):
        occurrence = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert occurrence is not None and occurrence.id not in seen
        seen.add(occurrence.id)
    assert store.claim_next(owner_id="w", lease_ms=LEASE) is None
    assert len(seen) == ROWS


def test_the_sweep_still_dead_letters_100_expired_final_attempts_per_call(store: SchedulerStore) -> None:
    bulk(store, "bench", rows=250)
    expire_all(store, attempt=1, max_attempts=1)
    counts = []
    for _ in range(3):
        assert store.claim_next(owner_id="w", lease_ms=LEASE) is None
        counts.append(dead_letters(store))
    assert counts == [100, 200, 250]
    assert claim_query.SWEEP_LIMIT == 100


def test_claim_occurrence_sweeps_through_the_same_bound(store: SchedulerStore) -> None:
    bulk(store, "bench", rows=120)
    expire_all(store, attempt=1, max_attempts=1)
    later(store, "bench", 1)
    target = store.list_occurrences_by_trigger(job_id="bench", trigger_key="later-0")[0]
    claimed = store.claim_occurrence(occurrence_id=target.id, owner_id="w", lease_ms=LEASE)
    assert claimed is not None and claimed.id == target.id
    assert dead_letters(store) == 100


def test_dead_letter_listings_walk_the_newest_events(store: SchedulerStore) -> None:
    bulk(store, "bench")
    dead_letter_all(path_of(store), "HANDLER_OUTCOME_UNKNOWN")  # as the bench builds it
    listed: list[Any] = []
    plans = captured_plans(
        store,
        [
            lambda: listed.append(store.list_dead_letters(limit=50)),
            lambda: listed.append(store.list_dead_letters(job_id="bench", limit=50)),
            lambda: listed.append(store.list_adjudication_cases(limit=50)),
        ],
    )
    assert [len(items) for items in listed] == [50, 50, 50]
    assert listed[0] == listed[1]
    assert [case.occurrence_id for case in listed[2]] == [occurrence.id for occurrence in listed[0]]
    assert_bounded(plans)
    assert not any("TEMP B-TREE" in step for _, plan in plans for step in plan)
    assert not any(step.strip().startswith("SCAN events") for _, plan in plans for step in plan)
