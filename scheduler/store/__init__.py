"""The repository layer: one module per capability over a shared transaction context."""

from __future__ import annotations

from scheduler.store.facade import SchedulerStore
from scheduler.store.opening import default_database_path, open_store

__all__ = ["SchedulerStore", "default_database_path", "open_store"]
