"""Offline SQL never bricks: each printed script, run by ``sqlite3``/``psql``, gives a database the
store accepts, or refuses (at generation or at run time) and changes nothing.

Scripts come from ``scheduler init|upgrade --sql`` (the CLI inspects the database read-only to
know where the script starts). The Alembic ``--sql`` paths are tested in test_alembic.py (the
repository environment) and test_alembic_branch.py (a host application's environment).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
from pathlib import Path

import pytest
from backends import PostgresServer
from dump import diff, dump
from recorded import REFERENCE_DBS, copy_reference
from sqlalchemy import Engine
from typer.testing import CliRunner, Result

from scheduler import open_store
from scheduler.cli import app
from scheduler.schema import SCHEMA_V6_FINGERPRINT, inspect_database, verify_schema

runner = CliRunner()
APP_TABLE = "CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)"


def cli(*args: str) -> Result:
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sqlite3_shell(path: Path, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sqlite3", str(path)], input=script, capture_output=True, text=True, check=False)


def psql(url: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["psql", "-X", "-q", url], input=script, capture_output=True, text=True, check=False
    )


def libpq_url(engine: Engine) -> str:
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)
    monkeypatch.setenv("SCHEDULER_HOME", str(tmp_path / "home"))


def test_init_sql_creates_a_database_the_store_opens(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    printed = cli("init", "--db", str(path), "--sql")
    assert printed.exit_code == 0, printed.output
    assert not path.exists()
    ran = sqlite3_shell(path, printed.stdout)
    assert ran.returncode == 0, ran.stderr
    assert dump(path)["fingerprint"] == SCHEMA_V6_FINGERPRINT
    open_store(path).close()
    again = cli("init", "--db", str(path), "--sql")
    assert again.exit_code == 0 and "already at v6" in again.stdout
    assert sqlite3_shell(path, again.stdout).returncode == 0  # a comment only: runs, changes nothing


@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_upgrade_sql_matches_the_recorded_online_upgrade(tmp_path: Path, version: int) -> None:
    path = copy_reference(tmp_path, version)
    printed = cli("upgrade", "--db", str(path), "--sql")
    assert printed.exit_code == 0, printed.output
    ran = sqlite3_shell(path, printed.stdout)
    assert ran.returncode == 0, ran.stderr
    expected = json.loads((REFERENCE_DBS / f"v{version}.upgraded.json").read_text(encoding="utf-8"))
    differences = [d for d in diff(expected, dump(path)) if "applied_at" not in str(d)]
    assert differences == []
    open_store(path).close()


def test_upgrade_sql_of_a_v1_database_with_jobs_is_refused_printing_nothing(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 1)
    before = digest(path)
    printed = cli("upgrade", "--db", str(path), "--sql")
    assert printed.exit_code != 0
    assert printed.stdout == ""
    assert "v2 authority backfill" in printed.output and "online" in printed.output
    assert digest(path) == before


def test_a_script_run_against_a_database_that_moved_on_changes_nothing(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 3)
    script = cli("upgrade", "--db", str(path), "--sql").stdout
    open_store(path).close()  # upgraded online meanwhile
    before = digest(path)
    ran = sqlite3_shell(path, script)
    assert ran.returncode != 0 and "needs a v3 database" in ran.stderr
    assert digest(path) == before


def test_shared_file_script_leaves_the_application_alone(tmp_path: Path) -> None:
    path = tmp_path / "app.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    for statement in (APP_TABLE, "INSERT INTO orders VALUES (1, 10)", "PRAGMA user_version = 42"):
        con.execute(statement)
    con.close()
    refused = cli("init", "--db", str(path), "--sql")  # not --shared: the app's table is foreign
    assert refused.exit_code != 0 and refused.stdout == ""
    printed = cli("init", "--db", str(path), "--sql", "--shared")
    assert printed.exit_code == 0, printed.output
    ran = sqlite3_shell(path, printed.stdout)
    assert ran.returncode == 0, ran.stderr
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone() == (42,)
        assert con.execute("PRAGMA application_id").fetchone() == (0,)
        assert con.execute("SELECT * FROM orders").fetchall() == [(1, 10)]
    finally:
        con.close()
    with sqlite3.connect(path) as con, pytest.raises(sqlite3.OperationalError):
        con.execute("SELECT * FROM temp.scheduler_offline_guard")
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:
            assert inspect_database(connection, exclusive=False) == 6
            verify_schema(connection, 6, exclusive=False)
    finally:
        engine.dispose()


def test_postgresql_init_and_upgrade_scripts(postgres_server: PostgresServer, pg_schema: str) -> None:
    url = libpq_url(postgres_server.engine)
    sa_url = postgres_server.url.render_as_string(hide_password=False)
    printed = cli("init", "--db", sa_url, "--schema", pg_schema, "--sql")
    assert printed.exit_code == 0, printed.output
    ran = psql(url, printed.stdout)
    assert ran.returncode == 0, ran.stderr
    with postgres_server.engine.connect() as connection:
        assert inspect_database(connection, schema=pg_schema) == 6
        verify_schema(connection, 6, schema=pg_schema)
    rerun = psql(url, printed.stdout)  # the same script again: refused by its guard, nothing changed
    assert rerun.returncode != 0 and "without scheduler tables" in rerun.stderr
    with postgres_server.engine.connect() as connection:
        verify_schema(connection, 6, schema=pg_schema)
