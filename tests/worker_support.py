"""Helpers of the worker tests: a store on a real SQLite file, a worker run in a thread, and the
handlers module that ``scheduler worker`` processes run (``HANDLERS``)."""

from __future__ import annotations

import random
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scheduler import SchedulerStore, open_store
from scheduler.worker import Worker

AUTHORITY: dict[str, Any] = {"principal": {"type": "service", "id": "worker-tests"}}
PAUSABLE = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint", "before_execute"]}
HANDLER_KINDS = ("ok", "flaky", "fatal", "long", "stubborn", "slow")
"""The job kinds of :data:`HANDLERS` (a user's handlers module for ``scheduler worker``)."""

HANDLERS = textwrap.dedent(
    """
    import time
    from pathlib import Path
    from scheduler.worker import PermanentError

    MARKS = Path(__file__).parent / "marks"

    def mark(name, text=""):
        MARKS.mkdir(exist_ok=True)
        (MARKS / name).write_text(text)

    def ok(occurrence, ctx):
        return {"echo": occurrence.payload}

    def flaky(occurrence, ctx):
        if occurrence.attempt == 1:
            raise ConnectionError("upstream reset")
        return {"attempt": occurrence.attempt}

    def fatal(occurrence, ctx):
        raise PermanentError("recipient rejected", code="RECIPIENT_REJECTED")

    def long(occurrence, ctx):
        if ctx.resumed_checkpoint is not None:
            return {"resumed_from": ctx.resumed_checkpoint}
        mark("long-started-" + str(occurrence.fence))
        for step in range(3000):
            ctx.checkpoint({"step": step})
            time.sleep(0.01)
        return {"resumed_from": ctx.resumed_checkpoint}

    def stubborn(occurrence, ctx):
        if occurrence.fence > 1:  # a later claim after the lease was lost: finish at once
            return "second run"
        mark("stubborn-" + str(occurrence.fence))
        deadline = time.monotonic() + 20
        while not ctx.should_stop and time.monotonic() < deadline:
            time.sleep(0.02)
        mark("stubborn-stopped-" + str(occurrence.fence), str(ctx.should_stop))
        return "must not be settled"

    def slow(occurrence, ctx):
        mark("slow-started")
        time.sleep(1.5)
        mark("slow-finished")
        return "finished after SIGTERM"

    HANDLERS = {"ok": ok, "flaky": flaky, "fatal": fatal, "long": long, "stubborn": stubborn, "slow": slow}
    """
)


def new_store(path: Path, **options: Any) -> SchedulerStore:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return open_store(path, **options)


def add_job(store: SchedulerStore, job_id: str, kind: str | None = None, **options: Any) -> None:
    store.create_job(id=job_id, kind=kind or job_id, authority=AUTHORITY, **options)


def enqueue(store: SchedulerStore, job_id: str, key: str, payload: Any = None, at: int = 0) -> str:
    return store.enqueue_occurrence(job_id=job_id, scheduled_for=at, trigger_key=key, payload=payload).id


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, message: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message}")
        time.sleep(0.01)


@contextmanager
def running(worker: Worker) -> Iterator[threading.Thread]:
    """Run ``worker.run()`` in a thread; stop it and wait for it on exit."""
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "worker did not stop"


def event_types(store: SchedulerStore, occurrence_id: str) -> list[str]:
    return [event.type for event in reversed(store.history(occurrence_id=occurrence_id, limit=200))]


def noop(occurrence: Any, ctx: Any) -> Any:
    """A handler that does (almost) nothing: a few hundred µs at most, so runs end out of order."""
    time.sleep(random.random() / 2_000)
    return occurrence.payload


def run_noop_worker(target: str, schema: str | None, concurrency: int) -> None:
    """A worker process: ``Worker(..., {"noop": noop}, concurrency=concurrency).run()`` until SIGTERM."""
    with open_store(target, **({} if schema is None else {"schema": schema})) as store:
        worker = Worker(
            store, {"noop": noop}, concurrency=concurrency, periodic=False, poll_min_ms=5, poll_max_ms=50
        )
        worker.run()


def checkpointing(first_run: threading.Event, runs: list[Any], steps: int) -> Callable[[Any, Any], Any]:
    """A pausable handler: ``steps`` checkpoints 10 ms apart, from the resumed step if any; each run
    appends its ``ctx.resumed_checkpoint`` to ``runs``; the first sets ``first_run``."""

    def handler(occurrence: Any, ctx: Any) -> Any:
        runs.append(ctx.resumed_checkpoint)
        start = 0 if ctx.resumed_checkpoint is None else ctx.resumed_checkpoint["step"]
        first_run.set()
        for step in range(start, start + steps):
            ctx.checkpoint({"step": step})
            time.sleep(0.01)
        return {"resumed_from": runs[-1]}

    return handler
