"""The async API: :func:`open_async_store` and :class:`AsyncSchedulerStore`.

Every ``SchedulerStore`` method as a coroutine with the same arguments, results and errors, on
aiosqlite, asyncpg or async psycopg (install ``scheduler-kernel[async]``). See ``docs/async.md``.
"""

from __future__ import annotations

from scheduler.aio.opening import open_async_store
from scheduler.aio.store import AsyncSchedulerStore

__all__ = ["AsyncSchedulerStore", "open_async_store"]
