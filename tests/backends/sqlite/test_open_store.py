"""open_store: create, upgrade, refuse, secure, pragmas, close (API.md §1, issue 2)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from dump import diff, dump
from recorded import T0, UPGRADE_NOW, copy_reference, reference_dump
from sqlalchemy import create_engine

from scheduler import SchedulerKernelError, open_store
from scheduler.schema import SCHEMA_V6_FINGERPRINT, schema_fingerprint
from scheduler.store.opening import default_database_path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fresh(tmp_path: Path, name: str = "kernel.sqlite") -> Path:
    return tmp_path / name


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
def test_reference_database_upgrades_exactly_like_the_original(tmp_path: Path, version: int) -> None:
    db = copy_reference(tmp_path, version, "kernel.sqlite")
    with open_store(db, clock=lambda: UPGRADE_NOW) as store:
        assert store.schema_info().schema_version == 6
    assert diff(reference_dump(version, upgraded=True), dump(db)) == []


def test_empty_database_is_created_at_v6_in_one_transaction(tmp_path: Path) -> None:
    db = fresh(tmp_path)
    with open_store(db, clock=lambda: T0) as store:
        info = store.schema_info().to_dict()
        assert info["applicationId"] == 0x4343534B
        assert info["schemaVersion"] == 6
        assert info["migration"]["version"] == 6
        assert info["migration"]["appliedAt"] == T0
        assert schema_fingerprint(store.connection) == SCHEMA_V6_FINGERPRINT
    with sqlite3.connect(db) as raw:
        rows = raw.execute("SELECT version, applied_at FROM migrations ORDER BY version").fetchall()
    assert rows == [(v, T0) for v in range(1, 7)]


def test_pragmas_and_owner_only_files(tmp_path: Path) -> None:
    directory = tmp_path / "nested" / "dir"
    db = directory / "kernel.sqlite"
    with open_store(db, clock=lambda: T0) as store:
        conn = store.connection
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        conn.commit()
        store.create_job(id="j", kind="routine", authority={"principal": {"type": "user", "id": "u"}})
        for candidate in directory.iterdir():
            assert candidate.stat().st_mode & 0o777 == 0o600, candidate
    assert directory.stat().st_mode & 0o777 == 0o700


def test_reopen_is_a_noop_and_keeps_data(tmp_path: Path) -> None:
    db = fresh(tmp_path)
    with open_store(db, clock=lambda: T0) as store:
        store.create_job(id="j", kind="routine", authority={"principal": {"type": "user", "id": "u"}})
    before = dump(db)
    with open_store(db, clock=lambda: T0 + 5) as store:
        job = store.get_job("j")
        assert job is not None and job.revision == 1
    assert dump(db) == before


def _tamper(db: Path, sql: str) -> None:
    raw = sqlite3.connect(db)
    raw.executescript(sql)
    raw.close()


TAMPERS = {
    "added trigger": "CREATE TRIGGER t AFTER INSERT ON jobs BEGIN SELECT 1; END;",
    "added view": "CREATE VIEW v AS SELECT * FROM jobs;",
    "added index": "CREATE INDEX scheduler_extra ON jobs(kind);",
    "added table": "CREATE TABLE extra (x INTEGER);",
    "dropped index": "DROP INDEX scheduler_occurrences_job;",
    "foreign application id": "PRAGMA application_id = 1234;",
    "unknown user_version": "PRAGMA user_version = 7;",
    "broken migration checksum": "UPDATE migrations SET checksum = 'x' WHERE version = 3;",
    "missing migration row": "DELETE FROM migrations WHERE version = 6;",
    "changed CHECK": (
        "PRAGMA writable_schema = ON; UPDATE sqlite_master SET sql = replace(sql, 'revision >= 1', "
        "'revision >= 0') WHERE name = 'jobs'; PRAGMA writable_schema = OFF;"
    ),
}


@pytest.mark.parametrize("case", sorted(TAMPERS))
def test_catalog_drift_is_refused_and_the_file_left_untouched(tmp_path: Path, case: str) -> None:
    db = fresh(tmp_path)
    open_store(db, clock=lambda: T0).close()
    _tamper(db, TAMPERS[case])
    before = sha256(db)
    with pytest.raises(SchedulerKernelError) as raised:
        open_store(db, clock=lambda: T0)
    assert raised.value.code in {"SCHEDULER_SCHEMA_UNKNOWN", "SCHEDULER_SCHEMA_CORRUPT"}
    assert sha256(db) == before


def test_non_empty_database_without_migrations_is_refused(tmp_path: Path) -> None:
    db = fresh(tmp_path)
    _tamper(db, "CREATE TABLE app (x INTEGER); INSERT INTO app VALUES (1);")
    before = sha256(db)
    with pytest.raises(SchedulerKernelError) as raised:
        open_store(db, clock=lambda: T0)
    assert raised.value.code == "SCHEDULER_SCHEMA_UNKNOWN"
    assert raised.value.details == {"tables": ["app"]}
    assert sha256(db) == before


def test_drifted_old_version_is_refused_before_any_upgrade(tmp_path: Path) -> None:
    db = copy_reference(tmp_path, 2, "kernel.sqlite")
    _tamper(db, "CREATE VIEW v AS SELECT 1;")
    before = sha256(db)
    with pytest.raises(SchedulerKernelError) as raised:
        open_store(db, clock=lambda: UPGRADE_NOW)
    assert raised.value.code == "SCHEDULER_SCHEMA_CORRUPT"
    assert sha256(db) == before


def test_symlinked_database_path_is_insecure(tmp_path: Path) -> None:
    real = fresh(tmp_path, "real.sqlite")
    open_store(real, clock=lambda: T0).close()
    link = tmp_path / "link.sqlite"
    link.symlink_to(real)
    with pytest.raises(SchedulerKernelError) as raised:
        open_store(link, clock=lambda: T0)
    assert raised.value.code == "SCHEDULER_STORAGE_INSECURE"


def test_world_writable_directory_is_insecure(tmp_path: Path) -> None:
    directory = tmp_path / "shared-dir"
    directory.mkdir()
    directory.chmod(0o777)
    with pytest.raises(SchedulerKernelError) as raised:
        open_store(directory / "kernel.sqlite", clock=lambda: T0)
    assert raised.value.code == "SCHEDULER_STORAGE_INSECURE"
    assert not (directory / "kernel.sqlite").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_directory_of_another_user_is_insecure(tmp_path: Path) -> None:
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o700)
    os.chown(directory, 65534, 65534)
    with pytest.raises(SchedulerKernelError) as raised:
        open_store(directory / "kernel.sqlite", clock=lambda: T0)
    assert raised.value.code == "SCHEDULER_STORAGE_INSECURE"


def test_existing_group_readable_file_is_made_owner_only(tmp_path: Path) -> None:
    db = fresh(tmp_path)
    open_store(db, clock=lambda: T0).close()
    db.chmod(0o644)
    open_store(db, clock=lambda: T0).close()
    assert db.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_a_refused_file_keeps_its_mode_and_bytes(tmp_path: Path, mode: int) -> None:
    db = tmp_path / "app.sqlite"
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    con.execute("PRAGMA journal_mode = WAL")
    con.close()
    db.chmod(mode)
    before = db.read_bytes()
    with pytest.raises(SchedulerKernelError) as raised:
        open_store(db, clock=lambda: T0)
    assert raised.value.code == "SCHEDULER_SCHEMA_UNKNOWN"
    assert db.stat().st_mode & 0o777 == mode
    assert db.read_bytes() == before


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"clock": 5}, "clock"),
        ({"clock": lambda: -1}, "clock"),
        ({"clock": lambda: 1.5}, "clock"),
        ({"clock": lambda: 2**53}, "clock"),
        ({"busy_timeout_ms": -1}, "busy"),
        ({"busy_timeout_ms": 60_001}, "busy"),
        ({"busy_timeout_ms": 5.0}, "busy"),
        ({"busy_timeout_ms": True}, "busy"),
        ({"uuid_factory": "x"}, "uuid"),
    ],
)
def test_bad_options_are_invalid_arguments_and_create_nothing(
    tmp_path: Path, options: dict[str, Any], field: str
) -> None:
    db = fresh(tmp_path)
    options.setdefault("clock", lambda: T0)
    with pytest.raises(SchedulerKernelError) as raised:
        open_store(db, **options)
    assert raised.value.code == "SCHEDULER_INVALID_ARGUMENT", field
    assert not db.exists()


@pytest.mark.parametrize("spelling", ["path", "pathlike", "url"])
def test_a_path_with_a_nul_character_is_an_invalid_argument(tmp_path: Path, spelling: str) -> None:
    raw = f"{tmp_path}/kernel\x00.sqlite"
    target: Any = {"path": raw, "pathlike": Path(raw), "url": f"sqlite:///{raw}"}[spelling]
    with pytest.raises(SchedulerKernelError) as raised:
        open_store(target, clock=lambda: T0)
    assert raised.value.code == "SCHEDULER_INVALID_ARGUMENT"
    assert list(tmp_path.iterdir()) == []


def test_close_is_idempotent_and_later_calls_are_refused(tmp_path: Path) -> None:
    store = open_store(fresh(tmp_path), clock=lambda: T0)
    store.close()
    store.close()
    with pytest.raises(SchedulerKernelError) as raised:
        store.get_job("j")
    assert raised.value.code == "SCHEDULER_STORE_CLOSED"
    with pytest.raises(SchedulerKernelError) as invalid:  # a write validates before the closed check
        store.create_job(id="", kind="k", authority={"principal": {"type": "t", "id": "i"}})
    assert invalid.value.code == "SCHEDULER_INVALID_ARGUMENT"
    with pytest.raises(SchedulerKernelError) as read:  # a read checks the store first (seed)
        store.get_job("")
    assert read.value.code == "SCHEDULER_STORE_CLOSED"


def test_memory_url_and_engine_targets(tmp_path: Path) -> None:
    with open_store(":memory:", clock=lambda: T0) as store:
        assert store.schema_info().schema_version == 6
        store.create_job(id="m", kind="routine", authority={"principal": {"type": "user", "id": "u"}})
        assert store.get_job("m") is not None
    url_db = fresh(tmp_path, "url.sqlite")
    with open_store(f"sqlite:///{url_db}", clock=lambda: T0) as store:
        assert store.schema_info().schema_version == 6
    assert url_db.stat().st_mode & 0o777 == 0o600
    engine = create_engine(f"sqlite:///{fresh(tmp_path, 'engine.sqlite')}")
    with open_store(engine, clock=lambda: T0) as store:
        assert store.schema_info().schema_version == 6
    engine.dispose()


def test_default_path_honours_scheduler_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_HOME", str(tmp_path / "home"))
    assert default_database_path() == (tmp_path / "home" / "kernel-v1.sqlite").resolve()
    with open_store(None, clock=lambda: T0) as store:
        assert store.schema_info().schema_version == 6
    assert (tmp_path / "home" / "kernel-v1.sqlite").exists()
    monkeypatch.delenv("SCHEDULER_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert default_database_path() == (tmp_path / "user" / ".scheduler" / "kernel-v1.sqlite").resolve()


def test_symlinked_database_directory_is_insecure(tmp_path: Path) -> None:
    real = tmp_path / "real-dir"
    real.mkdir(mode=0o700)
    link = tmp_path / "link-dir"
    link.symlink_to(real, target_is_directory=True)
    with pytest.raises(SchedulerKernelError) as raised:
        open_store(link / "kernel.sqlite", clock=lambda: T0)
    assert raised.value.code == "SCHEDULER_STORAGE_INSECURE"
    assert list(real.iterdir()) == []


def test_engine_with_the_pysqlite_begin_recipe_is_supported(tmp_path: Path) -> None:
    from sqlalchemy import event, text

    engine = create_engine(f"sqlite:///{fresh(tmp_path)}")

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    with open_store(engine, clock=lambda: T0) as store:
        store.create_job(id="j", kind="routine", authority={"principal": {"type": "user", "id": "u"}})
        assert store.get_job("j") is not None
        assert store.connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar() == 1
    engine.dispose()
