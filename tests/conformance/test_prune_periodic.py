"""Pruning never lets a restarted worker fire an old periodic tick again, however many other
occurrences the job has (on a SQLite file and on PostgreSQL: ``place``).

Each test fires a tick with a worker, runs it, buries it under more than a thousand newer
non-periodic occurrences of the same job, prunes everything old (``scheduler prune`` as a real
process, or ``store.prune``), then starts a new worker on a new store.
API §9 periodic triggers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from store_places import SqliteFilePlace, StorePlace

from scheduler import SchedulerStore
from scheduler.testing import T0, SchedulerClock
from scheduler.worker import Worker
from tests.worker_support import add_job

REPO = Path(__file__).resolve().parents[2]
MINUTE = 60_000
DAY = 24 * 60 * MINUTE
NEWER = 1_100
"""More newer non-periodic occurrences than a bounded scan of a job's newest rows would read."""

TRIGGERS: dict[str, tuple[dict[str, Any], str, tuple[str, int] | None]] = {
    # trigger, the key of its tick at 00:15, its next tick (key, at) by 00:30 (cron is pruned with
    # the command, the others with the method: a process start costs seconds on a busy machine)
    "cron": (
        {"type": "cron", "expression": "*/15 * * * *"},
        "cron:2026-01-01T00:15:00.000Z",
        ("cron:2026-01-01T00:30:00.000Z", T0 + 30 * MINUTE),
    ),
    "interval": (
        {"type": "interval", "everyMs": 15 * MINUTE, "anchor": T0},
        "interval:1",
        ("interval:2", T0 + 30 * MINUTE),
    ),
    "once": ({"type": "once", "at": T0 + 15 * MINUTE}, "once:2026-01-01T00:15:00.000Z", None),
}


def noop(occurrence: Any, ctx: Any) -> None:
    return None


def keys(place: StorePlace, job_id: str) -> list[str]:
    rows = place.sql(
        "SELECT trigger_key FROM occurrences WHERE job_id = ? ORDER BY scheduled_for, trigger_key", (job_id,)
    )
    return [row[0] for row in rows]


def bury(store: SchedulerStore, job_id: str, count: int) -> None:
    """``count`` newer non-periodic occurrences of the job, run to ``succeeded`` (due now, so after the
    ticks in the order prune walks: the ticks are in its first batch)."""
    now = store.clock()
    requests = [{"job_id": job_id, "scheduled_for": now, "trigger_key": f"manual:{i}"} for i in range(count)]
    store.enqueue_many(requests)
    while claimed := store.claim_batch(owner_id="w", lease_ms=60_000, limit=1000):
        store.settle_many(
            [
                {"occurrence_id": o.id, "owner_id": "w", "fence": o.fence, "outcome": "succeeded"}
                for o in claimed
            ]
        )


def prune_with_the_cli(place: StorePlace) -> None:
    """``python -m scheduler prune --older-than 1d`` in a process of its own (the wall clock is
    months after the test clock, so every settled occurrence is old enough)."""
    if isinstance(place, SqliteFilePlace):
        target = ["--db", str(place.path)]
    else:
        target = ["--db", place.server.url.render_as_string(hide_password=False), "--schema", place.schema]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "scheduler", "prune", "--older-than", "1d", *target, "--json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f'"occurrences": {NEWER}' in done.stdout, done.stdout


def prune_with_the_method(place: StorePlace) -> None:
    """``store.prune`` on a store of its own, 40 days after the test clock's start."""
    with place.open(clock=SchedulerClock(T0 + 40 * DAY)) as store:
        assert store.prune(older_than_ms=DAY).occurrences == NEWER


@pytest.mark.parametrize("trigger_type", sorted(TRIGGERS))
def test_a_pruned_job_does_not_refire_its_last_tick_after_a_restart(
    place: StorePlace, trigger_type: str
) -> None:
    trigger, key, following = TRIGGERS[trigger_type]
    clock = SchedulerClock(T0)
    store = place.open(clock=clock)
    add_job(store, "periodic", kind="tick", trigger=trigger)
    clock.set(T0 + 15 * MINUTE)
    assert Worker(store, {"tick": noop}).run_until_idle() == 1
    clock.advance(1_000)
    bury(store, "periodic", NEWER)
    store.close()

    if trigger_type == "cron":
        prune_with_the_cli(place)
    else:
        prune_with_the_method(place)
    assert keys(place, "periodic") == [key]  # the tick is kept, the others are gone

    clock.set(T0 + 20 * MINUTE)
    restarted = place.open(clock=clock)
    worker = Worker(restarted, {"tick": noop})
    assert worker.fire_due_triggers() == []
    clock.set(T0 + 30 * MINUTE)
    fired = [(o.trigger_key, o.scheduled_for) for o in worker.fire_due_triggers()]
    assert fired == ([] if following is None else [following])
    restarted.close()


def test_prune_keeps_the_newest_tick_of_each_trigger_type(place: StorePlace) -> None:
    """``store.prune``: a job whose trigger changed (interval → cron → interval) keeps its newest tick
    of each type; a restarted worker (``missed_ticks="all"``) catches up nothing it fired before."""
    clock = SchedulerClock(T0)
    store = place.open(clock=clock)
    add_job(store, "periodic", kind="tick", trigger={"type": "interval", "everyMs": MINUTE, "anchor": T0})
    worker = Worker(store, {"tick": noop}, missed_ticks="all")
    for minute in range(0, 6):
        clock.set(T0 + minute * MINUTE)
        worker.run_until_idle()
    job = store.get_job("periodic")
    assert job is not None
    revision = job.revision
    store.update_job("periodic", revision, trigger={"type": "cron", "expression": "*/10 * * * *"})
    clock.set(T0 + 10 * MINUTE)
    worker.run_until_idle()
    clock.set(T0 + 10 * MINUTE + 30_000)
    store.update_job(
        "periodic", revision + 1, trigger={"type": "interval", "everyMs": 2 * MINUTE, "anchor": T0}
    )
    clock.set(T0 + 12 * MINUTE)
    worker.run_until_idle()
    clock.advance(1_000)
    bury(store, "periodic", NEWER)
    clock.set(T0 + 40 * DAY)
    result = store.prune(older_than_ms=DAY)
    assert result.occurrences == NEWER + 6  # interval:0…5 and the manual ones
    assert keys(place, "periodic") == ["cron:2026-01-01T00:10:00.000Z", f"interval:120000@{T0}:6"]
    store.close()

    clock.set(T0 + 13 * MINUTE)  # back at 00:13, a new worker on a new store
    restarted = place.open(clock=clock)
    assert Worker(restarted, {"tick": noop}, missed_ticks="all").fire_due_triggers() == []
    clock.set(T0 + 14 * MINUTE)
    fired = Worker(restarted, {"tick": noop}, missed_ticks="all").fire_due_triggers()
    assert [o.trigger_key for o in fired] == [f"interval:120000@{T0}:7"]
    restarted.close()


def test_a_worker_suspended_past_the_prune_horizon_does_not_refire_pruned_ticks(place: StorePlace) -> None:
    """Two workers with ``missed_ticks="all"``: B fires the first ticks, then is suspended (its
    process stopped, its host asleep) while A fires and runs an hour of ticks and a prune deletes
    all but the newest. B, resumed, still remembers its own last tick: the ticks between it and the
    newest are gone from the database, so only the store, not B's memory, can say they fired.
    Nothing runs twice; B fires the next due tick once."""
    clock = SchedulerClock(T0)
    store_a, store_b = place.open(clock=clock), place.open(clock=clock)
    add_job(store_a, "beat", kind="tick", trigger={"type": "interval", "everyMs": MINUTE, "anchor": T0})
    runs: list[str] = []

    def record(occurrence: Any, ctx: Any) -> None:
        runs.append(occurrence.trigger_key)

    worker_a = Worker(store_a, {"tick": record}, missed_ticks="all")
    worker_b = Worker(store_b, {"tick": record}, missed_ticks="all")
    for minute in range(3):
        clock.set(T0 + minute * MINUTE)
        worker_b.fire_due_triggers()
        worker_a.run_until_idle()
    for minute in range(3, 61):  # B is suspended
        clock.set(T0 + minute * MINUTE)
        worker_a.run_until_idle()
    assert store_a.prune(older_than_ms=10 * MINUTE).occurrences == 50  # interval:0…49
    clock.set(T0 + 61 * MINUTE)
    assert [o.trigger_key for o in worker_b.fire_due_triggers()] == ["interval:61"]
    assert worker_b.run_until_idle() == 1
    assert runs == [f"interval:{k}" for k in range(62)]
    store_a.close()
    store_b.close()
