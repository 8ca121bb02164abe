"""Helpers of the worker tests: a store on a real SQLite file and a worker run in a thread."""

from __future__ import annotations

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
