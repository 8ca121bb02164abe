"""``scheduler cancel ID [--reason R]`` on both backends (``place``), with the listings that show a
cancelled run (``dead-letters``, ``stats``) and ``requeue`` putting it back. (Bad option values and
a missing database: ``test_cli_truthfulness.py``, with every write command.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from cli_support import invoke, run_json
from cli_support import isolated_environment as isolated_environment
from store_places import SqliteFilePlace, StorePlace

from scheduler import SchedulerKernelError, SchedulerStore
from scheduler.testing import T0, dump_tables

REPO = Path(__file__).resolve().parents[1]
AUTHORITY = {"principal": {"type": "service", "id": "ops"}, "requestedCapabilities": ["mail.send"]}


@pytest.fixture
def store(place: StorePlace) -> Iterator[SchedulerStore]:
    opened = place.open()
    opened.create_job(id="mail", kind="email", authority=AUTHORITY, max_attempts=2)
    yield opened
    opened.close()


@pytest.fixture
def db(place: StorePlace, store: SchedulerStore) -> list[str]:
    """``--db … [--schema …]`` naming the place."""
    if isinstance(place, SqliteFilePlace):
        return ["--db", str(place.path)]
    return ["--db", place.server.url.render_as_string(hide_password=False), "--schema", place.schema]


def enqueue(store: SchedulerStore, key: str) -> str:
    return store.enqueue_occurrence(job_id="mail", scheduled_for=T0, trigger_key=key).id


def test_cancel_prints_the_dead_letter_and_again_says_already(store: SchedulerStore, db: list[str]) -> None:
    queued = enqueue(store, "q")
    shown = invoke("cancel", queued, "--reason", "customer asked", *db)
    assert shown.exit_code == 0, shown.output
    assert "cancelled" in shown.stdout and "(already)" not in shown.stdout and "dead_letter" in shown.stdout
    occurrence = store.get_occurrence(queued)
    assert occurrence is not None
    assert occurrence.last_error == {"code": "CANCELLED", "message": "customer asked"}
    before = dump_tables(store)
    again = invoke("cancel", queued, *db)
    assert again.exit_code == 0, again.output
    assert "cancelled (already)" in again.stdout
    body = run_json("cancel", queued, *db)
    assert (body["deduplicated"], body["previousStatus"]) == (True, "dead_letter")
    assert body["occurrence"] == occurrence.to_dict()
    assert dump_tables(store) == before


def test_cancel_json_of_a_running_run_and_the_former_owner_is_fenced_out(
    store: SchedulerStore, db: list[str]
) -> None:
    enqueue(store, "r")
    running = store.claim_next(owner_id="w1", lease_ms=60_000)
    assert running is not None
    text = invoke("cancel", running.id, *db)
    assert text.exit_code == 0 and "told at its next lease renewal" in text.stdout, text.output
    with pytest.raises(SchedulerKernelError) as lost:
        store.renew(occurrence_id=running.id, owner_id="w1", fence=running.fence, lease_ms=60_000)
    assert lost.value.code == "SCHEDULER_LEASE_LOST"
    other = enqueue(store, "r2")
    claimed = store.claim_occurrence(occurrence_id=other, owner_id="w2", lease_ms=60_000)
    assert claimed is not None
    body = run_json("cancel", other, "--reason", "stop", *db)
    assert (body["deduplicated"], body["previousStatus"]) == (False, "running")
    assert body["occurrence"]["status"] == "dead_letter"
    assert body["occurrence"]["fence"] == claimed.fence + 1
    assert body["occurrence"]["lastError"] == {"code": "CANCELLED", "message": "stop"}


def test_dead_letters_and_stats_show_a_cancelled_run_and_requeue_puts_it_back(
    store: SchedulerStore, db: list[str]
) -> None:
    queued = enqueue(store, "q")
    run_json("cancel", queued, *db)
    listed = run_json("dead-letters", *db)
    assert [item["id"] for item in listed["deadLetters"]] == [queued]
    assert listed["deadLetters"][0]["lastError"]["code"] == "CANCELLED"
    table = invoke("dead-letters", *db)
    assert table.exit_code == 0 and "CANCELLED" in table.stdout
    stats = run_json("stats", *db)["stats"]
    assert stats["deadLetters"] == 1 and stats["statuses"]["dead_letter"] == 1
    assert stats["adjudicationsAwaitingDecision"] == 0
    requeued = run_json("requeue", queued, *db)  # defaults: code CANCELLED, the fence after the cancel
    assert (requeued["occurrence"]["status"], requeued["occurrence"]["fence"]) == ("retry_wait", 1)
    assert run_json("dead-letters", *db)["count"] == 0


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        ("succeeded", "SCHEDULER_CONFLICT"),
        ("failed", "SCHEDULER_CONFLICT"),
        ("missing", "SCHEDULER_NOT_FOUND"),
    ],
)
def test_a_refused_cancel_exits_1_and_writes_nothing(
    store: SchedulerStore, db: list[str], setup: str, code: str
) -> None:
    target = "occ_missing"
    if setup != "missing":
        target = enqueue(store, setup)
        claimed = store.claim_occurrence(occurrence_id=target, owner_id="w", lease_ms=60_000)
        assert claimed is not None
        store.settle(occurrence_id=target, owner_id="w", fence=claimed.fence, outcome=setup, retryable=False)
    before = dump_tables(store)
    body: Any = run_json("cancel", target, *db, exit_code=1)
    assert body["error"]["code"] == code
    assert invoke("cancel", target, *db).exit_code == 1
    assert dump_tables(store) == before


HOSTILE_REASON = "lone \ud800, escaped-byte \udcff, escape \x1b[31m, rtl \u202e, nul \x00"


STRICT_UTF8: Final = {"PYTHONIOENCODING": "utf-8"}
C_LOCALE: Final = {"LC_ALL": "C.UTF-8"}
"""Python's stdout then uses ``surrogateescape``: a lone surrogate came out as a raw, non-UTF-8 byte."""


def test_listings_of_a_reason_no_encoding_can_print_exit_0_with_valid_utf8_json(
    store: SchedulerStore, db: list[str]
) -> None:
    """A reason is any text JSON can hold (API §3: lone surrogates too). The operator's listings,
    run as real processes under a strict UTF-8 stdout or the C locale's surrogateescape, print it
    escaped: exit 0, stdout valid UTF-8, and ``--json`` decodes back to the stored reason."""
    cancelled = store.cancel_occurrence(occurrence_id=enqueue(store, "hostile"), reason=HOSTILE_REASON)

    def run(encoding: dict[str, str], *args: str) -> str:
        environment = {
            key: value for key, value in os.environ.items() if key not in ("PYTHONIOENCODING", "LC_ALL")
        }
        environment.update(encoding, PYTHONPATH=str(REPO), COLUMNS="200")
        done = subprocess.run(
            [sys.executable, "-m", "scheduler", *args, *db], capture_output=True, env=environment, timeout=120
        )
        assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
        return done.stdout.decode("utf-8")  # strict: raises on a raw surrogate-escaped byte

    listed = json.loads(run(STRICT_UTF8, "dead-letters", "--json"))
    assert listed["deadLetters"][0]["lastError"] == {"code": "CANCELLED", "message": HOSTILE_REASON}
    history = json.loads(run(C_LOCALE, "history", "--occurrence", cancelled.id, "--json"))
    assert HOSTILE_REASON in [event["data"].get("reason") for event in history["events"]]
    shown = run(STRICT_UTF8, "occurrences", "show", cancelled.id)
    assert "\\ud800" in shown and "\x1b" not in shown
