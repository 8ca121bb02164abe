"""The PostgreSQL test fixtures: fresh schemas and databases on the real server; skip or fail honestly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from backends import ENV_URL, HOW_TO_ENABLE, Backend
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

REPO = Path(__file__).resolve().parents[1]
THIS = Path(__file__).name


def _schema_exists(engine: Engine, name: str) -> bool:
    with engine.connect() as connection:
        sql = text("SELECT count(*) FROM pg_namespace WHERE nspname = :name")
        return bool(connection.execute(sql, {"name": name}).scalar_one())


def test_each_test_gets_a_schema_of_its_own(pg_engine: Engine, pg_schema: str) -> None:
    assert not _schema_exists(pg_engine, pg_schema)
    with pg_engine.begin() as connection:
        connection.exec_driver_sql(f'CREATE SCHEMA "{pg_schema}"')
        connection.exec_driver_sql(f'CREATE TABLE "{pg_schema}".jobs (x bigint)')
    assert _schema_exists(pg_engine, pg_schema)


def test_a_fresh_database_is_empty(pg_database: URL) -> None:
    engine = create_engine(pg_database, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            assert (
                connection.exec_driver_sql("SELECT current_database()").scalar_one() == pg_database.database
            )
            tables = connection.exec_driver_sql(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
            ).scalar_one()
            assert tables == 0
    finally:
        engine.dispose()


def test_backend_gives_a_write_transaction_in_its_schema(backend: Backend) -> None:
    with backend.engine.begin() as connection:
        if backend.is_postgresql:
            connection.exec_driver_sql(f'CREATE SCHEMA "{backend.schema}"')
        connection.exec_driver_sql(f'CREATE TABLE "{backend.schema}".probe (x INTEGER)')
        connection.exec_driver_sql(f'INSERT INTO "{backend.schema}".probe VALUES (1)')
    with backend.engine.connect() as connection:
        assert connection.exec_driver_sql(f'SELECT x FROM "{backend.schema}".probe').scalar_one() == 1


def _run_pytest(env_url: str | None, *tests: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != ENV_URL}
    if env_url is not None:
        env[ENV_URL] = env_url
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            *(f"tests/{THIS}::{t}" for t in tests),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_unset_variable_skips_with_one_line() -> None:
    result = _run_pytest(None, "test_each_test_gets_a_schema_of_its_own", "test_a_fresh_database_is_empty")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 skipped" in result.stdout
    skip_lines = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skip_lines) == 1 and skip_lines[0].startswith("SKIPPED [2] ")
    assert skip_lines[0].endswith(HOW_TO_ENABLE)


def test_unreachable_server_fails() -> None:
    # Port 9 (discard) on loopback: nothing listens there, so the connection is refused.
    result = _run_pytest(
        "postgresql+psycopg://nobody@127.0.0.1:9/none", "test_each_test_gets_a_schema_of_its_own"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 error" in result.stdout
    assert "but the server cannot be reached" in result.stdout


@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+psycopg"])
def test_plain_postgresql_urls_mean_psycopg(scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from backends import configured_url

    monkeypatch.setenv(ENV_URL, f"{scheme}://u@h/d")
    url = configured_url()
    assert url is not None and url.drivername == "postgresql+psycopg"
