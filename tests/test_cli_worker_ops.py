"""``scheduler worker`` end to end (real processes on a real SQLite file) and the operator commands
``requeue``, ``pause``, ``resume``, ``prune``, ``stats``, ``controls list`` with ``--json`` and exit codes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from scheduler.cli import app
from scheduler.cli.common import CliFailure
from scheduler.cli.ops import parse_duration_ms
from tests.worker_support import add_job, enqueue, new_store, wait_for

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()

HANDLERS = textwrap.dedent(
    """
    import time
    from pathlib import Path
    from scheduler.worker import PermanentError

    MARKS = Path(__file__).parent / "marks"

    def mark(name, text=""):
        MARKS.mkdir(exist_ok=True)
        (MARKS / name).write_text(text)

    def ok(occurrence, ctx):
        return {"echo": occurrence.payload}

    def flaky(occurrence, ctx):
        if occurrence.attempt == 1:
            raise ConnectionError("upstream reset")
        return {"attempt": occurrence.attempt}

    def fatal(occurrence, ctx):
        raise PermanentError("recipient rejected", code="RECIPIENT_REJECTED")

    def long(occurrence, ctx):
        if ctx.resumed_checkpoint is not None:
            return {"resumed_from": ctx.resumed_checkpoint}
        mark("long-started-" + str(occurrence.fence))
        for step in range(3000):
            ctx.checkpoint({"step": step})
            time.sleep(0.01)
        return {"resumed_from": ctx.resumed_checkpoint}

    def stubborn(occurrence, ctx):
        if occurrence.fence > 1:  # a later claim after the lease was lost: finish at once
            return "second run"
        mark("stubborn-" + str(occurrence.fence))
        deadline = time.monotonic() + 20
        while not ctx.should_stop and time.monotonic() < deadline:
            time.sleep(0.02)
        mark("stubborn-stopped-" + str(occurrence.fence), str(ctx.should_stop))
        return "must not be settled"

    def slow(occurrence, ctx):
        mark("slow-started")
        time.sleep(1.5)
        mark("slow-finished")
        return "finished after SIGTERM"

    HANDLERS = {"ok": ok, "flaky": flaky, "fatal": fatal, "long": long, "stubborn": stubborn, "slow": slow}
    """
)


def invoke(*args: str) -> Result:
    return runner.invoke(app, list(args))


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


def status_of(path: Path, occurrence_id: str) -> tuple[Any, ...]:
    with sqlite3.connect(path) as connection:
        row = connection.execute(
            "SELECT status, attempt, available_at, updated_at, last_error_json, result_json FROM occurrences"
            " WHERE occurrence_id = ?",
            (occurrence_id,),
        ).fetchone()
    return tuple(row)


def events_of(path: Path, occurrence_id: str) -> list[tuple[str, int | None]]:
    with sqlite3.connect(path) as connection:
        return connection.execute(
            "SELECT event_type, fence FROM events WHERE occurrence_id = ? ORDER BY event_id", (occurrence_id,)
        ).fetchall()


def start_worker(home: Path, path: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "scheduler",
        "worker",
        "handlers_module:HANDLERS",
        "--db",
        str(path),
        *extra,
    ]
    return subprocess.Popen(command, cwd=home, env=env, stderr=subprocess.PIPE, text=True)


def stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    return process.returncode, stderr


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "handlers_module.py").write_text(HANDLERS)
    return tmp_path


@pytest.fixture
def database(home: Path) -> Iterator[Path]:
    path = home / "db" / "k.sqlite"
    store = new_store(path)
    for kind in ("ok", "flaky", "fatal", "long", "stubborn", "slow"):
        add_job(store, kind, max_attempts=3)
    store.close()
    yield path


def test_worker_runs_the_handlers_module_with_retries_permanent_failures_and_requeue(
    home: Path, database: Path
) -> None:
    store = new_store(database)
    done = enqueue(store, "ok", "one", payload={"to": "a@example.org"})
    flaky = enqueue(store, "flaky", "one")
    fatal = enqueue(store, "fatal", "one")
    store.close()
    process = start_worker(home, database, "--concurrency", "2", "--retry-base-ms", "300", "--json")
    try:
        wait_for(lambda: status_of(database, done)[0] == "succeeded", 30, "success")
        wait_for(lambda: status_of(database, fatal)[0] == "dead_letter", 30, "permanent failure")
        wait_for(lambda: status_of(database, flaky)[0] == "succeeded", 30, "retry")
        requeued = invoke("requeue", fatal, "--db", str(database), "--json")
        assert requeued.exit_code == 0, requeued.output
        assert as_json(requeued)["deduplicated"] is False
        assert as_json(requeued)["occurrence"]["status"] == "retry_wait"
        again = invoke(
            "requeue",
            fatal,
            "--fence",
            "1",
            "--error-code",
            "RECIPIENT_REJECTED",
            "--db",
            str(database),
            "--json",
        )
        assert again.exit_code == 0 and as_json(again)["deduplicated"] is True
        wait_for(lambda: status_of(database, fatal)[0] == "dead_letter", 30, "the requeued run")
    finally:
        code, stderr = stop(process)
    assert code == 0, stderr
    assert json.loads(status_of(database, done)[5]) == {"echo": {"to": "a@example.org"}}
    fatal_row = status_of(database, fatal)
    assert fatal_row[1] == 1 and json.loads(fatal_row[4]) == {
        "code": "RECIPIENT_REJECTED",
        "message": "recipient rejected",
    }
    flaky_events = [event for event, _ in events_of(database, flaky)]
    assert flaky_events == [
        "occurrence_enqueued",
        "occurrence_claimed",
        "occurrence_retry_scheduled",
        "occurrence_claimed",
        "occurrence_succeeded",
    ]
    with sqlite3.connect(database) as connection:
        retry_at, failed_at = connection.execute(
            "SELECT json_extract(data_json, '$.retryAt'), occurred_at FROM events"
            " WHERE occurrence_id = ? AND event_type = 'occurrence_retry_scheduled'",
            (flaky,),
        ).fetchone()
        (claimed_at,) = connection.execute(
            "SELECT min(occurred_at) FROM events"
            " WHERE occurrence_id = ? AND event_type = 'occurrence_claimed'",
            (flaky,),
        ).fetchone()
    # --retry-base-ms 300 with ±10 % jitter, counted from the moment the handler failed: after the
    # claim and no later than the settle that recorded it (a loaded machine may delay the settle).
    assert claimed_at + 270 <= retry_at <= failed_at + 330
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert {"claimed", "retried", "settled", "dead-lettered"} <= {r.get("state") for r in records}
    assert any(
        r.get("state") == "retried" and r["occurrence"] == flaky and r["kind"] == "flaky" for r in records
    )


def test_pause_and_resume_from_the_command_line(home: Path, database: Path) -> None:
    store = new_store(database)
    long = enqueue(store, "long", "one")
    store.close()
    process = start_worker(home, database)
    try:
        wait_for(lambda: (home / "marks" / "long-started-1").exists(), 30, "the handler")
        paused = invoke("pause", long, "--db", str(database), "--json")
        assert paused.exit_code == 0, paused.output
        assert as_json(paused)["control"]["state"] == "pause_requested"
        listed = invoke("controls", "list", "--kind", "long", "--db", str(database), "--json")
        assert (
            listed.exit_code == 0 and as_json(listed)["count"] == 1
        )  # any job kind, not only the original's six
        wait_for(lambda: status_of(database, long)[0] == "retry_wait", 30, "the pause")
        resumed = invoke("resume", long, "--db", str(database), "--json")
        assert resumed.exit_code == 0, resumed.output
        assert as_json(resumed)["control"]["state"] == "resumed"
        wait_for(lambda: status_of(database, long)[0] == "succeeded", 60, "the resumed run")
    finally:
        code, stderr = stop(process)
    assert code == 0, stderr
    result = json.loads(status_of(database, long)[5])
    assert isinstance(result["resumed_from"]["step"], int) and status_of(database, long)[1] == 1
    conflict = invoke("resume", long, "--db", str(database), "--json")
    assert conflict.exit_code == 1, conflict.output  # no longer paused: a conflict
    assert as_json(conflict)["error"]["code"] == "SCHEDULER_OCCURRENCE_CONTROL_CONFLICT"


def test_lease_loss_in_a_worker_process_abandons_the_result(home: Path, database: Path) -> None:
    store = new_store(database)
    stubborn = enqueue(store, "stubborn", "one")
    store.close()
    process = start_worker(home, database, "--lease-ms", "900", "--json")
    try:
        wait_for(lambda: (home / "marks" / "stubborn-1").exists(), 30, "the handler")
        blocker = sqlite3.connect(database, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # renewals cannot write: the lease expires
        time.sleep(2.5)
        blocker.execute("COMMIT")
        blocker.close()
        wait_for(lambda: (home / "marks" / "stubborn-stopped-1").exists(), 30, "should_stop")
    finally:
        code, stderr = stop(process)
    assert code == 0, stderr
    assert (home / "marks" / "stubborn-stopped-1").read_text() == "True"
    assert ("occurrence_succeeded", 1) not in events_of(database, stubborn)
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(r.get("state") == "lease lost" and r["occurrence"] == stubborn for r in records)


def test_sigterm_mid_handler_lets_it_finish_and_exits_zero(home: Path, database: Path) -> None:
    store = new_store(database)
    slow = enqueue(store, "slow", "one")
    store.close()
    process = start_worker(home, database)
    wait_for(lambda: (home / "marks" / "slow-started").exists(), 30, "the handler")
    code, stderr = stop(process)
    assert code == 0, stderr
    assert (home / "marks" / "slow-finished").exists()
    assert status_of(database, slow)[0] == "succeeded"
    assert "worker stopping" in stderr and "worker stopped" in stderr


def test_worker_usage_errors_exit_2(home: Path, database: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(home)
    assert invoke("worker", "no_colon", "--db", str(database)).exit_code == 2
    assert invoke("worker", "missing_module:HANDLERS", "--db", str(database)).exit_code == 2
    assert invoke("worker", "handlers_module:NOPE", "--db", str(database)).exit_code == 2
    assert invoke("worker", "handlers_module:mark", "--db", str(database)).exit_code == 2
    result = invoke(
        "worker", "handlers_module:HANDLERS", "--kinds", "ok,unknown", "--db", str(database), "--json"
    )
    assert result.exit_code == 2 and as_json(result)["error"]["code"] == "SCHEDULER_INVALID_ARGUMENT"


def test_stats_prune_and_their_exit_codes(home: Path, database: Path) -> None:
    store = new_store(database)
    for key in ("a", "b"):
        occurrence_id = enqueue(store, "ok", key)
        claimed = store.claim_occurrence(occurrence_id=occurrence_id, owner_id="w", lease_ms=60_000)
        store.settle(occurrence_id=occurrence_id, owner_id="w", fence=claimed.fence, outcome="succeeded")
    enqueue(store, "flaky", "queued")
    store.close()
    stats = invoke("stats", "--db", str(database), "--json")
    assert stats.exit_code == 0, stats.output
    body = as_json(stats)["stats"]
    assert body["statuses"]["succeeded"] == 2 and body["depth"] == [
        {"kind": "flaky", "status": "queued", "count": 1}
    ]
    assert {"oldestDueAgeMs", "expiredLeases", "deadLetters", "adjudicationsAwaitingDecision"} <= set(body)
    table = invoke("stats", "--db", str(database))
    assert table.exit_code == 0 and "queue depth by kind" in table.stdout
    assert invoke("stats", "--db", str(home / "absent.sqlite")).exit_code == 1

    preview = invoke("prune", "--older-than", "0s", "--dry-run", "--db", str(database), "--json")
    assert preview.exit_code == 0 and as_json(preview)["prune"]["occurrences"] == 2
    assert as_json(preview)["prune"]["dryRun"] is True
    kept = invoke("prune", "--older-than", "1d", "--db", str(database), "--json")
    assert kept.exit_code == 0 and as_json(kept)["prune"]["occurrences"] == 0
    pruned = invoke("prune", "--older-than", "0ms", "--db", str(database))
    assert pruned.exit_code == 0 and "deleted" in pruned.stdout
    assert invoke("prune", "--older-than", "soon", "--db", str(database)).exit_code == 2
    assert invoke("prune", "--older-than", "1d", "--status", "queued", "--db", str(database)).exit_code == 2
    assert invoke("requeue", "occ_missing", "--db", str(database), "--json").exit_code == 1
    assert invoke("pause", "occ_missing", "--db", str(database)).exit_code == 1


def test_durations() -> None:
    assert parse_duration_ms("30d") == 30 * 86_400_000
    assert parse_duration_ms("1h30m") == 5_400_000
    assert parse_duration_ms("500ms") == 500
    assert parse_duration_ms("2w") == 14 * 86_400_000
    for bad in ("", "d", "1y", "1.5h", "-1d"):
        with pytest.raises(CliFailure):
            parse_duration_ms(bad)
