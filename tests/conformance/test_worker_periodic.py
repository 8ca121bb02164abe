"""Periodic triggers fired by workers (API §9): due ticks, missed-tick policy, and exactly-once
across worker processes, on a SQLite file and a PostgreSQL schema (``place``). The recorded v6
reference database continued: ``tests/backends/sqlite/test_periodic_reference_db.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from store_places import PostgresSchemaPlace, StorePlace

from scheduler.testing import T0, SchedulerClock
from scheduler.worker import Worker
from tests.worker_support import add_job

REPO = Path(__file__).resolve().parents[2]
MINUTE = 60_000


def keys_of(place: StorePlace, job_id: str) -> list[str]:
    """The job's trigger keys in tick order, read on a connection of its own."""
    rows = place.sql(
        "SELECT trigger_key FROM occurrences WHERE job_id = ? ORDER BY scheduled_for, trigger_key", (job_id,)
    )
    return [row[0] for row in rows]


def test_due_ticks_are_enqueued_once_with_the_latest_missed_tick_policy(place: StorePlace) -> None:
    clock = SchedulerClock(T0 + 30_000)  # jobs created 30 s after midnight
    store = place.open(clock=clock)
    add_job(store, "every-minute", kind="tick", trigger={"type": "interval", "everyMs": MINUTE, "anchor": T0})
    add_job(store, "quarterly", kind="tick", trigger={"type": "cron", "expression": "*/15 * * * *"})
    add_job(store, "reminder", kind="tick", trigger={"type": "once", "at": T0})  # already past: fires
    add_job(store, "webhook", kind="tick", trigger={"type": "event", "event": "push"})
    add_job(store, "disabled", kind="tick", trigger={"type": "interval", "everyMs": MINUTE}, enabled=False)
    add_job(store, "unhandled", kind="other", trigger={"type": "interval", "everyMs": MINUTE})
    worker = Worker(store, {"tick": lambda o, c: None})

    fired = worker.fire_due_triggers()
    assert [(o.job_id, o.trigger_key) for o in fired] == [("reminder", "once:2026-01-01T00:00:00.000Z")]
    clock.set(T0 + MINUTE)
    assert [o.trigger_key for o in worker.fire_due_triggers()] == ["interval:1"]
    assert worker.fire_due_triggers() == []  # nothing new: no write for a known tick
    clock.set(T0 + 47 * MINUTE + 5_000)  # downtime: only the latest missed tick of each job
    fired = worker.fire_due_triggers()
    assert sorted(o.trigger_key for o in fired) == ["cron:2026-01-01T00:45:00.000Z", "interval:47"]
    assert {o.scheduled_for for o in fired} == {T0 + 45 * MINUTE, T0 + 47 * MINUTE}
    assert keys_of(place, "every-minute") == ["interval:1", "interval:47"]
    assert keys_of(place, "webhook") == keys_of(place, "disabled") == keys_of(place, "unhandled") == []

    other = Worker(store, {"tick": lambda o, c: None})  # a second worker: same ticks, deduplicated
    assert other.fire_due_triggers() == []
    assert len(keys_of(place, "every-minute")) == 2
    store.close()


def test_missed_ticks_all_catches_up_oldest_first_within_a_bound(place: StorePlace) -> None:
    clock = SchedulerClock(T0)
    store = place.open(clock=clock)
    add_job(store, "every-minute", kind="tick", trigger={"type": "interval", "everyMs": MINUTE, "anchor": T0})
    worker = Worker(store, {"tick": lambda o, c: None}, missed_ticks="all", max_catch_up=5)
    assert [o.trigger_key for o in worker.fire_due_triggers()] == ["interval:0"]
    clock.set(T0 + 3 * MINUTE)
    assert [o.trigger_key for o in worker.fire_due_triggers()] == ["interval:1", "interval:2", "interval:3"]
    clock.set(T0 + 20 * MINUTE)
    assert [o.trigger_key for o in worker.fire_due_triggers()] == [f"interval:{k}" for k in range(16, 21)]
    store.close()


WORKER_SCRIPT = textwrap.dedent(
    """
    import sys
    from scheduler import open_store
    from scheduler.worker import Worker

    store = open_store(sys.argv[1], busy_timeout_ms=10_000, schema=sys.argv[2] if len(sys.argv) > 2 else None)
    Worker(store, {"tick": lambda occurrence, ctx: {"key": occurrence.trigger_key}},
           concurrency=2, poll_max_ms=200, missed_ticks="all").run()
    """
)


def test_three_worker_processes_fire_each_tick_exactly_once(tmp_path: Path, place: StorePlace) -> None:
    """On a SQLite file and on a PostgreSQL schema (``place``).

    The workers enqueue every missed tick (``missed_ticks="all"``): under the default policy a
    loaded machine that stalls all three workers past a tick would, as documented, fire only the
    latest of the ticks it missed, and the sequence below would have a legitimate gap.
    """
    with place.open() as store:
        anchor = (int(time.time() * 1000) // 1000 + 2) * 1000
        trigger = {"type": "interval", "everyMs": 1000, "anchor": anchor}
        add_job(store, "heartbeat", kind="tick", trigger=trigger)
    script = tmp_path / "tick_worker.py"
    script.write_text(WORKER_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if isinstance(place, PostgresSchemaPlace):
        target = [place.server.url.render_as_string(hide_password=False), place.schema]
    else:
        target = [str(place.path)]
    workers = [subprocess.Popen([sys.executable, str(script), *target], env=env) for _ in range(3)]
    try:
        # Count 20 s from the first fired tick: on a loaded machine starting three interpreters can
        # take seconds.
        deadline = time.monotonic() + 90
        while place.sql("SELECT count(*) FROM occurrences")[0][0] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(20)
    finally:
        for process in workers:
            process.send_signal(signal.SIGTERM)
        codes = [process.wait(timeout=60) for process in workers]
    assert codes == [0, 0, 0]
    keys = [row[0] for row in place.sql("SELECT trigger_key FROM occurrences ORDER BY scheduled_for")]
    enqueued = place.sql("SELECT count(*) FROM events WHERE event_type = 'occurrence_enqueued'")[0][0]
    claims = dict(
        place.sql(
            "SELECT occurrence_id, count(*) FROM events WHERE event_type = 'occurrence_claimed' "
            "GROUP BY occurrence_id"
        )
    )
    statuses = {row[0] for row in place.sql("SELECT status FROM occurrences")}
    ticks = [int(key.split(":")[1]) for key in keys]
    print(f"{place.backend}: {len(ticks)} ticks by 3 processes, claims each {set(claims.values())}")
    assert len(ticks) >= 15, keys  # about 20 s of one-second ticks
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))  # every tick, none twice
    assert enqueued == len(keys) and set(claims.values()) == {1}
    assert statuses <= {"succeeded", "queued", "running"}
