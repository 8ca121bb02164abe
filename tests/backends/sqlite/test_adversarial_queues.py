"""No cliffs on SQLite: the query plans of the adversarial queues' calls, and the bounded
expired-lease probe's behaviour.

The states are the bench's (``scheduler/bench/adversarial_states.py``), built through the public
API at a few hundred rows. Every statement of every case must reach ``occurrences`` and
``events`` through an index (no ``SCAN`` of either but the covering count of
``scheduler_occurrences_job``), and sort only a set bounded before the sort: the eligible jobs'
rows (``members``), a walk page's claimable entries (``hits``) or a range of dead-lettering
events (``dead_lettering``: read by the events primary key with a LIMIT of the range's
length). How much the calls do as the states grow, on both backends:
``tests/conformance/test_no_cliffs.py``. The expired-lease probe reads at most
``EXPIRED_PROBE`` + limit leases, yet every expired lease is still reclaimed or swept (at most
100 per call, as the seed's sweep).
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
from scheduler.bench import adversarial, adversarial_states
from scheduler.bench.context import BENCH_AUTHORITY
from scheduler.store.capabilities import claim_query

ROWS = 300
LEASE = 60_000
OCCURRENCE_OR_EVENT_SCAN = re.compile(
    r"^SCAN (o|occurrences|w|m|hit_o|events|e)\b(?! USING COVERING INDEX scheduler_occurrences_job)"
)
BOUNDED_SORTS = ("members", "hits", "dead_lettering")
"""The subqueries whose rows a statement may sort: each has a LIMIT or is a page's entries."""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SchedulerStore]:
    opened = open_store(tmp_path / "adversarial.sqlite")
    try:
        yield opened
    finally:
        opened.close()


def assert_bounded(plans: list[tuple[str, list[str]]]) -> None:
    assert plans
    for statement, plan in plans:
        assert not any(OCCURRENCE_OR_EVENT_SCAN.match(step.strip()) for step in plan), (statement, plan)
        if any("TEMP B-TREE" in step for step in plan):
            assert any(name in statement for name in BOUNDED_SORTS), (statement, plan)


@pytest.mark.parametrize("state", adversarial.STATES)
def test_every_case_reaches_its_rows_through_an_index(store: SchedulerStore, state: str) -> None:
    adversarial_states.build(store, state, ROWS, adversarial.work_for(3))
    timers = [case.start(store) for case in adversarial.CASES if case.state == state]
    try:
        plans = captured_plans(store, [timer.call for timer in timers])
    finally:
        for timer in timers:
            timer.finish()
    assert_bounded(plans)
    if state in ("disabled", "kinds"):  # the window was full of rows the claims may not take
        assert any("members" in statement for statement, _ in plans)


def test_a_backlog_too_large_for_the_job_probe_is_walked_in_pages(
    store: SchedulerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the eligible jobs' rows over the probe's budget, the claim walks the backlog's ties
    in pages (``hits``) and, past them, the later entries, bounded the same way."""
    monkeypatch.setattr(claim_query, "JOB_PROBE_BUDGET", 4)
    monkeypatch.setattr(claim_query, "WALK_PAGE", 8)
    adversarial_states.build(store, "disabled", ROWS, 40)
    claimed: list[Any] = []
    plans = captured_plans(store, [lambda: claimed.append(store.claim_next(owner_id="w", lease_ms=LEASE))])
    assert claimed[0] is not None and claimed[0].job_id == adversarial_states.ENABLED_JOB
    assert_bounded(plans)
    walks = [plan for statement, plan in plans if "hits" in statement]
    assert walks and any(
        "(status=? AND available_at=? AND lease_expires_at=? AND (scheduled_for,occurrence_id)>(?,?))" in step
        for plan in walks
        for step in plan
    )


def expired(store: SchedulerStore, rows: int, max_attempts: int = 3) -> None:
    """``rows`` occurrences claimed with 1 ms leases: every one expired (final attempts when
    ``max_attempts`` is 1)."""
    store.create_job(id="bench", kind="bench", authority=BENCH_AUTHORITY, max_attempts=max_attempts)
    adversarial_states.add_work(store, "bench", rows)
    assert len(store.claim_batch(owner_id="dead", lease_ms=1, limit=rows)) == rows


def query(store: SchedulerStore, statement: str) -> Any:
    """The first column of the first row ``statement`` returns, read on a connection of its own."""
    connection = sqlite3.connect(store.connection.engine.url.database or "")
    try:
        return connection.execute(statement).fetchone()[0]
    finally:
        connection.close()


def dead_letters(store: SchedulerStore) -> int:
    return int(query(store, "SELECT count(*) FROM occurrences WHERE status = 'dead_letter'"))


def test_an_expired_fleet_is_reclaimed_through_a_bounded_probe(store: SchedulerStore) -> None:
    expired(store, ROWS)
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
    expired(store, 250, max_attempts=1)
    counts = []
    for _ in range(3):
        assert store.claim_next(owner_id="w", lease_ms=LEASE) is None
        counts.append(dead_letters(store))
    assert counts == [100, 200, 250]
    assert claim_query.SWEEP_LIMIT == 100


def test_claim_occurrence_sweeps_through_the_same_bound(store: SchedulerStore) -> None:
    expired(store, 120, max_attempts=1)
    adversarial_states.add_work(store, "bench", 1)
    target = next(
        occurrence
        for occurrence in store.list_occurrences_by_trigger(job_id="bench", trigger_key=_last_trigger(store))
    )
    claimed = store.claim_occurrence(occurrence_id=target.id, owner_id="w", lease_ms=LEASE)
    assert claimed is not None and claimed.id == target.id
    assert dead_letters(store) == 100


def _last_trigger(store: SchedulerStore) -> str:
    return str(query(store, "SELECT trigger_key FROM occurrences WHERE status = 'queued'"))
