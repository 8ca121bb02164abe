"""The task worker (API §9, §10), on a real SQLite file and on the real PostgreSQL server: queues
claimed in strict order, ``ctx`` for a task that declares it, ``timeout_ms`` (``TASK_TIMEOUT``: an
async task cancelled, a sync one told through ``ctx.should_stop`` and its late result discarded),
a running task cancelled at its next renewal, and periodic tasks."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from store_places import StorePlace
from tasks_support import run_row, tasks_on, working

from scheduler import RetryPolicy, SchedulerKernelError, TaskCancelled, TaskFailed
from scheduler.worker import HandlerContext
from tests.worker_support import event_types, wait_for

QUICK = RetryPolicy(base_ms=10, max_ms=10, jitter=0)


def test_queues_are_claimed_in_strict_order(place: StorePlace) -> None:
    with tasks_on(place, queues={"critical": {}, "default": {}}) as tasks:
        ran: list[str] = []

        @tasks.task(name="routine")
        def routine(index: int) -> None:
            ran.append(f"routine-{index}")
            if index == 0:  # work arriving for the first queue while the second one is served
                urgent.defer(99)

        @tasks.task(name="urgent", queue="critical")
        def urgent(index: int) -> None:
            ran.append(f"urgent-{index}")

        routine.defer_many([{"index": index} for index in range(4)])
        urgent.defer_many([{"index": index} for index in range(3)])  # deferred after, served first
        assert tasks.queue_order() == ["critical", "default"]
        worker = tasks.worker()
        try:
            assert worker.run_until_idle() == 8
        finally:
            worker.close()
        # within a queue the store's order (due time, then id); across queues strictly by queue
        assert sorted(ran[:3]) == ["urgent-0", "urgent-1", "urgent-2"]
        assert ran[3].startswith("routine-") and ran[4] == ("urgent-99" if ran[3] == "routine-0" else ran[4])
        first_routine = ran.index("routine-0")
        assert ran[first_routine + 1] == "urgent-99"
        assert [entry.split("-")[0] for entry in ran].count("routine") == 4
        with pytest.raises(SchedulerKernelError):
            tasks.worker([])


def test_a_task_declaring_ctx_gets_the_worker_context(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        seen: list[tuple[Any, ...]] = []

        @tasks.task(name="with_ctx", queue="ctx-queue")
        def with_ctx(value: int, ctx: HandlerContext) -> int:
            seen.append((type(ctx), ctx.kind, ctx.occurrence.id, ctx.should_stop, ctx.renew().fence))
            ctx.logger.info("working on %d", value)
            return value * 2

        run = with_ctx.defer(21)
        assert "ctx" not in run_row(place, run.id)["payload_json"]
        with pytest.raises(SchedulerKernelError) as refused:
            with_ctx.defer(1, ctx="mine")
        assert refused.value.code == "SCHEDULER_INVALID_ARGUMENT"
        with working(tasks):
            assert run.result(timeout_s=10) == 42
        assert seen == [(HandlerContext, "ctx-queue", run.id, False, 1)]


def test_an_async_task_over_its_time_limit_is_cancelled_and_retried(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        cancelled: list[int] = []

        @tasks.task(name="sleepy", timeout_ms=200, max_attempts=2, retry=QUICK)
        async def sleepy(ctx: HandlerContext) -> str:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                cancelled.append(ctx.occurrence.attempt)
                raise
            return "too late"

        run = sleepy.defer()
        started = time.monotonic()
        with working(tasks), pytest.raises(TaskFailed) as failed:
            run.result(timeout_s=10)
        assert time.monotonic() - started < 3
        assert failed.value.error["code"] == "TASK_TIMEOUT"
        assert failed.value.run.attempt == 2 and cancelled == [1, 2]
        assert event_types_of(place, run.id).count("occurrence_retry_scheduled") == 1


def test_a_sync_task_over_its_time_limit_is_told_and_its_late_result_discarded(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        told, release = threading.Event(), threading.Event()

        @tasks.task(name="slow", timeout_ms=200, retry=QUICK)
        def slow(ctx: HandlerContext) -> str:
            if ctx.occurrence.attempt > 1:
                release.wait(10)
                return "on time"
            deadline = time.monotonic() + 5
            while not ctx.should_stop and time.monotonic() < deadline:
                time.sleep(0.01)
            if ctx.should_stop:
                told.set()
            return "late"

        run = slow.defer()
        with working(tasks, concurrency=2):
            assert told.wait(10)
            wait_for(lambda: run_row(place, run.id)["attempt"] == 2, message="the retry")
            assert '"code":"TASK_TIMEOUT"' in run_row(place, run.id)["last_error_json"]
            release.set()
            assert run.result(timeout_s=10) == "on time"  # "late" was never settled
        events = event_types_of(place, run.id)
        assert events.count("occurrence_retry_scheduled") == 1 and events.count("occurrence_succeeded") == 1


def event_types_of(place: StorePlace, run_id: str) -> list[str]:
    with place.open() as store:
        return event_types(store, run_id)


def test_a_running_task_is_told_of_its_cancellation_at_its_next_renewal(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        started = {"async": threading.Event(), "sync": threading.Event()}
        outcome: dict[str, str] = {}

        @tasks.task(name="waits_async", queue="a")
        async def waits_async() -> str:
            started["async"].set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                outcome["async"] = "cancelled"
                raise
            return "finished"

        @tasks.task(name="waits_sync", queue="s")
        def waits_sync(ctx: HandlerContext) -> str:
            started["sync"].set()
            deadline = time.monotonic() + 10
            while not ctx.should_stop and time.monotonic() < deadline:
                time.sleep(0.01)
            outcome["sync"] = "told" if ctx.should_stop else "not told"
            return "discarded"

        runs = {"async": waits_async.defer(), "sync": waits_sync.defer()}
        with working(tasks, concurrency=2, lease_ms=600):
            for kind in ("async", "sync"):
                assert started[kind].wait(10)
                tasks.cancel(runs[kind].id, reason="no longer needed")
            wait_for(lambda: len(outcome) == 2, timeout=5, message="both tasks told")
        assert outcome == {"async": "cancelled", "sync": "told"}
        for run in runs.values():
            with pytest.raises(TaskCancelled):
                run.result(timeout_s=0)
            assert run_row(place, run.id)["status"] == "dead_letter"


def test_a_periodic_task_runs_on_its_schedule_with_the_tick(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        ticks: list[int] = []

        @tasks.periodic(name="heartbeat", every_ms=150, queue="beats")
        def heartbeat(tick_ms: int) -> int:
            ticks.append(tick_ms)
            return tick_ms

        with working(tasks):
            wait_for(lambda: len(ticks) >= 2, timeout=10, message="two ticks")
        keys = [row[0] for row in place.sql("SELECT trigger_key FROM occurrences ORDER BY scheduled_for")]
        assert all(key.startswith("interval:") for key in keys) and len(keys) == len(set(keys))
        gap = ticks[1] - ticks[0]
        assert gap > 0 and gap % 150 == 0  # a tick missed while the machine was busy is skipped
        assert heartbeat(5) == 5


def test_a_periodic_task_removed_from_the_code_no_longer_fires(place: StorePlace) -> None:
    """Renamed in a new release: the old task's job keeps its trigger, but the workers of the new
    code define no such task, so they fire none of its ticks (each would fail TASK_NOT_FOUND)."""
    with tasks_on(place) as before:
        before.periodic(name="beat_v1", every_ms=60_000, queue="beats")(lambda: None)
        before.register()
    with tasks_on(place) as after:
        after.periodic(name="beat_v2", every_ms=60_000, queue="beats")(lambda: None)
        worker = after.worker()
        try:
            assert worker.run_until_idle() == 1
        finally:
            worker.close()
    rows = place.sql("SELECT job_id, status FROM occurrences")
    assert [tuple(row) for row in rows] == [("beat_v2", "succeeded")]


def test_a_pausable_task_pauses_at_a_checkpoint_and_resumes_from_it(place: StorePlace) -> None:
    with tasks_on(place) as tasks, place.open() as store:
        stepping = threading.Event()

        @tasks.task(name="steps", pausable=True)
        def steps(ctx: HandlerContext) -> dict[str, Any]:
            start = (ctx.resumed_checkpoint or {}).get("step", 0)
            for step in range(start, 300):
                ctx.checkpoint({"step": step})
                stepping.set()
                time.sleep(0.01)
            return {"resumed_at": start}

        run = steps.defer()
        capability = tasks.register()[0].payload["runtimeControl"]  # declared by pausable=True
        with working(tasks, pause_check_ms=0):
            assert stepping.wait(10)
            control = store.request_occurrence_pause(
                occurrence_id=run.id, expected_fence=1, request_id="pause-1", capability=capability
            )
            wait_for(lambda: store.get_occurrence_control(run.id).state == "paused", message="paused")
            paused = store.get_occurrence_control(run.id)
            store.resume_occurrence(occurrence_id=run.id, expected_revision=paused.revision, request_id="r-1")
            result = run.result(timeout_s=30)
        assert control.state == "pause_requested" and result["resumed_at"] > 0


def test_the_worker_runs_a_task_in_a_span_whose_parent_is_the_deferring_one(place: StorePlace) -> None:
    trace = pytest.importorskip("opentelemetry.trace")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tasks_on(place) as tasks:
        traced = tasks.task(name="traced")(lambda value: value)
        untraced = traced.defer(0)
        with provider.get_tracer("test").start_as_current_span("handle request") as request:
            run = traced.defer(1)
        assert "traceparent" in run_row(place, run.id)["payload_json"]
        assert "trace" not in run_row(place, untraced.id)["payload_json"]
        worker = tasks.worker()
        try:
            assert worker.run_until_idle() == 2
        finally:
            worker.close()
    spans = [span for span in exporter.get_finished_spans() if span.name == "task traced"]
    by_run = {span.attributes["scheduler.run"]: span for span in spans}
    child = by_run[run.id]
    assert child.parent is not None and child.parent.span_id == request.get_span_context().span_id
    assert child.context.trace_id == request.get_span_context().trace_id
    assert by_run[untraced.id].parent is None
