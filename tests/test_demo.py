"""The demo worker (``scheduler.demo``) and ``scheduler demo`` end to end."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scheduler import open_store
from scheduler.cli import app
from scheduler.demo import (
    ALWAYS_FAIL,
    DEMO_JOB_KIND,
    DEMO_SCENARIOS,
    FAIL_ONCE,
    SUCCEED,
    new_demo_job_id,
    perform,
    run_demo,
)
from scheduler.testing import T0, SchedulerClock


def test_perform_scenarios() -> None:
    assert perform(SUCCEED, 1).succeeded
    assert not perform(FAIL_ONCE, 1).succeeded and perform(FAIL_ONCE, 2).succeeded
    assert not perform(ALWAYS_FAIL, 1).succeeded and not perform(ALWAYS_FAIL, 5).succeeded
    assert perform(FAIL_ONCE, 1).error["code"] == "DEMO_TRANSIENT_FAILURE"


def test_new_demo_job_ids_are_unique() -> None:
    first, second = new_demo_job_id(T0), new_demo_job_id(T0)
    assert first.startswith(f"demo-{T0}-") and first != second


def test_run_demo_settles_every_scenario(tmp_path: Path) -> None:
    clock = SchedulerClock()
    with open_store(tmp_path / "demo.sqlite", clock=clock) as store:
        report = run_demo(store, clock=clock)
        assert report.complete and report.rounds == 2
        assert report.job.kind == DEMO_JOB_KIND and report.job.id.startswith(f"demo-{T0}-")
        by_trigger = {occurrence.trigger_key: occurrence for occurrence in report.occurrences}
        assert list(by_trigger) == [trigger for trigger, _ in DEMO_SCENARIOS]
        outcomes = {trigger: (o.status, o.attempt) for trigger, o in by_trigger.items()}
        assert outcomes == {
            "send-welcome-email": ("succeeded", 1),
            "sync-inventory": ("succeeded", 2),
            "import-legacy-feed": ("dead_letter", 2),
            "build-daily-report": ("succeeded", 1),
        }
        assert by_trigger["import-legacy-feed"].last_error["code"] == "DEMO_UPSTREAM_UNAVAILABLE"
        assert by_trigger["sync-inventory"].result == {"attempt": 2, "ok": True}
        types = Counter(event.type for event in report.events)
        assert types == {
            "job_created": 1,
            "occurrence_enqueued": 4,
            "occurrence_claimed": 6,
            "occurrence_renewed": 6,
            "occurrence_retry_scheduled": 2,
            "occurrence_succeeded": 3,
            "occurrence_dead_lettered": 1,
        }
        assert [event.event_id for event in report.events] == sorted(
            event.event_id for event in report.events
        )
        reservation = store.get_authority_reservation(by_trigger["sync-inventory"].id)
        assert reservation is not None and reservation.status == "succeeded"
        assert set(report.to_dict()) == {"job", "policy", "occurrences", "events", "rounds", "complete"}


def test_run_demo_twice_on_one_database(tmp_path: Path) -> None:
    with open_store(tmp_path / "demo.sqlite") as store:
        first, second = run_demo(store), run_demo(store)
        assert first.job.id != second.job.id and first.complete and second.complete
        assert len(store.list_dead_letters(limit=10)) == 2


def _demo_env(home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SCHEDULER_")}
    return {**env, "HOME": str(home), "COLUMNS": "200"}


def test_demo_command_on_a_fresh_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    command = [sys.executable, "-m", "scheduler", "demo"]
    shown = subprocess.run(command, capture_output=True, text=True, env=_demo_env(home), check=False)
    assert shown.returncode == 0, shown.stderr
    database = home / ".scheduler" / "kernel-v1.sqlite"
    assert database.is_file() and stat.S_IMODE(database.stat().st_mode) == 0o600
    assert stat.S_IMODE(database.parent.stat().st_mode) == 0o700
    assert (
        "history of demo-" in shown.stdout
        and "dead_lettered" in shown.stdout
        and "retry_scheduled" in shown.stdout
    )
    again = subprocess.run(
        [*command, "--json"], capture_output=True, text=True, env=_demo_env(home), check=False
    )
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert set(report) == {"database", "job", "policy", "occurrences", "events", "rounds", "complete"}
    assert report["database"] == str(database) and report["complete"] is True
    assert sorted(o["status"] for o in report["occurrences"]) == [
        "dead_letter",
        "succeeded",
        "succeeded",
        "succeeded",
    ]
    assert report["job"]["id"] not in shown.stdout


def test_demo_command_in_process_with_db_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)
    path = tmp_path / "given.sqlite"
    result = CliRunner().invoke(app, ["demo", "--db", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["complete"] is True
    listed = CliRunner().invoke(app, ["dead-letters", "--db", str(path), "--json"])
    assert json.loads(listed.stdout)["count"] == 1
    shown = CliRunner().invoke(app, ["--db", str(path), "demo"], env={"COLUMNS": "60"})
    hint = shown.stdout.strip().splitlines()[-1]  # one line even on a narrow terminal, to copy
    assert hint.startswith(f"see also: scheduler --db {path} history --job demo-"), hint
