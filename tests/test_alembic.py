"""Alembic revisions v1..v6 give the same database as the original's upgrade, and leave no trace.

Each reference database (a copy) is upgraded with ``alembic upgrade head`` and its dump must
equal the recorded ``vN.upgraded.json`` exactly; the catalog must stay canonical (no
``alembic_version`` table), ``alembic current`` reports the revision matching
``PRAGMA user_version``, downgrades and drifted databases are refused without a change.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from backends import PostgresServer
from dump import diff, dump
from recorded import REFERENCE_DBS, T0, UPGRADE_NOW, copy_reference

import scheduler
from scheduler import open_store
from scheduler.schema import (
    SCHEDULER_APPLICATION_ID,
    SCHEMA_FINGERPRINTS,
    SCHEMA_V6_FINGERPRINT,
    verify_schema,
)

REPO = Path(__file__).resolve().parents[1]
ALEMBIC_INI = REPO / "alembic.ini"


def alembic_config(*x: str, stdout: io.StringIO | None = None) -> Config:
    """The repository's alembic.ini with ``-x`` arguments, as the command line would build it."""
    config = Config(str(ALEMBIC_INI), stdout=stdout or io.StringIO())
    config.cmd_opts = argparse.Namespace(x=list(x))
    config.attributes["configure_logger"] = False
    return config


def upgrade(path: Path, revision: str = "head", now: int = UPGRADE_NOW) -> None:
    command.upgrade(alembic_config(f"url=sqlite:///{path}", f"now={now}"), revision)


def current(path: Path) -> str:
    out = io.StringIO()
    command.current(alembic_config(f"url=sqlite:///{path}", stdout=out))
    return out.getvalue().strip()


def pragma(path: Path, name: str) -> int:
    con = sqlite3.connect(path)
    try:
        return int(con.execute(f"PRAGMA {name}").fetchone()[0])
    finally:
        con.close()


def catalog_names(path: Path) -> list[str]:
    con = sqlite3.connect(path)
    try:
        return [r[0] for r in con.execute("SELECT name FROM sqlite_master ORDER BY name")]
    finally:
        con.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def every_row(path: Path) -> list[str]:
    """The database's schema and rows as SQL text: what a write would change (the file's bytes
    also change when a connection's close checkpoints the WAL into it)."""
    connection = sqlite3.connect(path)
    try:
        return list(connection.iterdump())
    finally:
        connection.close()


@pytest.mark.parametrize("version", range(1, 7))
def test_upgrade_head_reproduces_the_recorded_upgrade(tmp_path: Path, version: int) -> None:
    path = copy_reference(tmp_path, version)
    assert current(path) == f"v{version}" + (" (head)" if version == 6 else "")
    upgrade(path)
    expected = json.loads((REFERENCE_DBS / f"v{version}.upgraded.json").read_text(encoding="utf-8"))
    assert diff(expected, dump(path)) == []
    assert not [name for name in catalog_names(path) if name.startswith("alembic")]
    assert current(path) == "v6 (head)"


def test_empty_database_becomes_v6(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite"
    assert current(path) == ""
    upgrade(path, now=T0)
    dumped = dump(path)
    assert dumped["fingerprint"] == SCHEMA_V6_FINGERPRINT
    assert (dumped["user_version"], dumped["application_id"]) == (6, SCHEDULER_APPLICATION_ID)
    assert [(r["version"], r["applied_at"]) for r in dumped["tables"]["migrations"]] == [
        (v, T0) for v in range(1, 7)
    ]
    assert "alembic_version" not in catalog_names(path)
    assert current(path) == "v6 (head)"
    upgrade(path)  # already at head: nothing changes
    assert diff(dumped, dump(path)) == []


def test_each_revision_leaves_a_valid_database_of_its_version(tmp_path: Path) -> None:
    path = tmp_path / "stepwise.sqlite"
    for version in range(1, 7):
        upgrade(path, f"v{version}", now=T0 + version)
        dumped = dump(path)
        assert dumped["user_version"] == version
        assert dumped["fingerprint"] == SCHEMA_FINGERPRINTS[version]
        assert current(path) == f"v{version}" + (" (head)" if version == 6 else "")
    applied = [r["applied_at"] for r in dump(path)["tables"]["migrations"]]
    assert applied == [T0 + v for v in range(1, 7)]


def test_alembic_check_finds_no_difference_between_metadata_and_database(tmp_path: Path) -> None:
    path = tmp_path / "check.sqlite"
    upgrade(path)
    command.check(alembic_config(f"url=sqlite:///{path}"))  # raises if autogenerate sees a diff
    assert "alembic_version" not in catalog_names(path)


def test_relative_upgrade_runs_one_step(tmp_path: Path) -> None:
    path = tmp_path / "relative.sqlite"
    upgrade(path, "v2")
    upgrade(path, "+1")
    assert pragma(path, "user_version") == 3
    assert current(path) == "v3"


@pytest.mark.parametrize("target", ["v5", "base", "-1"])
def test_downgrade_is_refused_and_changes_nothing(tmp_path: Path, target: str) -> None:
    path = tmp_path / "db.sqlite"
    upgrade(path)
    before = digest(path)
    with pytest.raises(CommandError, match="forward-only"):
        command.downgrade(alembic_config(f"url=sqlite:///{path}"), target)
    assert digest(path) == before
    assert current(path) == "v6 (head)"


def test_drifted_database_is_refused_untouched(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 2)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("CREATE VIEW extra AS SELECT 1")
    con.close()
    before = digest(path)
    with pytest.raises(CommandError, match="SCHEDULER_SCHEMA_CORRUPT") as caught:
        upgrade(path)
    assert getattr(caught.value.__cause__, "code", None) == "SCHEDULER_SCHEMA_CORRUPT"
    assert digest(path) == before
    with pytest.raises(CommandError, match="SCHEDULER_SCHEMA_CORRUPT"):
        current(path)


def test_foreign_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "foreign.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.close()
    before = digest(path)
    with pytest.raises(CommandError, match="SCHEDULER_SCHEMA_UNKNOWN"):
        upgrade(path)
    assert digest(path) == before


def test_failed_backfill_rolls_back_every_revision(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 1)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("UPDATE jobs SET authority_json = '{}' WHERE rowid = 1")
    con.close()
    before = dump(path)
    with pytest.raises(CommandError, match="SCHEDULER_DATA_CORRUPT"):
        upgrade(path)
    assert diff(before, dump(path)) == []
    assert current(path) == "v1"


@pytest.mark.parametrize("now", ["-1", "1.5", "abc", "1_000", "+5", "", str(2**53)])
def test_invalid_now_is_refused(tmp_path: Path, now: str) -> None:
    with pytest.raises(CommandError, match="-x now"):
        command.upgrade(alembic_config(f"url=sqlite:///{tmp_path / 'x.sqlite'}", f"now={now}"), "head")


def test_url_from_environment_and_from_ini(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from_env = tmp_path / "env.sqlite"
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", f"sqlite:///{from_env}")
    command.upgrade(alembic_config(f"now={T0}"), "v1")
    assert pragma(from_env, "user_version") == 1
    monkeypatch.delenv("SCHEDULER_DATABASE_URL")
    from_ini = tmp_path / "ini.sqlite"
    config = alembic_config(f"now={T0}")
    config.set_main_option("sqlalchemy.url", f"sqlite:///{from_ini}")
    command.upgrade(config, "head")
    assert pragma(from_ini, "user_version") == 6
    plain_path = tmp_path / "plain.sqlite"
    command.upgrade(alembic_config(f"url={plain_path}", f"now={T0}"), "head")
    assert pragma(plain_path, "user_version") == 6


def offline_script(*x: str, revision: str = "head") -> str:
    out = io.StringIO()
    config = alembic_config(*x)
    config.output_buffer = out
    command.upgrade(config, revision, sql=True)
    return out.getvalue()


def run_sqlite3(path: Path, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sqlite3", str(path)], input=script, capture_output=True, text=True, check=False)


def test_offline_script_creates_a_database_the_store_opens(tmp_path: Path) -> None:
    path = tmp_path / "offline.sqlite"
    script = offline_script(f"url=sqlite:///{path}", f"now={T0}")
    assert not path.exists()  # generating reads nothing and creates nothing
    assert script.startswith(".bail on")
    ran = run_sqlite3(path, script)
    assert ran.returncode == 0, ran.stderr
    dumped = dump(path)
    assert dumped["fingerprint"] == SCHEMA_V6_FINGERPRINT
    assert (dumped["user_version"], dumped["application_id"]) == (6, SCHEDULER_APPLICATION_ID)
    assert [(r["version"], r["applied_at"]) for r in dumped["tables"]["migrations"]] == [
        (v, T0) for v in range(1, 7)
    ]
    assert not [name for name in catalog_names(path) if name.startswith("alembic")]
    open_store(path, clock=lambda: T0).close()
    assert current(path) == "v6 (head)"


def test_offline_script_from_a_revision_upgrades_like_open_store(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 3)
    script = offline_script(f"url=sqlite:///{path}", f"now={UPGRADE_NOW}", revision="v3:head")
    ran = run_sqlite3(path, script)
    assert ran.returncode == 0, ran.stderr
    expected = json.loads((REFERENCE_DBS / "v3.upgraded.json").read_text(encoding="utf-8"))
    assert diff(expected, dump(path)) == []


@pytest.mark.parametrize(
    ("version", "revision", "message"),
    [
        (6, "head", "needs a database without scheduler tables"),  # a from-empty script on a v6 file
        (4, "v2:head", "needs a v2 database"),  # a script for another version
        (1, "v1:head", "v2 authority backfill"),  # the backfill has rows to rewrite
    ],
)
def test_offline_script_refuses_at_run_time_and_changes_nothing(
    tmp_path: Path, version: int, revision: str, message: str
) -> None:
    path = copy_reference(tmp_path, version)
    before = digest(path)
    ran = run_sqlite3(path, offline_script(f"url=sqlite:///{path}", revision=revision))
    assert ran.returncode != 0 and message in ran.stderr, ran.stderr
    assert digest(path) == before


def test_stamp_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "stamp.sqlite"
    upgrade(path, "v2")
    before = digest(path)
    for revision in ("v3", "head", "base"):
        with pytest.raises(CommandError, match="stamp is refused"):
            command.stamp(alembic_config(f"url=sqlite:///{path}"), revision)
    assert digest(path) == before
    assert current(path) == "v2"


HOST_ENV = """
from alembic import context
import scheduler
from scheduler.revisions import refuse_stamp

engine = scheduler.sqlite_engine(context.config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    context.configure(connection=connection, on_version_apply=[refuse_stamp])
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""
HOST_REVISION = """
revision = {revision!r}
down_revision = {down!r}
branch_labels = {labels!r}
depends_on = {depends!r}


def upgrade() -> None:
    pass
"""


def host_config(root: Path, database: Path) -> Config:
    """A host application's Alembic environment with the scheduler branch mounted: its own
    revisions ``host_1`` (base, branch ``host``), ``host_2`` and ``host_3`` (depends on
    ``scheduler@v6``), and ``refuse_stamp`` installed."""
    versions = root / "versions"
    versions.mkdir(parents=True)
    (root / "env.py").write_text(HOST_ENV)
    for revision, down, labels, depends in (
        ("host_1", None, ("host",), None),
        ("host_2", "host_1", None, None),
        ("host_3", "host_2", None, "v6"),
    ):
        text = HOST_REVISION.format(revision=revision, down=down, labels=labels, depends=depends)
        (versions / f"{revision}.py").write_text(text)
    config = Config(stdout=io.StringIO())
    config.set_main_option("script_location", str(root))
    config.set_main_option("path_separator", "space")
    config.set_main_option("version_locations", f"{versions} {scheduler.alembic_version_location()}")
    config.set_main_option("sqlalchemy.url", str(database))
    config.attributes["configure_logger"] = False
    return config


def host_heads(database: Path) -> set[str]:
    with sqlite3.connect(database) as connection:
        return {row[0] for row in connection.execute("SELECT version_num FROM alembic_version")}


def test_stamp_judges_only_the_scheduler_branch_in_a_host_environment(tmp_path: Path) -> None:
    database = tmp_path / "host.sqlite"
    config = host_config(tmp_path / "host", database)
    command.upgrade(config, "host_2")
    command.upgrade(config, "scheduler@head")
    assert host_heads(database) == {"host_2", "v6"}
    command.stamp(config, "host_1")  # a host revision: the scheduler's v6 stays recorded
    command.stamp(config, "host_2")
    assert host_heads(database) == {"host_2", "v6"}
    command.stamp(config, "host_3")  # replaces the recorded v6 by a revision depending on it
    assert host_heads(database) == {"host_3"}
    before = every_row(database)
    for revision in ("scheduler@v3", "host_2"):  # both would move the scheduler's branch
        with pytest.raises(CommandError, match="stamp is refused"):
            command.stamp(config, revision)
    assert every_row(database) == before


def test_unsupported_url_is_refused() -> None:
    with pytest.raises(CommandError, match="SQLite and PostgreSQL"):
        command.upgrade(alembic_config("url=mysql://user@localhost/db"), "head")


def test_postgresql_schema_through_the_repository_environment(
    postgres_server: PostgresServer, pg_schema: str
) -> None:
    url = postgres_server.url.render_as_string(hide_password=False)
    x = (f"url={url}", f"scheduler_schema={pg_schema}", f"now={T0}")
    assert current_of(*x) == ""
    command.upgrade(alembic_config(*x), "v3")
    assert current_of(*x) == "v3"
    command.upgrade(alembic_config(*x), "head")
    assert current_of(*x) == "v6 (head)"
    with postgres_server.engine.connect() as connection:
        verify_schema(connection, 6, schema=pg_schema)
        applied = connection.exec_driver_sql(
            f'SELECT version, applied_at FROM "{pg_schema}".migrations ORDER BY version'
        ).all()
        leftovers = connection.exec_driver_sql(
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE tablename = 'alembic_version'"
        ).scalar_one()
    assert [tuple(row) for row in applied] == [(v, T0) for v in range(1, 7)]
    assert leftovers == 0
    with pytest.raises(CommandError, match="forward-only"):
        command.downgrade(alembic_config(*x), "v5")


def current_of(*x: str) -> str:
    out = io.StringIO()
    command.current(alembic_config(*x, stdout=out))
    return out.getvalue().strip()


def test_history_has_one_forward_chain() -> None:
    out = io.StringIO()
    command.history(alembic_config(stdout=out))
    edges = [line.split(",")[0].split(" (")[0] for line in out.getvalue().splitlines()]
    assert edges == ["v5 -> v6", "v4 -> v5", "v3 -> v4", "v2 -> v3", "v1 -> v2", "<base> -> v1"]
    heads = io.StringIO()
    command.heads(alembic_config(stdout=heads))
    assert heads.getvalue().split() == ["v6", "(scheduler)", "(head)"]


def test_command_line(tmp_path: Path) -> None:
    """The real CLI, from another working directory: ``alembic -c alembic.ini -x ... upgrade head``."""
    path = copy_reference(tmp_path, 3)
    env = {k: v for k, v in os.environ.items() if k != "SCHEDULER_DATABASE_URL"}
    base = [sys.executable, "-m", "alembic", "-c", str(ALEMBIC_INI), "-x", f"url=sqlite:///{path}"]
    run = subprocess.run(
        [*base, "-x", f"now={UPGRADE_NOW}", "upgrade", "head"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    expected = json.loads((REFERENCE_DBS / "v3.upgraded.json").read_text(encoding="utf-8"))
    assert diff(expected, dump(path)) == []
    shown = subprocess.run(
        [*base, "current"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == "v6 (head)"
    refused = subprocess.run(
        [*base, "downgrade", "v5"], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert refused.returncode != 0 and "forward-only" in refused.stderr
