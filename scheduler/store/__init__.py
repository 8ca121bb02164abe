"""The repository layer: one module per capability over a shared transaction context."""

from __future__ import annotations

from scheduler.backends.sqlite.engine import WRITER_OPTION, mark_writer, sqlite_engine
from scheduler.store.facade import SchedulerStore
from scheduler.store.opening import default_database_path, open_store

__all__ = [
    "WRITER_OPTION",
    "SchedulerStore",
    "default_database_path",
    "mark_writer",
    "open_store",
    "sqlite_engine",
]
