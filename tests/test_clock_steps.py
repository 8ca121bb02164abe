"""A wall clock that steps backwards (an NTP step): the documented behaviour, pinned with an
injected clock, and scheduler.monotonic_wall_clock / NonDecreasingClock (issue 15, item 10).
See "Clocks" in docs/operations.md.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from hardening_support import T0, new_store, python_argv
from hypothesis import given
from hypothesis import strategies as st

from scheduler import Occurrence, SchedulerStore, monotonic_wall_clock, open_store
from scheduler.store.clock import NonDecreasingClock, wall_clock

HOUR = 3_600_000
LEASE = 30_000


class StepClock:
    """A settable wall clock."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_work_due_before_a_step_back_waits_until_the_clock_passes_it_again(tmp_path: Path) -> None:
    clock = StepClock(T0)
    store = new_store(tmp_path / "k.sqlite", clock=clock)
    due = store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="due", available_at=T0)
    clock.now = T0 + 10 - HOUR  # NTP steps the clock back one hour
    assert store.claim_next(owner_id="w", lease_ms=LEASE) is None
    clock.now = T0 - 1
    assert store.claim_next(owner_id="w", lease_ms=LEASE) is None
    clock.now = T0
    claimed = store.claim_next(owner_id="w", lease_ms=LEASE)
    assert claimed is not None and claimed.id == due.id
    store.close()


def running_at_t0(path: Path, owner: str) -> tuple[StepClock, SchedulerStore, Occurrence]:
    """A store whose one occurrence ``owner`` claimed at T0 (lease until T0 + LEASE)."""
    clock = StepClock(T0)
    store = new_store(path, clock=clock)
    store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="work")
    held = store.claim_next(owner_id=owner, lease_ms=LEASE)
    assert held is not None and held.lease_expires_at == T0 + LEASE
    return clock, store, held


def test_a_lease_taken_just_before_a_step_back_stays_live_an_extra_hour(tmp_path: Path) -> None:
    clock, store, held = running_at_t0(tmp_path / "k.sqlite", "dead-worker")
    clock.now = T0 + 1_000 - HOUR  # the step; then the owner dies without renewing
    for elapsed in (LEASE + 1, HOUR, HOUR + LEASE - 1):  # real time since the claim
        clock.now = T0 + elapsed - HOUR
        assert store.claim_next(owner_id="rescuer", lease_ms=LEASE) is None, elapsed
    clock.now = T0 + LEASE  # an hour and 30 s of real time after the claim
    rescued = store.claim_next(owner_id="rescuer", lease_ms=LEASE)
    assert rescued is not None and rescued.id == held.id and rescued.fence == held.fence + 1
    store.close()


def test_a_renewal_after_the_step_never_shortens_the_lease(tmp_path: Path) -> None:
    clock, store, held = running_at_t0(tmp_path / "k.sqlite", "w")
    clock.now = T0 - HOUR
    renewed = store.renew(occurrence_id=held.id, owner_id="w", fence=held.fence, lease_ms=LEASE)
    assert renewed.lease_expires_at == T0 + LEASE  # max(current expiry, now + lease) (seed: renew)
    clock.now = T0 + LEASE - 1
    assert store.claim_next(owner_id="other", lease_ms=LEASE) is None
    clock.now = T0 + LEASE
    assert store.claim_next(owner_id="other", lease_ms=LEASE) is not None
    store.close()


def test_a_non_decreasing_clock_keeps_due_work_due_across_the_step(tmp_path: Path) -> None:
    source = StepClock(T0)
    clock = NonDecreasingClock(source)
    store = new_store(tmp_path / "k.sqlite", clock=clock)
    store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="due", available_at=T0)
    source.now = T0 - HOUR
    claimed = store.claim_next(owner_id="w", lease_ms=LEASE)
    assert claimed is not None  # the store's time held still at T0 instead of going back
    assert claimed.lease_expires_at == T0 + LEASE
    source.now = T0 - HOUR + LEASE + 1  # the lease does not expire early either: time holds still
    assert store.claim_next(owner_id="other", lease_ms=LEASE) is None
    source.now = T0 + LEASE
    assert store.claim_next(owner_id="other", lease_ms=LEASE) is not None
    store.close()


@given(st.lists(st.integers(0, 2**53 - 1), min_size=1, max_size=50))
def test_non_decreasing_clock_is_the_running_maximum_of_its_source(values: list[int]) -> None:
    feed = iter(values)
    clock = NonDecreasingClock(lambda: next(feed))
    seen = [clock() for _ in values]
    assert seen == [max(values[: index + 1]) for index in range(len(values))]


def test_non_decreasing_clock_never_goes_back_across_threads() -> None:
    state = {"value": 10_000}
    lock = threading.Lock()

    def jittery() -> int:  # a source that keeps stepping back and forth
        with lock:
            state["value"] += 7
            return state["value"] - (state["value"] % 3) * 1_000

    clock = NonDecreasingClock(jittery)
    results: list[list[int]] = [[] for _ in range(4)]

    def sample(into: list[int]) -> None:
        for _ in range(2_000):
            into.append(clock())

    threads = [threading.Thread(target=sample, args=(into,)) for into in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for values in results:
        assert values == sorted(values)


def test_monotonic_wall_clock_is_a_valid_store_clock(tmp_path: Path) -> None:
    before = wall_clock()
    first = monotonic_wall_clock()
    assert before <= first <= wall_clock() + 1
    assert monotonic_wall_clock() >= first
    with open_store(tmp_path / "k.sqlite", clock=monotonic_wall_clock) as store:
        store.create_job(id="job-a", kind="agenda", authority={"principal": {"type": "user", "id": "u"}})
        assert store.get_job("job-a") is not None


def test_a_forked_child_can_use_a_clock_whose_lock_another_thread_held() -> None:
    source = """
import os, sys, threading
from scheduler.store.clock import NonDecreasingClock
clock = NonDecreasingClock(lambda: 5)
clock()
held, release = threading.Event(), threading.Event()

def hold():
    with clock._lock:
        held.set()
        release.wait(10)

threading.Thread(target=hold).start()
held.wait(10)
pid = os.fork()
if pid == 0:
    os._exit(0 if clock() == 5 else 3)  # without the at-fork reset this blocks forever
release.set()
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    result = subprocess.run(python_argv(source), capture_output=True, text=True, timeout=20, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"
