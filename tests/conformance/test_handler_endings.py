"""Every way a handler can end leaves its occurrence settled (or released) and the worker running.

A handler that raises ``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit`` or
``CancelledError`` fails its attempt like any exception (retryable, the class name as the code,
logged with the occurrence): the worker's event loop and lanes keep working, so the occurrence
queued behind it runs. Sync and ``async def`` handlers, a stray loop callback, a periodic job,
``run_until_idle`` (which re-raises ``SystemExit``/``KeyboardInterrupt`` to its caller after the
settlement) and a real ``scheduler worker`` process, on a SQLite file and a PostgreSQL schema.
The matrix of endings × sync/async runs on SQLite only (what a handler raises does not reach the
database): ``tests/backends/sqlite/test_worker_base_exceptions.py``. (Hanging handlers and
handlers cancelled at shutdown: ``test_worker_shutdown.py``.)
API §9.
"""

from __future__ import annotations

import asyncio
import logging
import textwrap
from pathlib import Path
from typing import Any

import pytest
from handler_endings_support import SLOW_RETRY, raising, status, still_works
from process_support import start_scheduler, stop_gracefully
from store_places import StorePlace
from worker_process_support import db_options, status_of

from scheduler.worker import Worker
from tests.worker_support import add_job, enqueue, running, wait_for


def test_a_stray_callback_raising_system_exit_does_not_kill_the_event_loop(
    place: StorePlace, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="scheduler")
    store = place.open()
    add_job(store, "spawner")
    add_job(store, "good")
    spawner = enqueue(store, "spawner", "one", at=0)
    good = enqueue(store, "good", "two", at=1)

    def exit_now() -> None:
        raise SystemExit("from a callback the handler left on the loop")

    async def spawn(occurrence: Any, ctx: Any) -> str:
        asyncio.get_running_loop().call_soon(exit_now)  # runs while this handler awaits
        await asyncio.sleep(0.05)
        return "spawned"

    worker = Worker(store, {"spawner": spawn, "good": still_works}, periodic=False, poll_max_ms=100)
    with running(worker):
        wait_for(lambda: status(store, good)[0] == "succeeded", 15, "the occurrence behind it")
    assert status(store, spawner)[0] == "succeeded"
    escaped = [record for record in caplog.records if "event loop" in record.getMessage()]
    assert escaped and "SystemExit" in escaped[0].getMessage()
    store.close()


def test_a_periodic_jobs_async_handler_raising_keyboard_interrupt(place: StorePlace) -> None:
    store = place.open()
    add_job(store, "tick", trigger={"type": "interval", "everyMs": 500, "anchor": 0}, max_attempts=1)

    async def interrupted(occurrence: Any, ctx: Any) -> Any:
        raise KeyboardInterrupt

    worker = Worker(store, {"tick": interrupted}, poll_max_ms=100)

    def dead_letters() -> list[Any]:
        return store.list_dead_letters(job_id="tick")

    with running(worker):
        wait_for(lambda: len(dead_letters()) >= 2, 15, "two ticks, each settled")
    assert {letter.last_error["code"] for letter in dead_letters()} == {"KeyboardInterrupt"}
    store.close()


@pytest.mark.parametrize("style", ["sync", "async"])
@pytest.mark.parametrize("ending", [SystemExit, KeyboardInterrupt])
def test_run_until_idle_settles_then_reraises_to_its_caller(
    place: StorePlace, style: str, ending: type[BaseException]
) -> None:
    store = place.open()
    add_job(store, "job")
    first = enqueue(store, "job", "first", at=0)
    second = enqueue(store, "job", "second", at=1)
    worker = Worker(store, {"job": raising(style, ending)}, retry=SLOW_RETRY, periodic=False)
    with pytest.raises(ending):
        worker.run_until_idle()
    assert status(store, first)[:2] == ("retry_wait", 1)
    assert status(store, second)[:2] == ("queued", 0)  # not claimed after the interruption
    store.close()


HANDLERS = textwrap.dedent(
    """
    import asyncio
    import sys

    async def exits(occurrence, ctx):
        await asyncio.sleep(0)
        sys.exit("an async handler called sys.exit()")

    async def ok(occurrence, ctx):
        await asyncio.sleep(0)
        return "ok"

    HANDLERS = {"exits": exits, "ok": ok}
    """
)


def test_a_worker_process_survives_an_async_handler_calling_sys_exit(
    tmp_path: Path, place: StorePlace
) -> None:
    (tmp_path / "ending_handlers.py").write_text(HANDLERS)
    with place.open() as store:
        add_job(store, "exits")
        add_job(store, "ok")
        exits = enqueue(store, "exits", "one", at=0)
        ok = enqueue(store, "ok", "two", at=1)
    process = start_scheduler(
        tmp_path,
        *db_options(place),
        "worker",
        "ending_handlers:HANDLERS",
        "--retry-base-ms",
        "60000",
        "--no-periodic",
    )
    try:
        wait_for(lambda: status_of(place, ok)[0] == "succeeded", 30, "the occurrence behind it")
    finally:
        code, stderr = stop_gracefully(process)
    assert code == 0, stderr
    assert status_of(place, exits)[:2] == ("retry_wait", 1)
    assert "handler failed: SystemExit" in stderr and "worker stopped" in stderr
