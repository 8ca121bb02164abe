"""The worker runtime: run handlers for claimed occurrences and fire periodic triggers (API §9).

```python
from scheduler import open_store
from scheduler.worker import Worker, RetryPolicy, PermanentError

def send_email(occurrence, ctx):
    ...                       # return value -> settle(result=...)

Worker(open_store(url), handlers={"email": send_email}, concurrency=4).run()
```

See docs/workers.md.
"""

from __future__ import annotations

from scheduler.worker.context import HandlerContext
from scheduler.worker.periodic import MissedTicks, PeriodicScheduler
from scheduler.worker.policy import (
    MAX_ERROR_MESSAGE_CHARS,
    RESULT_NOT_JSON,
    Paused,
    PermanentError,
    RetryPolicy,
    error_document,
)
from scheduler.worker.runtime import Worker
from scheduler.worker.triggers import Tick, TriggerError, iso_ms, parse_trigger
from scheduler.worker.waker import IdleBackoff, ListenWaker, PollingWaker, Waker

__all__ = [
    "MAX_ERROR_MESSAGE_CHARS",
    "RESULT_NOT_JSON",
    "HandlerContext",
    "IdleBackoff",
    "ListenWaker",
    "MissedTicks",
    "Paused",
    "PeriodicScheduler",
    "PermanentError",
    "PollingWaker",
    "RetryPolicy",
    "Tick",
    "TriggerError",
    "Waker",
    "Worker",
    "error_document",
    "iso_ms",
    "parse_trigger",
]
