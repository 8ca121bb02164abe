"""The dashboard's reads against a brute-force answer, on SQLite and PostgreSQL.

The runs listing is walked page by page for many filters, with the window bound lowered (the
code's ``WINDOW``, 10,000 in production) so that the bounded searches, their "continue after this
window" cursors and the overview's "≥" counts all happen on a small database: every matching run
appears exactly once, in the documented order, and nothing else appears.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
from store_places import StorePlace

from scheduler import SchedulerStore
from scheduler.dashboard import queries, runs
from scheduler.dashboard.runs import RunFilter, list_runs_in
from scheduler.testing import SchedulerClock, dump_tables

JOBS = {"a1": "alpha", "a2": "alpha", "a3": "alpha", "b1": "beta", "b2": "beta", "g1": "gamma"}
WORKSPACE = {"a1": "ws-1", "a2": "ws-2", "a3": "ws-1", "b1": "ws-2", "b2": "ws-1", "g1": "ws-1"}
SMALL_WINDOW = 13


def _build(store: SchedulerStore, clock: SchedulerClock) -> None:
    for job_id, kind in JOBS.items():
        authority = {"principal": {"type": "service", "id": "t"}, "workspaceId": WORKSPACE[job_id]}
        store.create_job(id=job_id, kind=kind, authority=authority, max_attempts=2)
    cycle = itertools.cycle(JOBS)
    for n in range(120):
        store.enqueue_occurrence(job_id=next(cycle), scheduled_for=clock.now, trigger_key=f"k{n}")
        clock.advance(n % 3)  # some runs share a creation time
    claimed = store.claim_batch(owner_id="w", lease_ms=60_000, limit=70)
    settlements: list[dict[str, Any]] = []
    for n, occurrence in enumerate(claimed[:55]):
        base = {"occurrence_id": occurrence.id, "owner_id": "w", "fence": occurrence.fence}
        if n % 3 == 0:
            settlements.append({**base, "outcome": "succeeded", "result": {"n": n}})
        else:
            code = "E1" if n % 3 == 1 else ("E2" if n % 4 else "PAY_OUTCOME_UNKNOWN")
            error = {"code": code, "message": "failed"}
            settlements.append({**base, "outcome": "failed", "error": error, "retryable": n % 5 == 0})
        clock.advance(1)
    store.settle_many(settlements)


@pytest.fixture
def small_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "WINDOW", SMALL_WINDOW)
    monkeypatch.setattr(queries, "WINDOW", SMALL_WINDOW)


def _rows(store: SchedulerStore) -> list[dict[str, Any]]:
    tables = dump_tables(store)
    kinds = {job["job_id"]: job["kind"] for job in tables["jobs"]}
    return [{**row, "kind": kinds[row["job_id"]]} for row in tables["occurrences"]]


def _matches(row: dict[str, Any], runs_filter: RunFilter) -> bool:
    f = runs_filter
    code = (
        None if row["last_error_json"] is None else __import__("json").loads(row["last_error_json"])["code"]
    )
    return (
        (f.status is None or row["status"] == f.status)
        and (f.kind is None or row["kind"] == f.kind)
        and (f.job_id is None or row["job_id"] == f.job_id)
        and (f.workspace is None or WORKSPACE[row["job_id"]] == f.workspace)
        and (f.code is None or code == f.code)
        and (f.since is None or row["created_at"] >= f.since)
        and (f.until is None or row["created_at"] < f.until)
    )


def _walk_all(store: SchedulerStore, runs_filter: RunFilter, page: int) -> tuple[list[Any], set[str]]:
    """Every page of the listing; the orders it used (plus ``"window"`` when a page searched a
    window without filling up)."""
    seen: list[Any] = []
    orders: set[str] = set()
    cursor = None
    for _ in range(500):
        found = store._read(lambda tx, c=cursor: list_runs_in(tx, runs_filter, c, page=page))
        orders.add(found.order)
        if found.searched_window and found.order != "recent":
            orders.add("window")
        assert len(found.rows) <= page
        seen.extend(found.rows)
        if found.next_cursor is None:
            return seen, orders
        cursor = found.next_cursor
    raise AssertionError("the listing never ended")


def _key(order: str, occurrence: Any) -> tuple[Any, ...]:
    if order == "job":
        return (occurrence.created_at, occurrence.id)
    lease = occurrence.lease_expires_at or 0
    return (occurrence.available_at, lease, occurrence.scheduled_for, occurrence.id)


FILTERS = [
    RunFilter(job_id="a1"),
    RunFilter(kind="alpha"),
    RunFilter(kind="alpha", status="dead_letter"),
    RunFilter(kind="beta", code="E2"),
    RunFilter(job_id="b2", status="succeeded"),
    RunFilter(kind="alpha", workspace="ws-2"),
    RunFilter(status="queued"),
    RunFilter(status="dead_letter", code="E1"),
    RunFilter(status="retry_wait", kind="gamma"),
    RunFilter(status="running"),
    RunFilter(status="dead_letter", workspace="ws-1", kind="beta"),
    RunFilter(kind="nope"),
    RunFilter(job_id="a1", kind="beta"),
]


@pytest.mark.usefixtures("small_window")
def test_every_listing_is_complete_ordered_and_without_duplicates(place: StorePlace) -> None:
    clock = SchedulerClock()
    with place.open(clock=clock) as store:
        _build(store, clock)
        rows = _rows(store)
        middle = sorted(row["created_at"] for row in rows)[len(rows) // 2]
        filters = [*FILTERS, RunFilter(job_id="a2", since=middle), RunFilter(kind="beta", until=middle)]
        windows = 0
        for runs_filter, page in itertools.product(filters, (7, 50)):
            seen, orders = _walk_all(store, runs_filter, page)
            ids = [occurrence.id for occurrence in seen]
            expected = {row["occurrence_id"] for row in rows if _matches(row, runs_filter)}
            assert len(ids) == len(set(ids)), runs_filter
            assert set(ids) == expected, runs_filter
            windows += "window" in orders
            (order,) = orders - {"window"}
            assert order in ("job", "status"), runs_filter
            keys = [_key(order, occurrence) for occurrence in seen]
            assert keys == sorted(keys, reverse=True), runs_filter
        assert windows >= 4  # the bounded searches and their continuation were exercised


def test_the_recent_order_lists_the_runs_of_the_newest_events(place: StorePlace, monkeypatch: Any) -> None:
    clock = SchedulerClock()
    with place.open(clock=clock) as store:
        _build(store, clock)
        monkeypatch.setattr(runs, "WINDOW", 60)
        monkeypatch.setattr(runs, "MAX_JOBS", 2)  # a queue of 3 jobs is then filtered in the window
        events = dump_tables(store)["events"]
        newest = sorted(events, key=lambda event: event["event_id"], reverse=True)[:60]
        rows = {row["occurrence_id"]: row for row in _rows(store)}
        for runs_filter in (RunFilter(), RunFilter(workspace="ws-1"), RunFilter(code="E1", kind="alpha")):
            # (a queue of more than MAX_JOBS jobs, a workspace, an error code: no index serves them)
            seen, orders = _walk_all(store, runs_filter, 9)
            assert orders == {"recent"}, runs_filter
            expected = {
                event["occurrence_id"]
                for event in newest
                if event["occurrence_id"] is not None and _matches(rows[event["occurrence_id"]], runs_filter)
            }
            ids = [occurrence.id for occurrence in seen]
            assert len(ids) == len(set(ids)) and set(ids) == expected, runs_filter


def test_overview_counts_and_their_bound(place: StorePlace, monkeypatch: Any) -> None:
    clock = SchedulerClock()
    with place.open(clock=clock) as store:
        _build(store, clock)
        clock.advance(120_000)  # every lease (60 s) has expired
        rows = _rows(store)
        exact = store._read(lambda tx: queries.overview_in(tx, clock.now))
        by_status = Counter(row["status"] for row in rows)
        assert {status: count.value for status, count in exact.statuses.items()} == {
            status: by_status.get(status, 0) for status in exact.statuses
        }
        assert not any(count.at_least for count in exact.statuses.values())
        assert exact.expired_leases.value == by_status["running"]
        depth = {
            (row.kind, status): count.value for row in exact.depth for status, count in row.counts.items()
        }
        assert depth == dict(
            Counter((row["kind"], row["status"]) for row in rows if row["status"] != "succeeded")
        )
        chart = store._read(lambda tx: queries.throughput_in(tx, clock.now))
        assert sum(chart.series["enqueued"]) == 120
        assert (
            sum(chart.series["succeeded"])
            == Counter(event["event_type"] for event in dump_tables(store)["events"])["occurrence_succeeded"]
        )
        monkeypatch.setattr(queries, "WINDOW", 10)
        monkeypatch.setattr(queries, "SAMPLE", 4)
        bounded = store._read(lambda tx: queries.overview_in(tx, clock.now))
        for status, count in bounded.statuses.items():
            assert (str(count), count.at_least) == (
                ("≥ 10", True) if by_status[status] > 10 else (str(by_status[status]), False)
            )
        depth_statuses = ("queued", "running", "retry_wait", "dead_letter")
        assert set(bounded.depth_sampled) == {s for s in depth_statuses if by_status[s] > 10}
        for status in bounded.depth_sampled:  # the newest 4 runs of the status, split by queue
            counts = [row.counts[status] for row in bounded.depth if status in row.counts]
            assert sum(count.value for count in counts) == 4 and all(count.at_least for count in counts)
        dead = sorted(
            (row for row in rows if row["status"] == "dead_letter"),
            key=lambda row: (row["available_at"], row["scheduled_for"], row["occurrence_id"]),
            reverse=True,
        )
        unknown = ['"code":"PAY_OUTCOME_UNKNOWN"' in row["last_error_json"] for row in dead]
        assert exact.awaiting_decision == queries.Count(sum(unknown)) and sum(unknown) > 0
        assert bounded.awaiting_decision == queries.Count(sum(unknown[:4]), True)
