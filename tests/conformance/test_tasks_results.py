"""Results of task runs (API §10, §12), on a real SQLite file and on the real PostgreSQL server:
``result()`` / ``await wait()`` through retries to the value, ``TaskFailed`` for a dead letter,
``TaskCancelled`` for a cancelled run, ``TimeoutError`` leaving the run alone; ``cancel``,
``retry``, ``cancel_all``, ``retry_all``; and how soon a waiter learns that a run ended (LISTEN
on PostgreSQL, polling on SQLite). Which PostgreSQL transactions notify the waiters:
``tests/backends/postgresql/test_tasks_notify.py``."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from typing import Any

import pytest
from store_places import StorePlace
from tasks_support import run_row, tasks_on, working

from scheduler import (
    RetryPolicy,
    SchedulerKernelError,
    TaskCancelled,
    TaskFailed,
    Tasks,
)
from scheduler.worker import PermanentError

QUICK = RetryPolicy(base_ms=10, max_ms=10, jitter=0)


def define(tasks: Tasks) -> dict[str, Any]:
    calls: dict[str, int] = {}

    @tasks.task(name="flaky", retry=QUICK)
    def flaky(value: str) -> str:
        calls[value] = calls.get(value, 0) + 1
        if calls[value] < 3:
            raise ConnectionError(f"attempt {calls[value]} failed")
        return value.upper()

    @tasks.task(name="refused")
    def refused() -> None:
        raise PermanentError("recipient rejected", code="RECIPIENT_REJECTED")

    @tasks.task(name="always", max_attempts=2, retry=QUICK)
    def always() -> None:
        raise ValueError("still broken")

    @tasks.task(name="ok", queue="other")
    def ok(value: int) -> int:
        return value

    return {"flaky": flaky, "refused": refused, "always": always, "ok": ok}


def test_result_waits_through_retries_and_raises_for_dead_letters(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        defined = define(tasks)
        flaky = defined["flaky"].defer("x")
        refused = defined["refused"].defer()
        always = defined["always"].defer()
        with working(tasks, "default"):
            assert flaky.result(timeout_s=10) == "X"
            with pytest.raises(TaskFailed) as permanent:
                refused.result(timeout_s=10)
            with pytest.raises(TaskFailed) as exhausted:
                always.result(timeout_s=10)
        assert tasks.get(flaky.id).attempt == 3  # type: ignore[union-attr]
        assert permanent.value.error == {"code": "RECIPIENT_REJECTED", "message": "recipient rejected"}
        assert permanent.value.run.status == "dead_letter" and permanent.value.run.attempt == 1
        assert exhausted.value.error["code"] == "ValueError" and exhausted.value.run.attempt == 2


def test_a_result_that_does_not_come_in_time_is_a_timeout_and_the_run_is_left_alone(
    place: StorePlace,
) -> None:
    with tasks_on(place) as tasks:
        run = define(tasks)["ok"].defer(1)
        before = run_row(place, run.id)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            run.result(timeout_s=0.3)
        assert time.monotonic() - started >= 0.3
        with pytest.raises(TimeoutError):
            run.result(timeout_s=0)
        assert run_row(place, run.id) == before


def test_cancel_retry_and_their_bulk_forms(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        ok = define(tasks)["ok"]
        waiting = ok.defer(1)
        result: list[Any] = []
        waiter = threading.Thread(target=lambda: result.append(_outcome(waiting)))
        waiter.start()
        cancelled = tasks.cancel(waiting.id, reason="customer left")
        waiter.join(timeout=10)
        assert (cancelled.status, cancelled.error) == (
            "dead_letter",
            {"code": "CANCELLED", "message": "customer left"},
        )
        assert isinstance(result[0], TaskCancelled) and result[0].run.id == waiting.id
        assert tasks.cancel(waiting.id).error["message"] == "customer left"  # already cancelled: unchanged
        assert tasks.worker(["other"]).run_until_idle() == 0  # a cancelled run never starts
        back = tasks.retry(waiting.id)
        assert back.status == "retry_wait"
        with pytest.raises(SchedulerKernelError) as not_dead:
            tasks.retry(waiting.id)
        assert not_dead.value.code == "SCHEDULER_CONFLICT"

        more = [ok.defer(value) for value in range(2, 7)]
        other = define_other(tasks)
        for _ in range(3):
            other.defer()
        assert tasks.cancel_all(task=ok) == 5  # queued ones: the retried run is in retry_wait
        assert tasks.cancel_all(task=other, status=["queued", "retry_wait"]) == 3
        assert tasks.cancel_all(task="ok", status="retry_wait") == 1
        assert tasks.cancel_all(queue="other", status=["queued", "retry_wait", "running"]) == 0
        assert tasks.retry_all(task=ok, code="SOMETHING_ELSE") == 0
        assert tasks.retry_all(queue="other", task="ok", code="CANCELLED") == 6
        assert tasks.retry_all() == 3  # every task of this Tasks object: the rest
        assert tasks.worker(["other", "default"]).run_until_idle() == 9
        assert [run.result(timeout_s=0) for run in [waiting, *more]] == [1, 2, 3, 4, 5, 6]
        with pytest.raises(SchedulerKernelError) as bad_status:
            tasks.cancel_all(status="succeeded")
        assert bad_status.value.code == "SCHEDULER_INVALID_ARGUMENT"
        with pytest.raises(SchedulerKernelError) as unknown:
            tasks.cancel("occ_" + "0" * 64)
        assert unknown.value.code == "SCHEDULER_NOT_FOUND"


def define_other(tasks: Tasks) -> Any:
    return tasks.task(name="other_task", queue="other")(lambda: "other")


def _outcome(run: Any) -> Any:
    try:
        return run.result(timeout_s=10)
    except (TaskFailed, TaskCancelled, TimeoutError) as error:
        return error


def test_await_wait_gives_the_same_outcomes(place: StorePlace) -> None:
    async def body() -> None:
        tasks = tasks_on(place)
        defined = define(tasks)
        try:
            good = await defined["flaky"].defer_async("y")
            bad = await defined["refused"].defer_async()
            gone = await defined["ok"].defer_async(5)
            await asyncio.to_thread(tasks.cancel, gone.id)
            with pytest.raises(TimeoutError):
                await good.wait(timeout_s=0.05)
            with pytest.raises(TaskCancelled):
                await gone.wait(timeout_s=5)
            with working(tasks, "default"):
                assert await good.wait(timeout_s=10) == "Y"
                with pytest.raises(TaskFailed):
                    await bad.wait(timeout_s=10)
        finally:
            await tasks.aclose()

    asyncio.run(body())


def test_how_soon_a_waiter_learns_the_result(place: StorePlace) -> None:
    """The waiter is another ``Tasks`` object than the worker's (as in another process): woken by
    the settle channel's NOTIFY on PostgreSQL, by its polling on SQLite."""
    finished: dict[int, float] = {}
    with tasks_on(place) as running_side, tasks_on(place) as waiting_side:

        @running_side.task(name="stamp")
        def stamp(index: int) -> int:
            time.sleep(0.12)
            finished[index] = time.monotonic()
            return index

        waiting_stamp = waiting_side.task(name="stamp")(lambda index: index)
        latencies = []
        with working(running_side):
            for index in range(12):
                run = waiting_stamp.defer(index)
                assert run.result(timeout_s=10) == index
                latencies.append((time.monotonic() - finished[index]) * 1000)
    median, worst = statistics.median(latencies), max(latencies)
    print(
        f"\n{place.backend}: result() returned {median:.1f} ms (median), {worst:.1f} ms (max) after the task"
    )
    bound = 60 if place.backend == "postgresql" else 150
    assert median < bound
