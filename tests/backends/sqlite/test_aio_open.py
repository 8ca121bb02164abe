"""The async store on SQLite: a ``:memory:`` database and the default path (``SCHEDULER_HOME``).

Apart from ``test_open_store.py``, which CI also runs on the oldest supported SQLAlchemy
without the ``async`` extra."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from recorded import T0

from scheduler.aio import open_async_store


def test_the_async_store_opens_a_memory_database_and_the_default_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDULER_HOME", str(tmp_path / "home"))

    async def body() -> None:
        for target in (":memory:", None):
            async with await open_async_store(target, clock=lambda: T0) as store:
                assert (await store.schema_info()).schema_version == 6

    asyncio.run(body())
    assert (tmp_path / "home" / "kernel-v1.sqlite").exists()
