"""Processes opening one older-version database at the same moment: every open succeeds.

Eight real processes (``spawn``) start together on a copy of a v1..v5 reference database (SQLite)
or a schema created at v1..v5 (PostgreSQL); one of them upgrades it, the others wait for the
upgrade and verify the result. Half of them open with ``open_store``, half with
``open_async_store``. A round is repeated for every version, twice on SQLite, so that a race
window of a few milliseconds is hit: before the inspection ran in one consistent snapshot (and
the SQLite switch to WAL waited for the lock), most rounds saw an open refused as
``SCHEDULER_SCHEMA_CORRUPT``/``SCHEDULER_SCHEMA_UNKNOWN`` (a catalog read half before, half after
the upgrade) or ``SCHEDULER_STORAGE_UNAVAILABLE`` (``SQLITE_BUSY`` switching to WAL).

The processes stay up for all rounds (a barrier starts each round), so the test costs one
interpreter start per process, not one per round.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from backends import PostgresServer, unique_name
from recorded import T0
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from scheduler import SchedulerKernelError, open_store
from scheduler.aio import open_async_store
from scheduler.schema import SCHEMA_V6_PG_FINGERPRINT, schema_fingerprint
from scheduler.schema.ddl import SCHEMA_FINGERPRINTS
from scheduler.schema.upgrade import apply_upgrade

FORK = multiprocessing.get_context("fork")  # the children start in milliseconds; each opens its own stores
PROCESSES = 8
REFERENCE_DBS = Path(__file__).parent / "fixtures" / "reference-dbs"
OLD_VERSIONS = (1, 2, 3, 4, 5)


def _open_once(target: str, schema: str | None, use_async: bool) -> str:
    """Open and close one store; ``"ok"`` or the refusal as ``CODE: message``."""
    try:
        if use_async:

            async def opened() -> None:
                store = await open_async_store(target, schema=schema, busy_timeout_ms=60_000)
                await store.close()

            asyncio.run(opened())
        else:
            open_store(target, schema=schema, busy_timeout_ms=60_000).close()
    except SchedulerKernelError as error:
        return f"{error.code}: {error.message} {error.details}"
    return "ok"


def opener(
    targets: list[str], schemas: list[str | None], use_async: bool, delay_s: float, start: Any, results: Any
) -> None:
    outcomes = []
    for target, schema in zip(targets, schemas, strict=True):
        start.wait(120)
        time.sleep(delay_s)
        outcomes.append(_open_once(target, schema, use_async))
    results.put(outcomes)


def race(
    targets: list[str], async_targets: list[str], schemas: list[str | None], delay_s: float = 0.0
) -> list[list[str]]:
    """Every process opens every target in turn, all processes together (process ``n`` after
    ``n * delay_s`` seconds); their outcomes by target."""
    start = FORK.Barrier(PROCESSES)
    results = FORK.Queue()
    processes = [
        FORK.Process(
            target=opener,
            args=(async_targets if n % 2 else targets, schemas, bool(n % 2), delay_s * n, start, results),
        )
        for n in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    collected = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    return [list(round_outcomes) for round_outcomes in zip(*collected, strict=True)]


def refusals(places: list[str], outcomes: list[list[str]]) -> dict[str, list[str]]:
    """The refused opens by place (empty when every open succeeded)."""
    found = {place: [o for o in got if o != "ok"] for place, got in zip(places, outcomes, strict=True)}
    return {place: errors for place, errors in found.items() if errors}


def test_racing_opens_of_an_old_sqlite_file_all_succeed(tmp_path: Path) -> None:
    """Ten rounds on copies of the v1..v5 files, and two on a database that does not exist yet."""
    paths = []
    for round_number, version in enumerate((*OLD_VERSIONS, *OLD_VERSIONS, 0, 0)):
        directory = tmp_path / f"round{round_number}"
        directory.mkdir(mode=0o700)
        path = directory / "kernel.sqlite"
        if version:
            shutil.copyfile(REFERENCE_DBS / f"v{version}.sqlite", path)
            os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
        paths.append(path)
    outcomes = race(
        [str(path) for path in paths],
        [f"sqlite+aiosqlite:///{path}" for path in paths],
        [None] * len(paths),
    )
    assert refusals([str(path) for path in paths], outcomes) == {}
    for path in paths:
        with open_store(path) as store:
            assert schema_fingerprint(store.connection) == SCHEMA_FINGERPRINTS[6]
            versions = store.connection.exec_driver_sql("SELECT version FROM migrations").scalars().all()
            store.connection.rollback()
            assert sorted(versions) == [1, 2, 3, 4, 5, 6]  # upgraded once


def test_racing_opens_of_an_old_postgresql_schema_all_succeed(postgres_server: PostgresServer) -> None:
    """The processes start 0.1 s apart: an unlocked inspection straddles the upgrade's commit
    (they all start before it when started together: each then waits for the lock)."""
    url = postgres_server.url
    versions = (*OLD_VERSIONS, 1, 3, 5)
    schemas = [unique_name(f"t_race_v{version}") for version in versions]
    engine = create_engine(url, poolclass=NullPool)
    try:
        for schema, version in zip(schemas, versions, strict=True):
            with engine.begin() as connection:
                apply_upgrade(connection, 0, T0, to_version=version, schema=schema)
        drivers = ("postgresql+psycopg_async", "postgresql+asyncpg")
        async_urls = [url.set(drivername=drivers[n % 2]) for n in range(len(schemas))]
        outcomes = race(
            [url.render_as_string(hide_password=False)] * len(schemas),
            [async_url.render_as_string(hide_password=False) for async_url in async_urls],
            list(schemas),
            delay_s=0.1,
        )
        assert refusals(schemas, outcomes) == {}
        with engine.connect() as connection:
            for schema in schemas:
                assert schema_fingerprint(connection, schema=schema) == SCHEMA_V6_PG_FINGERPRINT
                history = connection.exec_driver_sql(f'SELECT version FROM "{schema}".migrations')
                assert sorted(history.scalars()) == [1, 2, 3, 4, 5, 6]  # upgraded once
    finally:
        engine.dispose()
        for schema in schemas:
            postgres_server.drop_schema(schema)


def test_the_switch_to_wal_waits_for_another_connections_write_transaction(tmp_path: Path) -> None:
    """A rollback-journal file (the reference databases are) switches to WAL on its first open;
    SQLite refuses that switch at once (no busy handler) while another connection holds the
    write lock. The open waits for the lock instead, within its busy timeout."""
    path = tmp_path / "kernel.sqlite"
    shutil.copyfile(REFERENCE_DBS / "v6.sqlite", path)
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        started = time.monotonic()
        with open_store(path, busy_timeout_ms=10_000) as store:
            assert store.connection.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
            store.connection.rollback()
        assert time.monotonic() - started >= 0.4
    finally:
        release.join()
        holder.close()
    with pytest.raises(SchedulerKernelError) as refused:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("PRAGMA journal_mode = DELETE")
        blocker.execute("BEGIN IMMEDIATE")
        try:
            open_store(path, busy_timeout_ms=200)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
    assert refused.value.code == "SCHEDULER_STORAGE_UNAVAILABLE"
    assert refused.value.details["storageCode"] == "SQLITE_BUSY"
