"""The scheduler's revisions mounted as a branch in a host application's own Alembic environment,
from an installed wheel (not the work tree), on a shared SQLite file, an attached SQLite database
and a PostgreSQL schema.

The host is ``examples/shop`` (a SQLAlchemy ORM app with its own revision ``shop_0001`` and its
own ``events`` table), copied to a temporary directory; its ``alembic.ini`` mounts the branch with
one ``version_locations`` line. Every command runs in a fresh venv holding the built wheel.
"""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from backends import PostgresServer
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import URL
from wheel_support import InstalledWheel, copy_example

from scheduler.schema import (
    SCHEDULER_APPLICATION_ID,
    SCHEMA_V6_FINGERPRINT,
    schema_fingerprint,
    verify_schema,
)

T0 = 1_767_225_600_000


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return copy_example("shop", tmp_path)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def sqlite_rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    con = sqlite3.connect(path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def heads(wheel_env: InstalledWheel, shop: Path, env: dict[str, str]) -> set[str]:
    return {line.split()[0] for line in ok(wheel_env.alembic(shop, "current", env=env)).splitlines() if line}


def test_the_wheel_ships_the_revisions(wheel_env: InstalledWheel) -> None:
    location = Path(wheel_env.check())
    assert sorted(p.name for p in location.glob("v*.py")) == [f"v{n}.py" for n in range(1, 7)]
    shown = wheel_env.run(
        "-c",
        "from alembic.util import coerce_resource_to_filename as c; import scheduler;"
        "print(c(scheduler.ALEMBIC_VERSION_LOCATION) == __import__('pathlib').Path("
        "scheduler.alembic_version_location()))",
        cwd=wheel_env.venv,
    )
    assert ok(shown).strip() == "True"


def test_shared_sqlite_file(wheel_env: InstalledWheel, shop: Path, tmp_path: Path) -> None:
    database = tmp_path / "shop.sqlite"
    env = {"SHOP_LAYOUT": "shared", "SHOP_DATABASE": str(database)}
    history = ok(wheel_env.alembic(shop, "history", env=env))
    assert "<base> -> v1 (scheduler)" in history and "<base> -> shop_0001 (shop)" in history
    ok(wheel_env.alembic(shop, "-x", f"scheduler_now={T0}", "upgrade", "heads", env=env))
    assert heads(wheel_env, shop, env) == {"shop_0001", "v6"}
    engine = create_engine(f"sqlite:///{database}")
    try:
        with engine.connect() as connection:
            verify_schema(connection, 6, exclusive=False)
            assert schema_fingerprint(connection, exclusive=False) == SCHEMA_V6_FINGERPRINT
            assert {"orders", "shop_events", "alembic_version", "jobs"} <= set(
                inspect(connection).get_table_names()
            )
    finally:
        engine.dispose()
    assert sqlite_rows(database, "SELECT version, applied_at FROM migrations ORDER BY version") == [
        (v, T0) for v in range(1, 7)
    ]
    assert sqlite_rows(database, "PRAGMA application_id") == [(0,)]  # the application's header, untouched
    ok(wheel_env.alembic(shop, "upgrade", "heads", env=env))  # nothing left to do
    refused = wheel_env.alembic(shop, "downgrade", "scheduler@v5", env=env)
    assert refused.returncode != 0 and "forward-only" in refused.stdout + refused.stderr
    assert heads(wheel_env, shop, env) == {"shop_0001", "v6"}


def test_alembic_version_behind_migrations_is_a_no_op_and_ahead_is_refused(
    wheel_env: InstalledWheel, shop: Path, tmp_path: Path
) -> None:
    database = tmp_path / "shop.sqlite"
    env = {"SHOP_LAYOUT": "shared", "SHOP_DATABASE": str(database)}
    ok(wheel_env.alembic(shop, "upgrade", "scheduler@v2", env=env))
    # alembic_version forgets the scheduler (a restored app backup): v1, v2 are recorded -> no-ops.
    con = sqlite3.connect(database, isolation_level=None)
    con.execute("DELETE FROM alembic_version WHERE version_num = 'v2'")
    con.close()
    ok(wheel_env.alembic(shop, "upgrade", "heads", env=env))
    assert heads(wheel_env, shop, env) == {"shop_0001", "v6"}
    assert [
        row[0] for row in sqlite_rows(database, "SELECT version FROM migrations ORDER BY version")
    ] == list(range(1, 7))
    # alembic_version ahead of migrations: refused, naming both, nothing changed.
    fresh = tmp_path / "fresh.sqlite"
    env_fresh = {"SHOP_LAYOUT": "shared", "SHOP_DATABASE": str(fresh)}
    ok(wheel_env.alembic(shop, "upgrade", "shop@head", env=env_fresh))
    ok(wheel_env.alembic(shop, "stamp", "scheduler@v3", env=env_fresh))
    before = fresh.read_bytes()
    refused = wheel_env.alembic(shop, "upgrade", "heads", env=env_fresh)
    assert refused.returncode != 0
    assert "disagree" in refused.stdout + refused.stderr and "records v0" in refused.stdout + refused.stderr
    assert fresh.read_bytes() == before


def test_attached_sqlite_database(wheel_env: InstalledWheel, shop: Path, tmp_path: Path) -> None:
    database, kernel = tmp_path / "shop.sqlite", tmp_path / "kernel.sqlite"
    env = {"SHOP_LAYOUT": "attached", "SHOP_DATABASE": str(database), "SHOP_KERNEL": str(kernel)}
    ok(wheel_env.alembic(shop, "upgrade", "heads", env=env))
    assert heads(wheel_env, shop, env) == {"shop_0001", "v6"}
    # The kernel file is exactly what open_store makes of a dedicated file.
    engine = create_engine(f"sqlite:///{kernel}")
    try:
        with engine.connect() as connection:
            verify_schema(connection, 6)
    finally:
        engine.dispose()
    assert sqlite_rows(kernel, "PRAGMA user_version") == [(6,)]
    assert sqlite_rows(kernel, "PRAGMA application_id") == [(SCHEDULER_APPLICATION_ID,)]
    # The shop's own `events` table (same name as the scheduler's) is in the shop's file, empty.
    assert sqlite_rows(database, "SELECT count(*) FROM events") == [(0,)]
    assert "migrations" not in {row[0] for row in sqlite_rows(database, "SELECT name FROM sqlite_master")}
    offline = wheel_env.alembic(shop, "upgrade", "heads", "--sql", env=env)
    assert offline.returncode != 0 and "attached SQLite database" in offline.stdout + offline.stderr


def test_offline_script_of_a_shared_file(wheel_env: InstalledWheel, shop: Path, tmp_path: Path) -> None:
    database = tmp_path / "offline.sqlite"
    env = {"SHOP_LAYOUT": "shared", "SHOP_DATABASE": str(database)}
    script = ok(wheel_env.alembic(shop, "upgrade", "heads", "--sql", env=env))
    assert not database.exists()
    ran = subprocess.run(
        ["sqlite3", str(database)], input=script, capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, ran.stderr
    engine = create_engine(f"sqlite:///{database}")
    try:
        with engine.connect() as connection:
            verify_schema(connection, 6, exclusive=False)
    finally:
        engine.dispose()
    assert heads(wheel_env, shop, env) == {"shop_0001", "v6"}
    ok(wheel_env.alembic(shop, "upgrade", "heads", env=env))  # online after offline: nothing to do


@pytest.fixture
def pg_app_database(postgres_server: PostgresServer) -> Iterator[URL]:
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(url)


def test_postgresql_schema(wheel_env: InstalledWheel, shop: Path, pg_app_database: URL) -> None:
    url = pg_app_database.render_as_string(hide_password=False)
    env = {"SHOP_LAYOUT": "postgresql", "SHOP_DATABASE": url, "SHOP_SCHEMA": "kernel_embed"}
    ok(wheel_env.alembic(shop, "upgrade", "heads", env=env))
    assert heads(wheel_env, shop, env) == {"shop_0001", "v6"}
    engine = create_engine(pg_app_database)
    try:
        with engine.connect() as connection:
            verify_schema(connection, 6, schema="kernel_embed")
            public = set(inspect(connection).get_table_names(schema="public"))
            assert public == {"orders", "events", "alembic_version"}  # the shop's own events table
    finally:
        engine.dispose()
    ok(wheel_env.alembic(shop, "upgrade", "heads", env=env))
    refused = wheel_env.alembic(shop, "downgrade", "scheduler@base", env=env)
    assert refused.returncode != 0 and "forward-only" in refused.stdout + refused.stderr


def test_postgresql_offline_script(
    wheel_env: InstalledWheel, shop: Path, postgres_server: PostgresServer, pg_app_database: URL
) -> None:
    url = pg_app_database.render_as_string(hide_password=False)
    env = {"SHOP_LAYOUT": "postgresql", "SHOP_DATABASE": url, "SHOP_SCHEMA": "kernel_offline"}
    script = ok(wheel_env.alembic(shop, "upgrade", "heads", "--sql", env=env))
    libpq = pg_app_database.set(drivername="postgresql").render_as_string(hide_password=False)
    ran = subprocess.run(
        ["psql", "-X", "-q", libpq], input=script, capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, ran.stderr
    engine = create_engine(pg_app_database)
    try:
        with engine.connect() as connection:
            verify_schema(connection, 6, schema="kernel_offline")
            assert {"orders", "events", "alembic_version"} <= set(inspect(connection).get_table_names())
    finally:
        engine.dispose()
    assert heads(wheel_env, shop, env) == {"shop_0001", "v6"}
    rerun = subprocess.run(
        ["psql", "-X", "-q", libpq], input=script, capture_output=True, text=True, check=False
    )
    assert rerun.returncode != 0  # the same script again stops at its first statement; nothing changes
    engine = create_engine(pg_app_database)
    try:
        with engine.connect() as connection:
            verify_schema(connection, 6, schema="kernel_offline")
    finally:
        engine.dispose()
