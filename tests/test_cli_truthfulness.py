"""The CLI tells the truth about damaged files and bad options (issue 15 item 9).

* ``verify`` on a file with a damaged page prints every finding and exits 1 (the findings used to
  be lost when the read snapshot's COMMIT failed);
* ``info`` on a damaged file says so and exits 1;
* ``verify`` on a file that is not a database never claims a schema version;
* an option value outside its closed set or range exits 2 with a clear message, whatever the
  state of the database (checked before it is opened).
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any, get_args

import pytest
from cli_support import invoke, sha256
from cli_support import isolated_environment as isolated_environment
from typer.testing import Result

from scheduler import open_store
from scheduler.cli.reads import OccurrenceStatusName
from scheduler.contract.constants import OCCURRENCE_STATUSES
from scheduler.testing import T0

AUTHORITY = {"principal": {"type": "service", "id": "cli"}, "requestedCapabilities": ["run"]}


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


@pytest.fixture
def healthy(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "kernel.sqlite"
    with open_store(path, clock=lambda: T0) as store:
        for number in range(20):
            store.create_job(id=f"job-{number}", kind="report", authority=AUTHORITY, payload="x" * 400)
            store.enqueue_occurrence(job_id=f"job-{number}", scheduled_for=T0, trigger_key="t")
    return path


def damaged_copy(healthy: Path, table: str) -> Path:
    """A copy whose ``table`` root page has a broken b-tree header ("database disk image is malformed")."""
    with sqlite3.connect(healthy) as connection:
        (root,) = connection.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        (page_size,) = connection.execute("PRAGMA page_size").fetchone()
    connection.close()
    target = healthy.with_name(f"damaged-{table}.sqlite")
    target.write_bytes(healthy.read_bytes())
    target.chmod(0o600)
    with target.open("r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(bytes([0x0D, 0xFF, 0xFF, 0x7F, 0xFF]))  # leaf page, absurd freeblock and cell count
    return target


# --------------------------------------------------------------------------- damaged pages


@pytest.mark.parametrize("table", ["occurrences", "events", "jobs"])
def test_verify_reports_every_finding_of_a_damaged_page_and_exits_1(healthy: Path, table: str) -> None:
    damaged = damaged_copy(healthy, table)
    before = sha256(damaged)
    report = invoke("verify", "--db", str(damaged), "--json")
    assert report.exit_code == 1, report.output
    result = as_json(report)
    assert result["ok"] is False and result["schemaVersion"] == 6
    findings = {finding["check"]: finding for finding in result["findings"]}
    assert findings["integrity"]["code"] == "SCHEDULER_SCHEMA_CORRUPT"
    assert "quick_check" in findings["integrity"]["message"]
    text = invoke("verify", "--db", str(damaged))
    assert text.exit_code == 1
    assert text.stdout.startswith(f"{damaged}: schema v6")
    assert "CLI_DATABASE_ERROR" not in text.output
    for check, finding in findings.items():
        assert f"{check}: {finding['code']}" in text.stdout
        assert f"FAIL {check}" in text.stdout
    assert "verification FAILED" in text.stdout
    assert sha256(damaged) == before


def test_info_on_a_damaged_file_says_so_and_exits_1(healthy: Path) -> None:
    damaged = damaged_copy(healthy, "occurrences")
    report = invoke("info", "--db", str(damaged), "--json")
    assert report.exit_code == 1, report.output
    integrity = as_json(report)["integrity"]
    assert integrity["ok"] is False and integrity["code"] == "SCHEDULER_SCHEMA_CORRUPT"
    text = invoke("info", "--db", str(damaged))
    assert text.exit_code == 1
    assert "integrity: FAILED" in text.stdout and "scheduler verify" in text.stdout


def test_info_on_a_healthy_file_checks_integrity_and_exits_0(healthy: Path) -> None:
    report = invoke("info", "--db", str(healthy), "--json")
    assert report.exit_code == 0
    assert as_json(report)["integrity"] == {"ok": True}
    assert "integrity: ok" in invoke("info", "--db", str(healthy)).stdout


# --------------------------------------------------------------------------- files that are not databases


def test_verify_on_random_bytes_claims_no_schema_version(tmp_path: Path) -> None:
    noise = tmp_path / "noise.sqlite"
    noise.write_bytes(os.urandom(8192))
    text = invoke("verify", "--db", str(noise))
    assert text.exit_code == 1
    assert text.stdout.startswith(f"{noise}: not a readable SQLite database")
    assert "schema v" not in text.stdout
    result = as_json(invoke("verify", "--db", str(noise), "--json"))
    assert (result["schemaVersion"], result["userVersion"], result["checkedAs"]) == (None, None, None)
    assert invoke("info", "--db", str(noise)).exit_code == 1


def test_verify_names_an_unknown_user_version_and_an_empty_file(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
        connection.execute("PRAGMA user_version = 99")
    connection.close()
    text = invoke("verify", "--db", str(foreign))
    assert text.exit_code == 1
    assert text.stdout.startswith(
        f"{foreign}: user_version 99 is not a scheduler schema version, checked as v6"
    )
    result = as_json(invoke("verify", "--db", str(foreign), "--json"))
    assert (result["schemaVersion"], result["userVersion"], result["checkedAs"]) == (None, 99, 6)
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    assert invoke("verify", "--db", str(empty)).stdout.startswith(f"{empty}: an empty database")


# --------------------------------------------------------------------------- option values

BAD_OPTIONS = [
    ("occurrences", "list", "--status", "bogus"),
    ("occurrences", "list", "--status", "RUNNING"),
    ("occurrences", "list", "--limit", "0"),
    ("occurrences", "list", "--limit", "1001"),
    ("occurrences", "list", "--job", ""),
    ("occurrences", "list", "--job", "a\udcff"),
    ("occurrences", "show", "a\udcff"),
    ("jobs", "list", "--kind", " "),
    ("jobs", "list", "--kind", "k\udcff"),
    ("jobs", "list", "--kind", "k" * 129),
    ("jobs", "list", "--limit", "-1"),
    ("jobs", "show", "\udcff"),
    ("history", "--limit", "201"),
    ("history", "--limit", "many"),
    ("history", "--job", "a\udcff"),
    ("history", "--occurrence", "\t"),
    ("dead-letters", "--job", ""),
    ("dead-letters", "--limit", "0"),
    ("adjudication", "list", "--limit", "201"),
    ("adjudication", "show", "\udcff"),
    ("migrations", "list", "--state", "done"),
    ("migrations", "show", ""),
    ("controls", "list", "--status", "bogus"),
    ("controls", "list", "--status", "running", "--status", "finished"),
    ("controls", "list", "--kind", ""),
    ("controls", "list", "--kind", "k\udcff"),
    ("controls", "list", "--limit", "0"),
    ("requeue", "occ_x", "--fence", "0"),
    ("requeue", "occ_x", "--request-id", ""),
    ("requeue", "occ_x", "--error-code", " "),
    ("requeue", "\udcff"),
    ("cancel", "\udcff"),
    ("cancel", "occ_x", "--reason", "r" * 2_001),
    ("pause", "occ_x", "--fence", "-1"),
    ("pause", "occ_x", "--safe-point", "bogus"),
    ("pause", "occ_x", "--request-id", "a\x01b"),
    ("resume", "occ_x", "--revision", "0"),
    ("resume", "\udcff"),
    ("prune", "--older-than", "soon"),
    ("prune", "--older-than", "-5d"),
    ("prune", "--older-than", "30d", "--status", "queued"),
    ("prune", "--older-than", "30d", "--batch-size", "0"),
    ("worker", "tests.handlers:HANDLERS", "--kinds", ","),
    ("worker", "tests.handlers:HANDLERS", "--kinds", "mail,\udcff"),
    ("worker", "tests.handlers:HANDLERS", "--lease-ms", "86400001"),
    ("worker", "tests.handlers:HANDLERS", "--missed-ticks", "some"),
    ("worker", "tests.handlers:HANDLERS", "--concurrency", "0"),
    ("tasks", "list", "--status", "bogus"),
    ("tasks", "list", "--limit", "0"),
    ("tasks", "list", "--task", ""),
    ("tasks", "list", "--queue", "q" * 129),
    ("tasks", "list", "--code", "\t"),
    ("tasks", "list", "--after", "\udcff"),
    ("tasks", "show", "\udcff"),
    ("tasks", "cancel"),
    ("tasks", "cancel", "occ_x", "--all"),
    ("tasks", "cancel", "occ_x", "--queue", "q"),
    ("tasks", "cancel", "occ_x", "--reason", "r" * 2_001),
    ("tasks", "cancel", "--all"),
    ("tasks", "cancel", "--all", "--queue", "q", "--status", "succeeded"),
    ("tasks", "cancel", "--all", "--queue", "q", "--reason", "r" * 2_001),
    ("tasks", "retry"),
    ("tasks", "retry", "occ_x", "--code", "X"),
    ("tasks", "retry", "--all", "--dry-run"),
    ("tasks", "retry", "\udcff"),
]
DECIDE = ["adjudication", "decide", "--evidence-digest", "sha256:" + "ab" * 32, "--operator", "o"]
BAD_DECISIONS = [
    ["occ_x", "--decision", "maybe", "--attempt", "1", "--fence", "1", "--reason", "r"],
    ["occ_x", "--decision", "confirmed_applied", "--attempt", "0", "--fence", "1", "--reason", "r"],
    ["occ_x", "--decision", "confirmed_applied", "--attempt", "1", "--fence", "-3", "--reason", "r"],
    ["occ_x", "--decision", "confirmed_applied", "--attempt", "1", "--fence", "1", "--reason", " "],
    ["\udcff", "--decision", "confirmed_applied", "--attempt", "1", "--fence", "1", "--reason", "r"],
]


@pytest.mark.parametrize("arguments", BAD_OPTIONS, ids=ascii)
def test_a_bad_option_value_exits_2_before_the_database_is_opened(
    healthy: Path, tmp_path: Path, arguments: tuple[str, ...]
) -> None:
    missing = tmp_path / "missing.sqlite"
    for db in (healthy, missing):
        result = invoke(*arguments, "--db", str(db))
        assert result.exit_code == 2, (db, result.output)
        assert result.output.strip(), "a usage error explains itself"
    assert not missing.exists()


@pytest.mark.parametrize("options", BAD_DECISIONS, ids=ascii)
def test_a_bad_decision_option_exits_2_and_creates_nothing(tmp_path: Path, options: list[str]) -> None:
    missing = tmp_path / "missing.sqlite"
    result = invoke(*DECIDE, *options, "--db", str(missing))
    assert result.exit_code == 2, result.output
    assert not missing.exists()


@pytest.mark.parametrize(
    "arguments",
    [
        ("requeue", "occ_x"),
        ("cancel", "occ_x"),
        ("pause", "occ_x"),
        ("resume", "occ_x"),
        ("prune", "--older-than", "30d"),
        ("tasks", "cancel", "occ_x"),
        ("tasks", "retry", "occ_x"),
        ("tasks", "cancel", "--all", "--queue", "q"),
        ("tasks", "retry", "--all", "--code", "X", "--dry-run"),
    ],
    ids=lambda arguments: "-".join(arguments[:3]),
)
def test_a_write_command_on_a_missing_database_is_not_found_and_creates_nothing(
    tmp_path: Path, arguments: tuple[str, ...]
) -> None:
    missing = tmp_path / "missing.sqlite"
    result = invoke(*arguments, "--db", str(missing), "--json")
    assert result.exit_code == 1, result.output
    assert as_json(result)["error"]["code"] == "SCHEDULER_NOT_FOUND"
    assert not missing.exists()


def test_a_decision_on_a_missing_database_is_not_found_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sqlite"
    options = ["occ_x", "--decision", "confirmed_applied", "--attempt", "1", "--fence", "1", "--reason", "r"]
    result = invoke(*DECIDE, *options, "--db", str(missing), "--json")
    assert result.exit_code == 1
    assert as_json(result)["error"]["code"] == "SCHEDULER_NOT_FOUND"
    assert not missing.exists()


def test_a_bad_store_argument_in_json_mode_is_a_json_usage_error(healthy: Path) -> None:
    result = invoke("jobs", "list", "--kind", "k\udcff", "--db", str(healthy), "--json")
    assert result.exit_code == 2
    assert as_json(result)["error"]["code"] == "SCHEDULER_INVALID_ARGUMENT"


def test_the_status_choices_are_the_contract_statuses() -> None:
    assert get_args(OccurrenceStatusName) == OCCURRENCE_STATUSES


def test_a_valid_status_filter_still_lists(healthy: Path) -> None:
    result = as_json(invoke("occurrences", "list", "--status", "queued", "--db", str(healthy), "--json"))
    assert result["count"] == 20
    assert (
        as_json(invoke("occurrences", "list", "--status", "running", "--db", str(healthy), "--json"))[
            "occurrences"
        ]
        == []
    )
