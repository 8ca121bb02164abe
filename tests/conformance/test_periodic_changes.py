"""Changing a periodic job's trigger with ``update_job`` while workers fire it (API §9), on a SQLite
file and on PostgreSQL (``place``), with the store's injectable clock.

The new schedule fires from the change on, each tick exactly once; no tick of the old schedule is
fired again, none is fired after the change, and a trigger never changed keeps ``interval:<k>``.
"""

from __future__ import annotations

import threading
from typing import Any

from scheduler import SchedulerStore
from scheduler.testing import T0, SchedulerClock
from scheduler.worker import Worker
from tests.store_places import StorePlace
from tests.worker_support import add_job

MINUTE = 60_000
SECOND = 1_000


def noop(occurrence: Any, ctx: Any) -> None:
    return None


def ticks(place: StorePlace, job_id: str) -> list[tuple[str, int]]:
    """(trigger key, scheduled_for) of the job's occurrences, read on a connection of their own."""
    rows = place.sql(
        "SELECT trigger_key, scheduled_for FROM occurrences WHERE job_id = ? "
        "ORDER BY scheduled_for, trigger_key",
        (job_id,),
    )
    return [(row[0], int(row[1])) for row in rows]


def change(store: SchedulerStore, job_id: str, **fields: Any) -> None:
    job = store.get_job(job_id)
    assert job is not None
    store.update_job(job_id, job.revision, **fields)


def walk(worker: Worker, clock: SchedulerClock, start: int, stop: int, step: int) -> list[tuple[str, int]]:
    """Fire due triggers at every ``step`` from ``start`` to ``stop`` (inclusive); what was created."""
    created: list[tuple[str, int]] = []
    for moment in range(start, stop + 1, step):
        clock.set(moment)
        created += [(o.trigger_key, o.scheduled_for) for o in worker.fire_due_triggers()]
    return created


def interval(every_ms: int, anchor: int) -> dict[str, Any]:
    return {"type": "interval", "everyMs": every_ms, "anchor": anchor}


def named(every_ms: int, anchor: int, ks: range) -> list[tuple[str, int]]:
    """The ticks of a changed interval trigger: keys naming the schedule."""
    return [(f"interval:{every_ms}@{anchor}:{k}", anchor + k * every_ms) for k in ks]


def test_lengthening_an_interval_fires_the_new_schedule_from_the_change_on(place: StorePlace) -> None:
    """Every minute for 30 minutes, then every 10 minutes: the new ticks are not silenced by the
    ``interval:<k>`` keys the old schedule used, and nothing is fired twice."""
    clock = SchedulerClock(T0)
    store = place.open(clock=clock)
    add_job(store, "beat", kind="tick", trigger=interval(MINUTE, T0))
    worker = Worker(store, {"tick": noop})
    before = walk(worker, clock, T0, T0 + 30 * MINUTE, MINUTE)
    assert before == [(f"interval:{k}", T0 + k * MINUTE) for k in range(31)]

    clock.set(T0 + 30 * MINUTE + 20 * SECOND)
    change(store, "beat", trigger=interval(10 * MINUTE, T0))
    after = walk(worker, clock, T0 + 31 * MINUTE, T0 + 150 * MINUTE, MINUTE)
    assert after == named(10 * MINUTE, T0, range(4, 16))
    assert ticks(place, "beat") == sorted(before + after, key=lambda tick: (tick[1], tick[0]))
    other = Worker(place.open(clock=clock), {"tick": noop})  # a worker started later: nothing to add
    assert other.fire_due_triggers() == []
    store.close()


def test_shortening_moving_the_anchor_and_changing_back(place: StorePlace) -> None:
    """A payload update keeps ``interval:<k>``; a new anchor restarting ``k`` at 0 is not silenced by
    the old ``interval:0…``; changing back to the first schedule continues it without a repeat."""
    clock = SchedulerClock(T0)
    store = place.open(clock=clock)
    add_job(store, "beat", kind="tick", trigger=interval(10 * MINUTE, T0))
    worker = Worker(store, {"tick": noop})
    first = walk(worker, clock, T0, T0 + 20 * MINUTE, MINUTE)
    clock.set(T0 + 25 * MINUTE)
    change(store, "beat", payload={"note": "not a trigger change"})
    first += walk(worker, clock, T0 + 26 * MINUTE, T0 + 30 * MINUTE, MINUTE)
    assert first == [(f"interval:{k}", T0 + k * 10 * MINUTE) for k in range(4)]

    anchor = T0 + 31 * MINUTE  # every minute from the change on: k restarts at 0
    clock.set(anchor)
    change(store, "beat", trigger=interval(MINUTE, anchor))
    second = walk(worker, clock, anchor, T0 + 40 * MINUTE, 30 * SECOND)
    assert second == named(MINUTE, anchor, range(10))

    clock.set(T0 + 40 * MINUTE + 10 * SECOND)
    change(store, "beat", trigger=interval(10 * MINUTE, T0))  # back to the first schedule
    third = walk(worker, clock, T0 + 41 * MINUTE, T0 + 70 * MINUTE, MINUTE)
    assert third == named(10 * MINUTE, T0, range(5, 8))
    keys = [key for key, _ in ticks(place, "beat")]
    assert len(keys) == len(set(keys)) == len(first) + len(second) + len(third)
    store.close()


def test_a_changed_cron_fires_from_the_change_on_and_never_an_instant_twice(place: StorePlace) -> None:
    """Cron keys name instants: a changed expression keeps ``cron:<ISO>`` keys, fires none of its
    ticks from before the change, and never fires an instant the old expression already fired."""
    clock = SchedulerClock(T0)
    store = place.open(clock=clock)
    add_job(store, "report", kind="tick", trigger={"type": "cron", "expression": "0 * * * *"})
    worker = Worker(store, {"tick": noop})
    assert walk(worker, clock, T0, T0 + 20 * MINUTE, MINUTE) == [("cron:2026-01-01T00:00:00.000Z", T0)]

    change(store, "report", trigger={"type": "cron", "expression": "*/15 * * * *"})  # at 00:20
    created = walk(worker, clock, T0 + 21 * MINUTE, T0 + 45 * MINUTE, MINUTE)
    assert created == [
        ("cron:2026-01-01T00:30:00.000Z", T0 + 30 * MINUTE),
        ("cron:2026-01-01T00:45:00.000Z", T0 + 45 * MINUTE),
    ]

    # A host whose clock is behind changes it "before" 00:45, which was fired: not fired again.
    clock.set(T0 + 44 * MINUTE + 30 * SECOND)
    change(
        store, "report", trigger={"type": "cron", "expression": "*/5 * * * *", "timezone": "Europe/Berlin"}
    )
    created = walk(worker, clock, T0 + 45 * MINUTE, T0 + 50 * MINUTE, 30 * SECOND)
    assert created == [("cron:2026-01-01T00:50:00.000Z", T0 + 50 * MINUTE)]
    keys = [key for key, _ in ticks(place, "report")]
    assert len(keys) == len(set(keys)) == 4
    store.close()


def test_changing_a_once_trigger(place: StorePlace) -> None:
    """A new ``at`` fires once at its time; ``at`` moved before a tick already fired does not fire;
    changing back to a fired ``at`` does not fire it again."""
    clock = SchedulerClock(T0)
    store = place.open(clock=clock)
    add_job(store, "remind", kind="tick", trigger={"type": "once", "at": T0 + 10 * MINUTE})
    worker = Worker(store, {"tick": noop})
    assert walk(worker, clock, T0, T0 + 20 * MINUTE, MINUTE) == [
        ("once:2026-01-01T00:10:00.000Z", T0 + 10 * MINUTE)
    ]
    change(store, "remind", trigger={"type": "once", "at": T0 + 30 * MINUTE})
    assert walk(worker, clock, T0 + 21 * MINUTE, T0 + 35 * MINUTE, MINUTE) == [
        ("once:2026-01-01T00:30:00.000Z", T0 + 30 * MINUTE)
    ]
    change(store, "remind", trigger={"type": "once", "at": T0 + 5 * MINUTE})
    change(store, "remind", trigger={"type": "once", "at": T0 + 30 * MINUTE})
    assert walk(worker, clock, T0 + 36 * MINUTE, T0 + 40 * MINUTE, MINUTE) == []
    change(store, "remind", trigger={"type": "once", "at": T0 + 50 * MINUTE})
    change(store, "remind", trigger={"type": "once", "at": T0 + 45 * MINUTE})  # before it fired
    assert walk(worker, clock, T0 + 41 * MINUTE, T0 + 60 * MINUTE, MINUTE) == [
        ("once:2026-01-01T00:45:00.000Z", T0 + 45 * MINUTE)
    ]
    store.close()


def test_a_worker_that_has_not_seen_the_change_fires_nothing_of_the_old_schedule(place: StorePlace) -> None:
    """A worker re-reads jobs every 5 s; until then it still holds the old trigger. A tick it
    computes from that trigger is not enqueued once the job has changed: it re-reads the job."""
    clock = SchedulerClock(T0)
    stale_store, fresh_store = place.open(clock=clock), place.open(clock=clock)
    add_job(fresh_store, "beat", kind="tick", trigger=interval(MINUTE, T0))
    stale, fresh = Worker(stale_store, {"tick": noop}), Worker(fresh_store, {"tick": noop})
    assert len(walk(stale, clock, T0, T0 + 10 * MINUTE, MINUTE)) == 11
    clock.set(T0 + 10 * MINUTE + 59 * SECOND)
    assert stale.fire_due_triggers() == []  # its jobs were read now
    clock.advance(500)
    change(fresh_store, "beat", trigger=interval(10 * MINUTE, T0))
    clock.set(T0 + 11 * MINUTE)  # 1 s after its last read: the stale worker has not re-read the jobs
    assert stale.fire_due_triggers() == []
    assert max(at for _, at in ticks(place, "beat")) == T0 + 10 * MINUTE
    clock.set(T0 + 20 * MINUTE)
    created = [(o.trigger_key, o.scheduled_for) for w in (stale, fresh) for o in w.fire_due_triggers()]
    assert created == named(10 * MINUTE, T0, range(2, 3))
    stale_store.close()
    fresh_store.close()


def test_workers_racing_through_a_change_fire_each_tick_once(place: StorePlace) -> None:
    """Four workers, each on its own connection, evaluate the same moments at once while the
    trigger changes twice (lengthened, then shortened with a new anchor)."""
    clock = SchedulerClock(T0)
    stores = [place.open(clock=clock, busy_timeout_ms=10_000) for _ in range(4)]
    add_job(stores[0], "beat", kind="tick", trigger=interval(MINUTE, T0))
    workers = [Worker(store, {"tick": noop}) for store in stores]
    changes = {
        T0 + 12 * MINUTE + 20 * SECOND: interval(5 * MINUTE, T0),
        T0 + 31 * MINUTE + 20 * SECOND: interval(2 * MINUTE, T0 + 30 * SECOND),
    }
    created: list[tuple[str, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def fire(worker: Worker, barrier: threading.Barrier) -> None:
        try:
            barrier.wait(timeout=30)
            fired = [(o.trigger_key, o.scheduled_for) for o in worker.fire_due_triggers()]
            with lock:
                created.extend(fired)
        except BaseException as error:  # reported below
            errors.append(error)

    for moment in range(T0, T0 + 45 * MINUTE + 1, 20 * SECOND):
        clock.set(moment)
        if moment in changes:
            change(stores[0], "beat", trigger=changes[moment])
        barrier = threading.Barrier(len(workers))
        threads = [threading.Thread(target=fire, args=(worker, barrier)) for worker in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
    expected = (
        [(f"interval:{k}", T0 + k * MINUTE) for k in range(13)]
        + named(5 * MINUTE, T0, range(3, 7))
        + named(2 * MINUTE, T0 + 30 * SECOND, range(16, 23))
    )
    assert sorted(created, key=lambda tick: tick[1]) == expected
    assert ticks(place, "beat") == expected
    for store in stores:
        store.close()


def test_a_job_disabled_changed_and_enabled_again(place: StorePlace) -> None:
    """Disabled jobs do not fire; a trigger changed meanwhile applies from its change on."""
    clock = SchedulerClock(T0)
    store = place.open(clock=clock)
    add_job(store, "beat", kind="tick", trigger=interval(MINUTE, T0))
    worker = Worker(store, {"tick": noop})
    assert len(walk(worker, clock, T0, T0 + 5 * MINUTE, MINUTE)) == 6
    change(store, "beat", enabled=False)
    assert walk(worker, clock, T0 + 6 * MINUTE, T0 + 9 * MINUTE, MINUTE) == []
    clock.set(T0 + 9 * MINUTE + 30 * SECOND)
    change(store, "beat", trigger=interval(3 * MINUTE, T0))
    assert walk(worker, clock, T0 + 10 * MINUTE, T0 + 11 * MINUTE, MINUTE) == []
    change(store, "beat", enabled=True)  # at 00:11: the 3-minute tick of 00:09 is before the change
    assert walk(worker, clock, T0 + 11 * MINUTE, T0 + 19 * MINUTE, MINUTE) == named(
        3 * MINUTE, T0, range(4, 7)
    )
    store.close()
