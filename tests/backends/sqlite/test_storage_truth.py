"""Errors name the true cause (issue 15, item 6).

Contention, read-only media and I/O are SCHEDULER_STORAGE_UNAVAILABLE with the true storageCode
and API §8's retryable rule; SCHEDULER_SCHEMA_CORRUPT only when the catalog really differs.
Kind tests: real lock holders of every kind against open_store at every schema version, a fault
at every statement of open_store, and every SQLite result code against the classification.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hardening_support import (
    T0,
    create_database_at_version,
    enqueue_requests,
    expect_code,
    new_store,
    python_argv,
    raw_rows,
    read_only_media,
)
from sqlalchemy import create_engine, event

from scheduler import SchedulerKernelError, SchedulerStore, open_store

UNAVAILABLE = "SCHEDULER_STORAGE_UNAVAILABLE"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------- (a) contention at open


def test_a_healthy_v1_database_held_by_a_reader_is_busy_not_corrupt(tmp_path: Path) -> None:
    """The issue's input: open_store(busy_timeout_ms=500) while another connection reads."""
    path = tmp_path / "v1.sqlite"
    create_database_at_version(path, 1)
    digest = sha256(path)
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM jobs").fetchall()
    error = expect_code(UNAVAILABLE, lambda: open_store(path, busy_timeout_ms=500, clock=lambda: T0))
    assert error.details == {
        "phase": "open",
        "storageCode": "SQLITE_BUSY",
        "commitState": "not_committed",
        "retryable": True,
    }
    reader.execute("ROLLBACK")
    reader.close()
    assert sha256(path) == digest
    with open_store(path, busy_timeout_ms=500, clock=lambda: T0) as store:  # the retry succeeds
        assert store.schema_info().schema_version == 6


HOLDERS = {
    "reader": ["BEGIN", "SELECT count(*) FROM migrations"],
    "writer": ["BEGIN IMMEDIATE"],
    "exclusive": ["BEGIN EXCLUSIVE"],
}


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("holder", sorted(HOLDERS))
def test_every_lock_holder_at_every_version_is_contention(tmp_path: Path, version: int, holder: str) -> None:
    """Whatever another connection holds while a database needs work at open (upgrade, WAL
    switch): retryable SQLITE_BUSY, nothing changed, and the open succeeds once it is released."""
    path = tmp_path / f"v{version}.sqlite"
    create_database_at_version(path, version)
    digest = sha256(path)
    other = sqlite3.connect(path, isolation_level=None)
    for statement in HOLDERS[holder]:
        other.execute(statement).fetchall()
    error = expect_code(UNAVAILABLE, lambda: open_store(path, busy_timeout_ms=50, clock=lambda: T0))
    assert error.details is not None
    assert error.details["storageCode"] == "SQLITE_BUSY"
    assert error.details["commitState"] == "not_committed"
    assert error.details["retryable"] is True
    other.execute("ROLLBACK")
    other.close()
    assert sha256(path) == digest
    open_store(path, busy_timeout_ms=50, clock=lambda: T0).close()


# ----------------------------------------------------------------- a fault at every statement


def _fail_at(engine: Any, index: int, name: str) -> None:
    seen = {"count": 0}

    @event.listens_for(engine, "before_cursor_execute")
    def fail(*_args: Any) -> None:
        seen["count"] += 1
        if seen["count"] == index:
            error = sqlite3.OperationalError(f"simulated {name}")
            error.sqlite_errorname = name  # type: ignore[attr-defined]
            raise error


def _statements_of_open(path: Path) -> int:
    engine = create_engine(f"sqlite:///{path}")
    counted = {"count": 0}
    event.listen(
        engine, "before_cursor_execute", lambda *args: counted.__setitem__("count", counted["count"] + 1)
    )
    try:
        open_store(engine, clock=lambda: T0).close()
    finally:
        engine.dispose()
    return counted["count"]


FAULTS = ["SQLITE_IOERR_READ", "SQLITE_BUSY", "SQLITE_CANTOPEN", "SQLITE_READONLY_DBMOVED", "SQLITE_FULL"]


@pytest.mark.parametrize("version", [1, 6])
def test_a_storage_fault_at_any_statement_of_open_is_never_schema_corrupt(
    tmp_path: Path, version: int
) -> None:
    template = tmp_path / "template.sqlite"
    create_database_at_version(template, version)
    probe = tmp_path / "probe.sqlite"
    shutil.copyfile(template, probe)
    statements = _statements_of_open(probe)
    assert statements > 10
    for index in range(1, statements + 1):
        name = FAULTS[index % len(FAULTS)]
        path = tmp_path / f"fault-{index}.sqlite"
        shutil.copyfile(template, path)
        path.chmod(0o600)
        engine = create_engine(f"sqlite:///{path}")
        _fail_at(engine, index, name)
        try:
            with pytest.raises(SchedulerKernelError) as caught:
                open_store(engine, clock=lambda: T0)
        finally:
            engine.dispose()
        error = caught.value
        assert error.code == UNAVAILABLE, (index, name, error)
        assert error.details is not None and error.details["storageCode"] == "_".join(name.split("_")[:2])
        assert error.details["retryable"] is (
            name == "SQLITE_BUSY" and error.details["commitState"] == "not_committed"
        )
        if error.details["commitState"] == "not_committed":
            assert sha256(path) == sha256(template), (index, name)


# ----------------------------------------------------------------- every result code


STORAGE_CODES = [
    "SQLITE_FULL",
    "SQLITE_IOERR_WRITE",
    "SQLITE_IOERR_FSYNC",
    "SQLITE_READONLY",
    "SQLITE_READONLY_DBMOVED",
    "SQLITE_CANTOPEN",
    "SQLITE_CANTOPEN_ISDIR",
    "SQLITE_PERM",
    "SQLITE_NOMEM",
    "SQLITE_NOLFS",
    "SQLITE_PROTOCOL",
]
CONTENTION = ["SQLITE_BUSY", "SQLITE_BUSY_RECOVERY", "SQLITE_LOCKED", "SQLITE_LOCKED_SHAREDCACHE"]
NOT_STORAGE = ["SQLITE_CONSTRAINT_CHECK", "SQLITE_MISMATCH", "SQLITE_ERROR", "SQLITE_INTERRUPT"]


def _expected_code(name: str) -> str:
    return "SQLITE_BUSY_SNAPSHOT" if name == "SQLITE_BUSY_SNAPSHOT" else "_".join(name.split("_")[:2])


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[str, SchedulerStore]]:
    path = tmp_path / "k.sqlite"
    owned = new_store(path)
    engine = create_engine(f"sqlite:///{path}")
    connection = engine.connect()
    try:
        yield {"owned": owned, "on_connection": SchedulerStore.on_connection(connection, clock=lambda: T0)}
    finally:
        connection.close()
        engine.dispose()
        owned.close()


@pytest.mark.parametrize("kind", ["owned", "on_connection", "block"])
@pytest.mark.parametrize("name", [*STORAGE_CODES, *CONTENTION, "SQLITE_BUSY_SNAPSHOT", *NOT_STORAGE])
def test_every_result_code_is_classified_by_the_rule(
    stores: dict[str, SchedulerStore], kind: str, name: str
) -> None:
    store = stores["owned" if kind == "block" else kind]

    def fail(*_args: Any) -> None:
        error = sqlite3.OperationalError(f"simulated {name}")
        error.sqlite_errorname = name  # type: ignore[attr-defined]
        raise error

    def call() -> Any:
        if kind == "block":
            with store.transaction() as tx:
                event.listen(store.connection, "before_cursor_execute", fail)
                return tx.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="k")
        event.listen(store.connection, "before_cursor_execute", fail)
        return store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="k")

    try:
        with pytest.raises(Exception) as caught:
            call()
    finally:
        event.remove(store.connection, "before_cursor_execute", fail)
    error = caught.value
    if name in NOT_STORAGE:
        assert not (isinstance(error, SchedulerKernelError) and error.code == UNAVAILABLE)
        return
    assert isinstance(error, SchedulerKernelError) and error.code == UNAVAILABLE, error
    details = error.details
    assert details is not None
    assert details["storageCode"] == _expected_code(name)
    assert details["commitState"] == "not_committed"
    owned_contention = kind == "owned" and name in CONTENTION
    assert details["retryable"] is owned_contention


# ----------------------------------------------------------------- (c) busy snapshot


@contextmanager
def _stale_snapshot_connection(path: Path) -> Iterator[Any]:
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("BEGIN")  # deferred: the snapshot starts at the first read
            connection.exec_driver_sql("SELECT count(*) FROM jobs").all()
            yield connection
    finally:
        engine.dispose()


def test_a_busy_snapshot_is_not_retryable_and_says_to_restart(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    new_store(path).close()
    committer = open_store(path, clock=lambda: T0)
    with _stale_snapshot_connection(path) as connection:
        committer.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="elsewhere")
        store = SchedulerStore.on_connection(connection, clock=lambda: T0)
        error = expect_code(
            UNAVAILABLE,
            lambda: store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="mine"),
        )
        assert error.details == {
            "phase": "write",
            "storageCode": "SQLITE_BUSY_SNAPSHOT",
            "commitState": "not_committed",
            "retryable": False,
        }
        assert "restart" in error.message
        connection.rollback()
        with connection.begin():  # the restarted transaction succeeds
            store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="mine")
    committer.close()
    assert sorted(raw_rows(path, "SELECT trigger_key FROM occurrences")) == [("elsewhere",), ("mine",)]


def test_plain_contention_inside_a_callers_transaction_is_not_retryable(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    new_store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.05})
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("BEGIN")
            store = SchedulerStore.on_connection(connection, clock=lambda: T0)

            def in_block() -> None:
                with store.transaction() as tx:
                    tx.enqueue_many(enqueue_requests("y", 2))

            for call in (
                lambda: store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="x"),
                in_block,
            ):
                error = expect_code(UNAVAILABLE, call)
                assert error.details is not None
                assert error.details["storageCode"] == "SQLITE_BUSY" and error.details["retryable"] is False
            connection.rollback()
    finally:
        engine.dispose()
        holder.execute("ROLLBACK")
        holder.close()


# ----------------------------------------------------------------- (b) read-only media

READ_COMMANDS = [
    ["verify"],
    ["info"],
    ["history"],
    ["jobs", "list"],
    ["jobs", "show", "job-a"],
    ["occurrences", "list"],
    ["occurrences", "show", "OCCURRENCE"],
    ["dead-letters"],
    ["adjudication", "list"],
    ["adjudication", "show", "OCCURRENCE"],
    ["migrations", "list"],
    ["controls", "list"],
    ["stats"],
]

MEDIA_SCRIPT = """
import json, sys
from typer.testing import CliRunner
from scheduler import open_store, SchedulerKernelError
from scheduler.cli import app
path, commands = sys.argv[1], json.loads(sys.argv[2])
report = {}
try:
    open_store(path)
    report["open"] = "opened"
except SchedulerKernelError as error:
    report["open"] = {"code": error.code, "details": error.details}
runner = CliRunner()
report["commands"] = []
for command in commands:
    result = runner.invoke(app, [*command, "--db", path, "--json"])
    report["commands"].append({"command": command, "exit": result.exit_code, "output": result.stdout})
print(json.dumps(report))
"""


def _on_media(directory: Path, database: Path, commands: list[list[str]]) -> dict[str, Any]:
    with read_only_media(directory) as run:
        result = run([*python_argv(MEDIA_SCRIPT), str(database), json.dumps(commands)])
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def _backup_to(directory: Path, name: str) -> tuple[Path, str]:
    """A populated v6 database copied with the SQLite backup API (one file, WAL mode, no sidecars),
    and the id of one of its occurrences."""
    live = directory.parent / f"live-{name}"
    store = new_store(live)
    occurrence = store.enqueue_many(enqueue_requests("m", 3))[0]
    directory.mkdir(mode=0o700)
    target = directory / name
    source, copy = sqlite3.connect(live), sqlite3.connect(target)
    try:
        source.backup(copy)
    finally:
        source.close()
        copy.close()
    store.close()
    target.chmod(0o600)
    for leftover in directory.iterdir():
        if leftover != target:
            leftover.unlink()
    return target, occurrence.id


def test_a_healthy_database_on_read_only_media(tmp_path: Path) -> None:
    directory = tmp_path / "media"
    path, occurrence_id = _backup_to(directory, "kernel.sqlite")
    digest = sha256(path)
    commands = [[occurrence_id if part == "OCCURRENCE" else part for part in c] for c in READ_COMMANDS]
    report = _on_media(directory, path, commands)
    opened = report["open"]
    assert opened["code"] == UNAVAILABLE, opened
    assert opened["details"]["storageCode"] in {"EROFS", "EACCES"}
    assert opened["details"]["commitState"] == "not_committed"
    assert opened["details"]["retryable"] is False
    for outcome in report["commands"]:
        assert outcome["exit"] == 0, outcome
    by_name = {" ".join(o["command"][:2]): json.loads(o["output"]) for o in report["commands"]}
    assert by_name["verify"]["ok"] is True
    assert by_name["info"]["journalMode"] == "wal"
    assert by_name["info"]["tables"]["occurrences"] == 3
    assert [job["id"] for job in by_name["jobs list"]["jobs"]] == ["job-a"]
    assert by_name["history"]["count"] == 4
    assert by_name["occurrences show"]["occurrence"]["id"] == occurrence_id
    assert by_name["adjudication show"]["case"]["occurrenceId"] == occurrence_id
    assert sha256(path) == digest
    assert sorted(entry.name for entry in directory.iterdir()) == ["kernel.sqlite"]


def test_a_live_copy_with_its_sidecars_on_read_only_media(tmp_path: Path) -> None:
    """Main file, -wal and -shm copied together: the store refuses to open it for writing (it
    would be read-only), and the read commands see the committed writes held in the -wal."""
    source = tmp_path / "live.sqlite"
    store = new_store(source)
    store.enqueue_many(enqueue_requests("w", 4))
    directory = tmp_path / "media"
    directory.mkdir(mode=0o700)
    path = directory / "copy.sqlite"
    for suffix in ("", "-wal", "-shm"):
        shutil.copyfile(f"{source}{suffix}", f"{path}{suffix}")
    store.close()
    report = _on_media(directory, path, [["info"], ["jobs", "list"]])
    assert report["open"]["code"] == UNAVAILABLE, report["open"]
    assert report["open"]["details"]["storageCode"] in {"EROFS", "EACCES"}
    for outcome in report["commands"]:
        assert outcome["exit"] == 0, outcome
    assert json.loads(report["commands"][0]["output"])["tables"]["occurrences"] == 4


def test_an_old_database_on_read_only_media(tmp_path: Path) -> None:
    directory = tmp_path / "media"
    directory.mkdir(mode=0o700)
    path = directory / "v1.sqlite"
    create_database_at_version(path, 1)
    report = _on_media(directory, path, [["verify"]])
    assert report["open"]["code"] == UNAVAILABLE, report["open"]
    assert report["commands"][0]["exit"] == 0
    assert json.loads(report["commands"][0]["output"])["schemaVersion"] == 1


def test_a_wal_without_its_shm_on_read_only_media_is_refused_truthfully(tmp_path: Path) -> None:
    """``immutable`` would ignore the committed writes in the -wal: the read is refused."""
    source = tmp_path / "live.sqlite"
    store = new_store(source)
    store.enqueue_many(enqueue_requests("w", 4))
    directory = tmp_path / "media"
    directory.mkdir(mode=0o700)
    path = directory / "copy.sqlite"
    shutil.copyfile(source, path)
    shutil.copyfile(f"{source}-wal", f"{path}-wal")
    store.close()
    report = _on_media(directory, path, [["verify"], ["jobs", "list"]])
    for outcome in report["commands"]:
        assert outcome["exit"] == 1, outcome
        error = json.loads(outcome["output"])["error"]
        assert error["code"] == UNAVAILABLE, error
        assert error["details"]["storageCode"] in {"SQLITE_CANTOPEN", "SQLITE_READONLY"}
