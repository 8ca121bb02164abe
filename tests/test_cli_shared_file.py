"""Every ``scheduler`` command on the single-file SQLite layout (API §8, ``exclusive=False``): the
scheduler's tables beside an application's in one file.

The layout is detected (the file's ``application_id`` is not the scheduler's and its
``migrations`` history is); ``--shared`` is needed only where nothing can be detected yet: to
create the scheduler's tables in an application's file, and to leave a dedicated file's journal
mode alone (the attached layout's kernel file). Read commands leave the file byte for byte; write
commands leave the application's rows, ``application_id``, ``user_version`` and journal mode alone.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cli_support import decide_arguments, invoke, run_json, sha256
from cli_support import isolated_environment as isolated_environment
from recorded import copy_reference, reference_dump

from scheduler import open_store
from scheduler.schema import SCHEMA_V6_FINGERPRINT
from tests.worker_support import wait_for

REPO = Path(__file__).resolve().parents[1]
AUTHORITY = {"principal": {"type": "service", "id": "shop"}}
APP_ID, APP_VERSION = 0x53484F50, 7  # the application's own header values


def app_state(path: Path) -> tuple[Any, ...]:
    """What the application owns: its rows and the file's header values and journal mode."""
    with sqlite3.connect(path) as connection:
        return (
            connection.execute("SELECT * FROM orders ORDER BY id").fetchall(),
            connection.execute("PRAGMA application_id").fetchone()[0],
            connection.execute("PRAGMA user_version").fetchone()[0],
            connection.execute("PRAGMA journal_mode").fetchone()[0],
        )


@pytest.fixture
def shop(tmp_path: Path) -> dict[str, Any]:
    """The reference v6 database made an application's file (its header values, an ``orders``
    table), plus a running occurrence and two dead letters of the shop's own."""
    path = copy_reference(tmp_path, 6, "shop.sqlite")
    with sqlite3.connect(path) as connection:
        connection.execute(f"PRAGMA application_id = {APP_ID}")
        connection.execute(f"PRAGMA user_version = {APP_VERSION}")
        connection.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
        connection.execute("INSERT INTO orders VALUES ('o-1', 1200), ('o-2', 800)")
    with open_store(path, exclusive=False) as store:
        store.create_job(id="receipt", kind="email", authority=AUTHORITY, max_attempts=1)
        ids = {
            key: store.enqueue_occurrence(job_id="receipt", scheduled_for=0, trigger_key=key).id
            for key in ("running", "unknown", "failed")
        }
        for key, error in (("unknown", "REMOTE_OUTCOME_UNKNOWN"), ("failed", "SMTP_DOWN"), ("running", None)):
            claimed = store.claim_occurrence(occurrence_id=ids[key], owner_id="w", lease_ms=3_600_000)
            assert claimed is not None
            if error is not None:
                store.settle(
                    occurrence_id=ids[key],
                    owner_id="w",
                    fence=claimed.fence,
                    outcome="failed",
                    error={"code": error, "message": "no"},
                    retryable=False,
                )
    return {"path": path, "opts": ("--db", str(path)), "ids": ids}


def test_every_read_command_reads_a_shared_file_and_changes_no_byte(shop: dict[str, Any]) -> None:
    path, opts, ids = shop["path"], shop["opts"], shop["ids"]
    before = sha256(path)
    verified = run_json(*opts, "verify")
    assert verified["ok"] is True and verified["schemaVersion"] == 6
    assert verified["fingerprint"] == SCHEMA_V6_FINGERPRINT
    info = run_json(*opts, "info")
    assert info["layout"] == "shared" and info["versions"]["schema"] == 6
    assert info["versions"]["applicationId"] == APP_ID and "orders" not in info["tables"]
    assert info["fingerprint"]["matches"] is True and info["integrity"] == {"ok": True}
    assert run_json(*opts, "stats")["stats"]["deadLetters"] >= 2
    jobs = [job["id"] for job in run_json(*opts, "jobs", "list", "--limit", "1000")["jobs"]]
    assert "receipt" in jobs
    assert run_json(*opts, "jobs", "show", "receipt")["occurrences"]["dead_letter"] == 2
    listed = run_json(*opts, "occurrences", "list", "--job", "receipt")["occurrences"]
    assert {item["id"] for item in listed} == set(ids.values())
    assert run_json(*opts, "occurrences", "show", ids["unknown"][:10])["occurrence"]["id"] == ids["unknown"]
    assert run_json(*opts, "history", "--occurrence", ids["failed"])["count"] == 3
    dead = {item["id"] for item in run_json(*opts, "dead-letters", "--job", "receipt")["deadLetters"]}
    assert dead == {ids["unknown"], ids["failed"]}
    cases = run_json(*opts, "adjudication", "list")["cases"]
    assert ids["unknown"] in {case["occurrenceId"] for case in cases}
    assert run_json(*opts, "adjudication", "show", ids["unknown"])["case"]["eligible"] is True
    migrations = run_json(*opts, "migrations", "list")["migrations"]
    expected = {row["migration_id"] for row in reference_dump(6)["tables"]["scheduler_domain_migrations"]}
    assert {item["id"] for item in migrations} == expected
    assert (
        run_json(*opts, "migrations", "show", migrations[0]["id"])["migration"]["id"] == migrations[0]["id"]
    )
    assert ids["running"] in {item["id"] for item in run_json(*opts, "controls", "list")["occurrences"]}
    for words in (("verify",), ("stats",), ("occurrences", "list"), ("history",)):
        assert invoke(*opts, *words).exit_code == 0, words  # the tables too
    assert "shared with an application" in invoke(*opts, "info").stdout
    assert sha256(path) == before


def test_every_write_command_works_on_a_shared_file_and_leaves_the_application_alone(
    shop: dict[str, Any],
) -> None:
    path, opts, ids = shop["path"], shop["opts"], shop["ids"]
    before = app_state(path)
    assert run_json(*opts, "init")["steps"] == [] and run_json(*opts, "upgrade")["steps"] == []
    assert run_json(*opts, "upgrade", "--dry-run")["fromVersion"] == 6
    case = run_json(*opts, "adjudication", "show", ids["unknown"])["case"]
    decided = run_json(*opts, *decide_arguments(ids["unknown"][:12], case))["case"]
    assert decided["status"] == "retry_wait"
    requeued = run_json(*opts, "requeue", ids["failed"][:12])["occurrence"]
    assert requeued["id"] == ids["failed"] and requeued["status"] == "retry_wait"
    control = run_json(*opts, "pause", ids["running"])["control"]
    assert control["state"] == "pause_requested"
    assert run_json(*opts, "resume", ids["running"], exit_code=1)["error"]["code"] != "SCHEDULER_NOT_FOUND"
    cancelled = run_json(*opts, "cancel", ids["running"][:12], "--reason", "not needed")["occurrence"]
    assert cancelled["status"] == "dead_letter" and cancelled["lastError"]["code"] == "CANCELLED"
    assert run_json(*opts, "prune", "--older-than", "1d", "--dry-run")["prune"]["dryRun"] is True
    assert run_json(*opts, "prune", "--older-than", "3650d")["prune"]["dryRun"] is False
    demo = run_json(*opts, "demo")
    assert demo["job"]["id"].startswith("demo-") and len(demo["occurrences"]) == 4
    assert app_state(path) == before
    assert run_json(*opts, "verify")["ok"] is True


def test_init_shared_creates_the_tables_beside_the_application_and_a_worker_runs_there(
    tmp_path: Path,
) -> None:
    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA journal_mode = wal")
        connection.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
        connection.execute("INSERT INTO orders VALUES ('o-1', 1200)")
    untouched = sha256(path)
    refused = invoke("--db", str(path), "init", "--json")
    assert refused.exit_code == 1 and "--shared" in refused.stdout
    assert sha256(path) == untouched
    before = app_state(path)
    created = run_json("--db", str(path), "--shared", "init")  # the global option
    assert (created["fromVersion"], created["fingerprint"]) == (0, SCHEMA_V6_FINGERPRINT)
    assert run_json("init", "--db", str(path))["steps"] == []  # detected from now on
    with open_store(path, exclusive=False) as store:
        store.create_job(id="receipt", kind="email", authority=AUTHORITY)
        occurrence = store.enqueue_occurrence(
            job_id="receipt", scheduled_for=0, trigger_key="o-1", payload={"order": "o-1"}
        )
    (tmp_path / "shop_handlers.py").write_text(
        textwrap.dedent(
            """
            def send_receipt(occurrence, ctx):
                return {"sent": occurrence.payload["order"]}

            HANDLERS = {"email": send_receipt}
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    env.pop("SCHEDULER_DATABASE_URL", None)
    worker = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "worker", "shop_handlers:HANDLERS", "--db", str(path)],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: (
                run_json("occurrences", "show", occurrence.id, "--db", str(path))["occurrence"]["status"]
                == "succeeded"
            ),
            timeout=30,
            message="the worker settles the receipt",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    shown = run_json("occurrences", "show", occurrence.id[:10], "--db", str(path))["occurrence"]
    assert shown["result"] == {"sent": "o-1"}
    assert app_state(path) == before


def test_shared_keeps_a_dedicated_files_rollback_journal(tmp_path: Path) -> None:
    """The attached layout's kernel file is a dedicated file in rollback-journal mode: ``--shared``
    opens it without switching it to WAL (a plain open would)."""
    kernel = tmp_path / "kernel.sqlite"
    with open_store(kernel):  # dedicated: the scheduler's application_id, WAL
        pass
    with sqlite3.connect(kernel) as connection:
        connection.execute("PRAGMA journal_mode = delete")
    assert run_json("demo", "--db", str(kernel), "--shared")["job"]["id"].startswith("demo-")
    with sqlite3.connect(kernel) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert run_json("demo", "--db", str(kernel))["job"]["id"].startswith("demo-")
    with sqlite3.connect(kernel) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
