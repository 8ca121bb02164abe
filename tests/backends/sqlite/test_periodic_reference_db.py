"""A worker continues the recorded v6 reference database (a SQLite file) with a fixed clock: the
ticks already recorded are not fired again, later ones are, and disabled jobs and event
triggers never fire. API §9 (periodic triggers)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from recorded import copy_reference

from scheduler import open_store
from scheduler.testing import T0, SchedulerClock
from scheduler.worker import Worker

MINUTE = 60_000


def keys_of(path: Path, job_id: str) -> list[str]:
    """The job's trigger keys in tick order, read on a connection of its own."""
    with sqlite3.connect(path) as connection:
        rows = connection.execute(
            "SELECT trigger_key FROM occurrences WHERE job_id = ? ORDER BY scheduled_for, trigger_key",
            (job_id,),
        ).fetchall()
    return [row[0] for row in rows]


def test_a_worker_continues_the_reference_database_without_refiring(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 6)
    clock = SchedulerClock(T0 + 20 * MINUTE)
    store = open_store(path, clock=clock)
    recorded = {
        job: keys_of(path, job)
        for job in ("agenda-standup-daily", "cowork-cron-sync", "routine-weekly-report")
    }
    kinds = ["agenda", "automation", "automation-event", "cowork-cron", "loop-iteration", "routine"]
    worker = Worker(store, {kind: (lambda o, c: None) for kind in kinds})

    # 00:20Z: every due tick is already recorded (cron:…00:15, interval:0), agenda's 01:00Z is in the future.
    assert worker.fire_due_triggers() == []
    clock.set(T0 + 30 * MINUTE)
    assert [(o.job_id, o.trigger_key) for o in worker.fire_due_triggers()] == [
        ("cowork-cron-sync", "cron:2026-01-01T00:30:00.000Z")
    ]
    clock.set(T0 + 60 * MINUTE)  # agenda's 09:00 Shanghai tick (01:00Z) was recorded: not fired again
    assert [(o.job_id, o.trigger_key) for o in worker.fire_due_triggers()] == [
        ("cowork-cron-sync", "cron:2026-01-01T01:00:00.000Z")
    ]
    clock.set(T0 + 14 * 24 * 60 * MINUTE + 2 * 60 * MINUTE)  # 2026-01-15T02:00Z
    fired = sorted((o.job_id, o.trigger_key, o.scheduled_for) for o in worker.fire_due_triggers())
    assert fired == [
        ("agenda-standup-daily", "cron:2026-01-15T01:00:00.000Z", T0 + 14 * 1440 * MINUTE + 60 * MINUTE),
        ("cowork-cron-sync", "cron:2026-01-15T02:00:00.000Z", T0 + 14 * 1440 * MINUTE + 120 * MINUTE),
        ("routine-weekly-report", "interval:2", T0 + 14 * 1440 * MINUTE),
    ]
    for job, keys in recorded.items():
        now = keys_of(path, job)
        assert len(now) == len(set(now)) and set(keys) <= set(now)
    # Disabled jobs (the once trigger among them) and event triggers never fire.
    assert keys_of(path, "agenda-会议提醒") == [] and len(keys_of(path, "automation-event-webhook")) == 1
    store.close()
