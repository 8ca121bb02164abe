"""A handler that raises ``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit`` or
``CancelledError``, sync or ``async def``, fails its attempt like any exception (retryable, the
class name as the code, logged with the occurrence) and the worker goes on: the occurrence queued
behind it runs. On a SQLite file only: what a handler raises does not reach the database (the
other endings, on both backends: ``tests/conformance/test_handler_endings.py``). API §9.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from handler_endings_support import ENDINGS, SLOW_RETRY, raising, status, still_works

from scheduler import open_store
from scheduler.worker import Worker
from tests.worker_support import add_job, enqueue, running, wait_for


@pytest.mark.parametrize("style", ["async", "sync"])
@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_base_exception_fails_the_attempt_and_the_worker_goes_on(
    tmp_path: Path, style: str, ending: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="scheduler")
    store = open_store(tmp_path / "kernel.sqlite")
    add_job(store, "bad", max_attempts=3)
    add_job(store, "good")
    bad = enqueue(store, "bad", "one", at=0)
    good = enqueue(store, "good", "two", at=1)
    handlers = {"bad": raising(style, ENDINGS[ending]), "good": still_works}
    worker = Worker(store, handlers, retry=SLOW_RETRY, periodic=False, poll_max_ms=100, lease_ms=5_000)
    with running(worker) as thread:
        wait_for(lambda: status(store, good)[0] == "succeeded", 15, "the occurrence behind it")
        assert thread.is_alive()
    assert status(store, bad) == ("retry_wait", 1, {"code": ending, "message": "the handler ended so"})
    failed = [
        record for record in caplog.records if record.getMessage().startswith(f"handler failed: {ending}")
    ]
    assert len(failed) == 1 and getattr(failed[0], "occurrence", None) == bad and failed[0].exc_info
    store.close()
