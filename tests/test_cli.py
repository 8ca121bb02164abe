"""The ``scheduler`` command line: every command, its exit codes and its ``--json`` keys.

The read commands' tests (``db``) run on both backends (``place``: a SQLite file, or a
PostgreSQL schema selected with ``--db URL --schema NAME``); tests that read or tamper with the
file, or use the recorded reference ``.sqlite`` files, are SQLite-only (``sqlite_only``, or no
``db``); ``test_cli_postgresql`` covers init/upgrade/verify on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import pytest
from cli_support import decide_arguments, invoke, run_json, sha256
from cli_support import isolated_environment as isolated_environment
from recorded import copy_reference, reference_dump
from store_places import PostgresSchemaPlace, SqliteFilePlace, StorePlace, sqlite_only

from scheduler.cli.operator import DecisionName, MigrationStateName
from scheduler.contract.constants import (
    CONFIRMED_APPLIED,
    CONFIRMED_NOT_APPLIED,
    SCHEDULER_MIGRATION_STATES,
)
from scheduler.schema import SCHEMA_V6_FINGERPRINT, SCHEMA_V6_PG_FINGERPRINT
from scheduler.testing import T0, SchedulerClock

AUTHORITY = {"principal": {"type": "service", "id": "cli-test"}, "requestedCapabilities": ["report.run"]}


@dataclass(frozen=True)
class CliDb:
    """Where a read-command test's database lives (``place``): ``opts`` are the global options
    that select it (``--db PATH``; PostgreSQL: ``--db URL --schema NAME``)."""

    place: StorePlace
    opts: tuple[str, ...]

    @property
    def path(self) -> Path:
        """The SQLite file (tests that read the file itself are SQLite-only)."""
        assert isinstance(self.place, SqliteFilePlace), "a SQLite-only test"
        return self.place.path


@pytest.fixture
def db(place: StorePlace) -> CliDb:
    """A v6 database with two jobs, one queued occurrence and one outcome-unknown dead letter."""
    clock = SchedulerClock()
    if isinstance(place, SqliteFilePlace):
        place = SqliteFilePlace(place.path.parent / "data" / "kernel.sqlite")
    with place.open(clock=clock) as store:
        store.create_job(id="job-a", kind="report", authority=AUTHORITY)
        store.create_job(id="job-b", kind="agenda", authority=AUTHORITY, max_attempts=1)
        clock.advance(1000)
        store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="first")
        doomed = store.enqueue_occurrence(job_id="job-b", scheduled_for=T0, trigger_key="second")
        clock.advance(1000)
        claimed = store.claim_occurrence(occurrence_id=doomed.id, owner_id="worker", lease_ms=60_000)
        assert claimed is not None
        store.settle(
            occurrence_id=claimed.id,
            owner_id="worker",
            fence=claimed.fence,
            outcome="failed",
            error={"code": "REMOTE_OUTCOME_UNKNOWN", "message": "connection reset"},
            retryable=False,
        )
    if isinstance(place, PostgresSchemaPlace):
        url = place.server.url.render_as_string(hide_password=False)
        return CliDb(place, ("--db", url, "--schema", place.schema))
    return CliDb(place, ("--db", str(place.path)))


def occurrence_ids(db: CliDb) -> dict[str, str]:
    return dict(db.place.sql("SELECT trigger_key, occurrence_id FROM occurrences"))


# ----------------------------------------------------------------- init / upgrade


def test_init_creates_v6_and_reports_versions_and_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "new" / "kernel.sqlite"
    result = run_json("init", "--db", str(path))
    assert set(result) == {"database", "fromVersion", "toVersion", "steps", "dryRun", "fingerprint"}
    assert (result["fromVersion"], result["toVersion"], result["dryRun"]) == (0, 6, False)
    assert [step["version"] for step in result["steps"]] == [1, 2, 3, 4, 5, 6]
    assert result["fingerprint"] == SCHEMA_V6_FINGERPRINT
    assert path.is_file() and (path.stat().st_mode & 0o777) == 0o600
    again = run_json("init", "--db", str(path))
    assert (again["fromVersion"], again["toVersion"], again["steps"]) == (6, 6, [])


def test_init_text_output_names_the_versions(tmp_path: Path) -> None:
    result = invoke("init", "--db", str(tmp_path / "k.sqlite"))
    assert result.exit_code == 0
    assert "v0 -> v6" in result.stdout and SCHEMA_V6_FINGERPRINT in result.stdout


def test_init_dry_run_and_sql_write_nothing(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    dry = run_json("init", "--db", str(path), "--dry-run")
    assert dry["dryRun"] is True and dry["fingerprint"] is None
    assert dry["steps"][0]["name"] == "scheduler-kernel-v1"
    sql = invoke("init", "--db", str(path), "--sql")
    assert sql.exit_code == 0
    assert "CREATE TABLE jobs" in sql.stdout and "CREATE TABLE scheduler_occurrence_controls" in sql.stdout
    steps = run_json("init", "--db", str(path), "--sql")["steps"]
    assert [set(step) for step in steps] == [{"version", "name", "checksum", "sql"}] * 6
    assert not path.exists() and not path.parent.joinpath("k.sqlite-wal").exists()


def test_upgrade_takes_a_v3_database_to_v6(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 3)
    before = sha256(path)
    dry = run_json("upgrade", "--db", str(path), "--dry-run")
    assert dry["fromVersion"] == 3 and [step["version"] for step in dry["steps"]] == [4, 5, 6]
    assert sha256(path) == before
    sql = invoke("upgrade", "--db", str(path), "--sql")
    assert "CREATE TABLE scheduler_occurrence_controls" in sql.stdout
    assert "CREATE TABLE jobs" not in sql.stdout
    assert sha256(path) == before
    done = run_json("upgrade", "--db", str(path))
    assert (done["fromVersion"], done["toVersion"], done["fingerprint"]) == (3, 6, SCHEMA_V6_FINGERPRINT)
    assert run_json("verify", "--db", str(path))["ok"] is True


def test_upgrade_needs_an_existing_database(tmp_path: Path) -> None:
    path = tmp_path / "missing.sqlite"
    result = invoke("upgrade", "--db", str(path))
    assert result.exit_code == 1
    assert "SCHEDULER_NOT_FOUND" in result.stderr
    assert not path.exists()


def test_upgrade_refuses_a_foreign_database_untouched(tmp_path: Path) -> None:
    path = tmp_path / "foreign.sqlite"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    before = sha256(path)
    error = run_json("upgrade", "--db", str(path), exit_code=1)["error"]
    assert error["code"] == "SCHEDULER_SCHEMA_UNKNOWN" and error["details"] == {"tables": ["notes"]}
    assert sha256(path) == before


# ----------------------------------------------------------------- verify


@sqlite_only
def test_verify_is_read_only_and_reports_every_check(db: CliDb) -> None:
    before = sha256(db.path)
    result = run_json(*db.opts, "verify")
    assert set(result) == {
        "database",
        "ok",
        "schemaVersion",
        "userVersion",
        "checkedAs",
        "latestVersion",
        "fingerprint",
        "expectedFingerprint",
        "checks",
        "findings",
    }
    assert result["ok"] is True and result["findings"] == []
    assert result["fingerprint"] == result["expectedFingerprint"] == SCHEMA_V6_FINGERPRINT
    names = [check["name"] for check in result["checks"]]
    assert {
        "integrity",
        "tables",
        "identity",
        "fingerprint",
        "migration-history",
        "indexes",
        "foreign-keys",
    } <= set(names)
    assert "columns:occurrences" in names
    assert sha256(db.path) == before
    assert invoke(*db.opts, "verify").exit_code == 0
    assert sha256(db.path) == before


@sqlite_only
def test_verify_fails_on_an_added_trigger_without_touching_the_file(db: CliDb, tmp_path: Path) -> None:
    tampered = tmp_path / "tampered.sqlite"
    shutil.copyfile(db.path, tampered)
    with sqlite3.connect(tampered) as connection:
        connection.execute("CREATE TRIGGER sneaky AFTER INSERT ON jobs BEGIN SELECT 1; END")
    before = sha256(tampered)
    result = run_json("verify", "--db", str(tampered), exit_code=1)
    assert result["ok"] is False
    assert [(f["check"], f["code"]) for f in result["findings"]] == [
        ("fingerprint", "SCHEDULER_SCHEMA_CORRUPT")
    ]
    assert sha256(tampered) == before
    text = invoke("verify", "--db", str(tampered))
    assert text.exit_code == 1 and "FAIL fingerprint" in text.stdout


@sqlite_only
def test_verify_collects_several_findings(db: CliDb) -> None:
    with sqlite3.connect(db.path) as connection:
        connection.execute("CREATE INDEX scheduler_extra ON jobs(kind)")
        connection.execute("UPDATE migrations SET checksum = 'x' WHERE version = 3")
    findings = run_json(*db.opts, "verify", exit_code=1)["findings"]
    assert {(f["check"], f["code"]) for f in findings} == {
        ("fingerprint", "SCHEDULER_SCHEMA_CORRUPT"),
        ("migration-history", "SCHEDULER_SCHEMA_UNKNOWN"),
        ("indexes", "SCHEDULER_SCHEMA_CORRUPT"),
    }


def test_verify_missing_and_empty_databases(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sqlite"
    assert invoke("verify", "--db", str(missing)).exit_code == 1
    assert not missing.exists()
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    result = run_json("verify", "--db", str(empty), exit_code=1)
    assert [f["message"] for f in result["findings"]] == ["the database is empty (run `scheduler init`)"]


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(bytes(range(256)) * 20)
    before = sha256(garbage)
    findings = run_json("verify", "--db", str(garbage), exit_code=1)["findings"]
    assert [(f["check"], f["code"]) for f in findings] == [("integrity", "SCHEDULER_SCHEMA_CORRUPT")]
    assert run_json("info", "--db", str(garbage), exit_code=1)["error"]["code"] == "CLI_DATABASE_ERROR"
    assert (
        run_json("upgrade", "--db", str(garbage), exit_code=1)["error"]["code"] == "SCHEDULER_SCHEMA_CORRUPT"
    )
    assert sha256(garbage) == before


def test_verify_accepts_an_older_version_and_says_an_upgrade_is_pending(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 5)
    result = invoke("verify", "--db", str(path))
    assert result.exit_code == 0 and "upgrade to v6 is pending" in result.stdout
    assert run_json("verify", "--db", str(path))["schemaVersion"] == 5


# ----------------------------------------------------------------- info


def test_info_reports_versions_counts_and_files(db: CliDb) -> None:
    info = run_json(*db.opts, "info")
    keys = {"database", "integrity", "files", "journalMode", "versions", "fingerprint", "migrations"}
    keys |= {"tables", "occurrences"}
    if isinstance(db.place, PostgresSchemaPlace):  # no files, no journal mode, no quick_check
        assert set(info) == keys | {"schema"}
        assert info["schema"] == db.place.schema and info["database"].endswith(f"(schema {db.place.schema})")
        assert (info["files"], info["journalMode"]) == ({}, None)
        assert info["integrity"] == {"ok": True, "checked": False}
        assert info["versions"]["postgresql"] and info["versions"]["applicationId"] is None
        fingerprint = SCHEMA_V6_PG_FINGERPRINT
    else:
        assert set(info) == keys
        assert info["journalMode"] == "wal"
        assert info["files"][db.path.name] == db.path.stat().st_size
        assert info["versions"]["applicationId"] == 0x4343534B
        fingerprint = SCHEMA_V6_FINGERPRINT
    assert info["versions"]["schema"] == 6
    assert info["fingerprint"] == {"actual": fingerprint, "expected": fingerprint, "matches": True}
    assert [row["version"] for row in info["migrations"]] == [1, 2, 3, 4, 5, 6]
    assert info["tables"]["jobs"] == 2 and info["tables"]["occurrences"] == 2
    assert info["occurrences"] == {
        "queued": 1,
        "running": 0,
        "retry_wait": 0,
        "succeeded": 0,
        "dead_letter": 1,
    }
    assert "occurrences per status" in invoke(*db.opts, "info").stdout


# ----------------------------------------------------------------- jobs, occurrences, history


def test_jobs_list_and_show(db: CliDb) -> None:
    listed = run_json(*db.opts, "jobs", "list")
    assert set(listed) == {"jobs", "count", "limit"}
    assert [job["id"] for job in listed["jobs"]] == ["job-a", "job-b"]
    assert run_json(*db.opts, "jobs", "list", "--kind", "agenda")["jobs"][0]["id"] == "job-b"
    assert run_json(*db.opts, "jobs", "list", "--limit", "1")["count"] == 1
    shown = run_json(*db.opts, "jobs", "show", "job-b")
    assert set(shown) == {"job", "occurrences"}
    assert shown["job"]["maxAttempts"] == 1 and shown["occurrences"]["dead_letter"] == 1
    assert "job-a" in invoke(*db.opts, "jobs", "list").stdout


def test_jobs_show_unknown_is_exit_1_with_a_json_error(db: CliDb) -> None:
    error = run_json(*db.opts, "jobs", "show", "nope", exit_code=1)["error"]
    assert error["code"] == "SCHEDULER_NOT_FOUND"


def test_occurrences_list_filters_and_show(db: CliDb) -> None:
    ids = occurrence_ids(db)
    listed = run_json(*db.opts, "occurrences", "list")
    assert set(listed) == {"occurrences", "count", "limit"} and listed["count"] == 2
    dead = run_json(*db.opts, "occurrences", "list", "--status", "dead_letter")["occurrences"]
    assert [item["id"] for item in dead] == [ids["second"]]
    by_job = run_json(*db.opts, "occurrences", "list", "--job", "job-a")["occurrences"]
    assert [item["id"] for item in by_job] == [ids["first"]]
    shown = run_json(*db.opts, "occurrences", "show", ids["second"])
    assert set(shown) == {"occurrence", "control", "reservation", "adjudication"}
    assert shown["occurrence"]["lastError"]["code"] == "REMOTE_OUTCOME_UNKNOWN"
    assert run_json(*db.opts, "occurrences", "show", "occ_missing", exit_code=1)["error"]["code"] == (
        "SCHEDULER_NOT_FOUND"
    )


def test_history_filters_and_limits(db: CliDb) -> None:
    ids = occurrence_ids(db)
    everything = run_json(*db.opts, "history")
    assert set(everything) == {"events", "count", "limit"}
    assert everything["events"][0]["type"] == "occurrence_dead_lettered"
    event_ids = [event["eventId"] for event in everything["events"]]
    assert event_ids == sorted(event_ids, reverse=True)
    of_job = run_json(*db.opts, "history", "--job", "job-a")["events"]
    assert {event["jobId"] for event in of_job} == {"job-a"}
    of_occurrence = run_json(*db.opts, "history", "--occurrence", ids["second"])["events"]
    assert [event["type"] for event in of_occurrence] == [
        "occurrence_dead_lettered",
        "occurrence_claimed",
        "occurrence_enqueued",
    ]
    assert run_json(*db.opts, "history", "--limit", "2")["count"] == 2


@pytest.mark.parametrize("limit", ["0", "201", "many"])
def test_out_of_range_limits_are_usage_errors(db: CliDb, limit: str) -> None:
    assert invoke(*db.opts, "history", "--limit", limit).exit_code == 2


def test_dead_letters(db: CliDb) -> None:
    result = run_json(*db.opts, "dead-letters")
    assert set(result) == {"deadLetters", "count", "limit"}
    assert [item["triggerKey"] for item in result["deadLetters"]] == ["second"]
    assert run_json(*db.opts, "dead-letters", "--job", "job-a")["deadLetters"] == []


# ----------------------------------------------------------------- adjudication


def test_adjudication_list_show_and_decide(db: CliDb) -> None:
    dead = occurrence_ids(db)["second"]
    cases = run_json(*db.opts, "adjudication", "list")
    assert set(cases) == {"cases", "count", "limit"}
    assert [case["occurrenceId"] for case in cases["cases"]] == [dead]
    case = run_json(*db.opts, "adjudication", "show", dead)["case"]
    assert case["eligible"] is True and case["adjudication"] is None
    decide = [*db.opts, *decide_arguments(dead, case, "the remote side never received it")]
    decided = run_json(*decide)["case"]
    assert decided["adjudication"]["decision"] == "confirmed_not_applied"
    assert decided["adjudication"]["status"] == "pending" and decided["status"] == "retry_wait"
    again = run_json(*decide)  # the same decision run again reports the one recorded
    assert again["deduplicated"] is True and again["case"]["adjudication"] == decided["adjudication"]
    other = [*db.opts, *decide_arguments(dead, case, "another reason")]
    assert run_json(*other, exit_code=1)["error"]["code"] == "SCHEDULER_ADJUDICATION_ALREADY_RECORDED"


def test_adjudication_decide_rejects_bad_arguments(db: CliDb) -> None:
    dead = occurrence_ids(db)["second"]
    base = [*db.opts, "adjudication", "decide", dead, "--attempt", "1", "--fence", "1"]
    base += ["--reason", "r", "--operator", "o"]
    assert invoke(*base, "--decision", "maybe", "--evidence-digest", "sha256:" + "0" * 64).exit_code == 2
    bad_digest = invoke(*base, "--decision", "confirmed_applied", "--evidence-digest", "nope", "--json")
    assert bad_digest.exit_code == 2
    assert json.loads(bad_digest.stdout)["error"]["code"] == "SCHEDULER_INVALID_ARGUMENT"


def test_literal_choices_match_the_contract_constants() -> None:
    assert get_args(DecisionName) == (CONFIRMED_APPLIED, CONFIRMED_NOT_APPLIED)
    assert get_args(MigrationStateName) == SCHEDULER_MIGRATION_STATES


# ----------------------------------------------------------------- on the reference v6 database


def test_reference_migrations_controls_and_dead_letters(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 6)
    before = sha256(path)
    dump = reference_dump(6)["tables"]
    migrations = run_json("migrations", "list", "--db", str(path))
    assert set(migrations) == {"migrations", "count", "limit"}
    assert sorted(item["id"] for item in migrations["migrations"]) == sorted(
        row["migration_id"] for row in dump["scheduler_domain_migrations"]
    )
    verified = run_json("migrations", "list", "--db", str(path), "--state", "verified")["migrations"]
    assert [item["entryCount"] for item in verified] == [2]
    shown = run_json("migrations", "show", verified[0]["id"], "--db", str(path))["migration"]
    assert len(shown["entries"]) == 2
    assert invoke("migrations", "list", "--db", str(path), "--state", "bogus").exit_code == 2
    assert invoke("migrations", "show", "nope", "--db", str(path)).exit_code == 1
    controls = run_json("controls", "list", "--db", str(path))
    assert set(controls) == {"occurrences", "count", "limit"}
    assert sorted(item["runtimeStatus"] for item in controls["occurrences"]) == [
        "pause_requested",
        "paused",
        "running",
    ]
    paused = run_json("controls", "list", "--db", str(path), "--status", "paused")["occurrences"]
    assert [item["control"]["state"] for item in paused] == ["paused"]
    assert invoke("controls", "list", "--db", str(path), "--status", "bogus").exit_code == 2
    assert run_json("dead-letters", "--db", str(path))["count"] == 3
    assert run_json("adjudication", "list", "--db", str(path))["count"] == 1
    assert "pause_requested" in invoke("controls", "list", "--db", str(path)).stdout
    assert sha256(path) == before


# ----------------------------------------------------------------- database selection and refusals


def test_read_commands_never_create_or_upgrade(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sqlite"
    assert invoke("jobs", "list", "--db", str(missing)).exit_code == 1
    assert not missing.exists()
    old = copy_reference(tmp_path, 3)
    before = sha256(old)
    result = invoke("history", "--db", str(old))
    assert result.exit_code == 1 and "scheduler upgrade" in result.stderr
    assert sha256(old) == before


@sqlite_only
def test_database_selection_order(db: CliDb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other.sqlite"
    run_json("init", "--db", str(other))
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", f"sqlite:///{db.path}")
    assert run_json("jobs", "list")["count"] == 2
    assert json.loads(invoke("--db", str(other), "jobs", "list", "--json").stdout)["count"] == 0
    assert (
        json.loads(invoke("--db", str(other), "jobs", "list", "--db", str(db.path), "--json").stdout)["count"]
        == 2
    )
    monkeypatch.delenv("SCHEDULER_DATABASE_URL")
    home = tmp_path / "scheduler-home"
    assert run_json("init")["database"] == str(home / "kernel-v1.sqlite")


@sqlite_only
def test_usage_errors_exit_2(db: CliDb) -> None:
    assert invoke("no-such-command").exit_code == 2
    assert invoke(*db.opts, "jobs", "list", "--bogus").exit_code == 2
    assert invoke("jobs", "list", "--db", "mysql://localhost/x").exit_code == 2
    assert invoke("jobs", "list", "--db", "postgresql+asyncpg://localhost/x").exit_code == 2
    for command in (("jobs", "list"), ("info",), ("verify",)):
        assert invoke("--schema", "kernel", *command, *db.opts).exit_code == 2, command
    assert invoke("info", "--db", ":memory:").exit_code == 2


def test_module_and_console_script_entry_points(tmp_path: Path) -> None:
    env = {**os.environ, "SCHEDULER_HOME": str(tmp_path / "h")}
    env.pop("SCHEDULER_DATABASE_URL", None)
    module = subprocess.run(
        [sys.executable, "-m", "scheduler", "init", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert module.returncode == 0, module.stderr
    assert json.loads(module.stdout)["database"] == str(tmp_path / "h" / "kernel-v1.sqlite")
    script = shutil.which("scheduler", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the console script is not installed (pip install -e .)")
    listed = subprocess.run(
        [script, "jobs", "list", "--json"], capture_output=True, text=True, env=env, check=False
    )
    assert listed.returncode == 0 and json.loads(listed.stdout)["count"] == 0


# ----------------------------------------------------------------- documentation


def test_api_reference_is_generated_from_the_current_code() -> None:
    tool = Path(__file__).resolve().parents[1] / "tools" / "gen_api_docs.py"
    check = subprocess.run(
        [sys.executable, str(tool), "--check"], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stderr
