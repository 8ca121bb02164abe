"""The ``scheduler worker`` usage errors and the operator commands ``prune`` and ``stats`` with
``--json`` and exit codes (``scheduler worker`` processes end to end, with ``requeue``, ``pause`` and
``resume``: tests/conformance/test_worker_processes.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from scheduler.cli import app
from scheduler.cli.common import CliFailure
from scheduler.cli.ops import parse_duration_ms
from tests.worker_support import HANDLER_KINDS, HANDLERS, add_job, enqueue, new_store

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def invoke(*args: str) -> Result:
    return runner.invoke(app, list(args))


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "handlers_module.py").write_text(HANDLERS)
    return tmp_path


@pytest.fixture
def database(home: Path) -> Iterator[Path]:
    path = home / "db" / "k.sqlite"
    store = new_store(path)
    for kind in HANDLER_KINDS:
        add_job(store, kind, max_attempts=3)
    store.close()
    yield path


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
    queued = enqueue(store, "flaky", "queued")
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
    never_claimed = invoke("pause", queued, "--db", str(database), "--json")  # fence 0: not running
    assert never_claimed.exit_code == 1, never_claimed.output
    assert as_json(never_claimed)["error"]["code"] == "SCHEDULER_OCCURRENCE_NOT_RUNNING"


def test_durations() -> None:
    assert parse_duration_ms("30d") == 30 * 86_400_000
    assert parse_duration_ms("1h30m") == 5_400_000
    assert parse_duration_ms("500ms") == 500
    assert parse_duration_ms("2w") == 14 * 86_400_000
    for bad in ("", "d", "1y", "1.5h", "-1d"):
        with pytest.raises(CliFailure):
            parse_duration_ms(bad)


def test_resume_run_again_reports_the_resume_already_made(database: Path) -> None:
    """``scheduler resume OCC`` whose outcome the operator did not see, run again: the default
    request id named the control revision, which the first run had changed, so the second was
    refused as a conflict (``pause`` and ``requeue`` replay theirs)."""
    store = new_store(database)
    try:
        occurrence = enqueue(store, "long", "one")
        claimed = store.claim_next(owner_id="w", lease_ms=60_000)
        assert claimed is not None and claimed.id == occurrence
        assert invoke("--db", str(database), "pause", occurrence).exit_code == 0
        control = store.get_occurrence_control(occurrence)
        assert control is not None
        store.ack_occurrence_pause(
            occurrence_id=occurrence, owner_id="w", fence=claimed.fence, request_id=control.pause_request_id,
            expected_revision=control.revision, safe_point="adapter_checkpoint",
        )
    finally:
        store.close()
    first = invoke("--db", str(database), "resume", occurrence, "--json")
    again = invoke("--db", str(database), "resume", occurrence, "--json")
    assert first.exit_code == 0 and again.exit_code == 0, again.output
    assert not as_json(first)["control"].get("deduplicated")
    assert as_json(again)["control"].get("deduplicated") is True
    assert as_json(again)["control"]["revision"] == as_json(first)["control"]["revision"]
    text = invoke("--db", str(database), "resume", occurrence)
    assert text.exit_code == 0 and "resumed (already)" in text.stdout
