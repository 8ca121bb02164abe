"""Operators running the same idempotent command at once: the losers report the winner's work.

Several ``scheduler`` processes are started together on one occurrence (both backends) while a
worker (a thread of the test) acts on it the moment the winner's command lets it: it claims a
requeued dead letter or a resumed or adjudicated occurrence, acknowledges a pause. A command that
reads the occurrence after that sees a state newer than the one it was meant for. Every one of
them must exit 0, one doing the work and the others reporting it as already done
(``deduplicated``), and the work must be done exactly once; a real conflict (another request id,
error code or decision) still exits 1. ``requeue`` runs as ``python -m scheduler`` interpreters;
the other commands in forked processes running the same CLI (they start in milliseconds).

Before the fix, the ``requeue`` and ``adjudication decide`` losers exited 1
(``SCHEDULER_REQUEUE_EVIDENCE_CONFLICT``, ``SCHEDULER_ADJUDICATION_ALREADY_RECORDED``), and so did
the same ``requeue`` run again after a worker claimed the occurrence. ``pause``, ``resume`` and
``prune`` already held.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from backends import POSTGRESQL
from cli_support import invoke
from cli_support import isolated_environment as isolated_environment
from store_places import StorePlace
from typer.testing import CliRunner

from scheduler import SchedulerStore
from scheduler.cli import app
from scheduler.contract.constants import SAFE_POINT_ADAPTER_CHECKPOINT

REPO = Path(__file__).resolve().parents[1]
PROCESSES = 3
FORK = multiprocessing.get_context("fork")
AUTHORITY = {"principal": {"type": "user", "id": "u"}, "workspaceId": "ws", "requestedCapabilities": ["a"]}
LEASE = 600_000


def cli_target(place: StorePlace) -> list[str]:
    if place.backend == POSTGRESQL:
        url = place.server.url.render_as_string(hide_password=False)  # type: ignore[union-attr]
        return ["--db", url, "--schema", place.schema]  # type: ignore[union-attr]
    return ["--db", str(place.path)]  # type: ignore[union-attr]


def run_together(place: StorePlace, *arguments: str, count: int = PROCESSES) -> list[tuple[int, Any]]:
    """``python -m scheduler ARGUMENTS --json`` in ``count`` interpreters started at once."""
    command = [sys.executable, "-m", "scheduler", *cli_target(place), *arguments, "--json"]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    started = [
        subprocess.Popen(command, cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(count)
    ]
    return [outcome(*process.communicate(timeout=120), process.returncode) for process in started]


def outcome(out: bytes | str, err: bytes | str, code: int) -> tuple[int, Any]:
    """(exit code, the parsed JSON output) of one command (its whole output if not JSON)."""
    try:
        return code, json.loads(out)
    except ValueError:
        return code, f"{out!r} {err!r}"


def forked_command(arguments: list[str], go: Any, results: Any) -> None:
    go.wait(60)
    result = CliRunner().invoke(app, arguments)
    results.put(outcome(result.stdout, "", result.exit_code))


class Forked:
    """The same command in forked processes (a fork starts in milliseconds), waiting for
    :meth:`outcomes` to release them together. Fork them before starting a thread: a fork
    copies no thread, only the locks it might hold."""

    def __init__(self, place: StorePlace, *arguments: str, count: int = 3) -> None:
        self.go, self.results = FORK.Event(), FORK.Queue()
        command = [*cli_target(place), *arguments, "--json"]
        self.processes = [
            FORK.Process(target=forked_command, args=(command, self.go, self.results)) for _ in range(count)
        ]
        for process in self.processes:
            process.start()

    def outcomes(self) -> list[tuple[int, Any]]:
        self.go.set()
        try:
            return [self.results.get(timeout=120) for _ in self.processes]
        finally:
            for process in self.processes:
                process.join(60)


@contextmanager
def worker(place: StorePlace, act: Callable[[SchedulerStore], bool]) -> Iterator[None]:
    """A thread calling ``act`` on a store of its own until it returns True (or the block ends)."""
    stop = threading.Event()
    done = threading.Event()
    failures: list[BaseException] = []

    def loop() -> None:
        store = place.open()
        try:
            while not stop.is_set() and not act(store):
                stop.wait(0.005)
            done.set()
        except BaseException as error:  # reported by the test
            failures.append(error)
        finally:
            store.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
        assert done.wait(30), "the worker never acted"
    finally:
        stop.set()
        thread.join(30)
    assert failures == []


def claim(store: SchedulerStore) -> bool:
    return store.claim_next(owner_id="worker", lease_ms=LEASE) is not None


def dead_letter(store: SchedulerStore) -> str:
    store.create_job(id="job", kind="mail", authority=AUTHORITY, max_attempts=1)
    occurrence = store.enqueue_occurrence(job_id="job", scheduled_for=0, trigger_key="k").id
    claimed = store.claim_next(owner_id="first", lease_ms=LEASE)
    assert claimed is not None
    fence, error = claimed.fence, {"code": "BOOM"}
    store.settle(occurrence_id=occurrence, owner_id="first", fence=fence, outcome="failed", error=error)
    return occurrence


def events(store: SchedulerStore, occurrence_id: str, kind: str) -> int:
    return sum(event.type == kind for event in store.history(occurrence_id=occurrence_id, limit=200))


def assert_one_did_it(outcomes: list[tuple[int, Any]], deduplicated: Callable[[Any], bool]) -> None:
    assert [code for code, _ in outcomes] == [0] * len(outcomes), outcomes
    assert sorted(deduplicated(body) for _, body in outcomes) == [False] + [True] * (len(outcomes) - 1)


def test_concurrent_requeues_of_one_dead_letter_all_succeed_and_requeue_once(place: StorePlace) -> None:
    with place.open() as store:
        occurrence = dead_letter(store)
    with worker(place, claim):
        outcomes = run_together(place, "requeue", occurrence)
    assert_one_did_it(outcomes, lambda body: body["deduplicated"])
    with place.open() as store:
        assert events(store, occurrence, "occurrence_requeued") == 1
        current = store.get_occurrence(occurrence)
        assert current is not None and (current.status, current.lease_owner) == ("running", "worker")
    # Run again later: the requeue already made is reported, not refused.
    again = invoke(*cli_target(place), "requeue", occurrence, "--json")
    assert (again.exit_code, json.loads(again.stdout)["deduplicated"]) == (0, True)
    assert "requeued (already)" in invoke(*cli_target(place), "requeue", occurrence).stdout
    # Real conflicts: another request id or error code for the dead letter that is no longer one.
    for pinned in (["--request-id", "another"], ["--error-code", "OTHER"]):
        conflict = invoke(*cli_target(place), "requeue", occurrence, *pinned, "--json")
        assert conflict.exit_code == 1
        assert json.loads(conflict.stdout)["error"]["code"] == "SCHEDULER_REQUEUE_EVIDENCE_CONFLICT"


def running_occurrence(store: SchedulerStore) -> str:
    store.create_job(id="job", kind="mail", authority=AUTHORITY, max_attempts=3)
    occurrence = store.enqueue_occurrence(job_id="job", scheduled_for=0, trigger_key="k").id
    assert store.claim_next(owner_id="worker", lease_ms=LEASE) is not None
    return occurrence


def acknowledge_pause(occurrence_id: str) -> Callable[[SchedulerStore], bool]:
    def act(store: SchedulerStore) -> bool:
        control = store.get_occurrence_control(occurrence_id)
        current = store.get_occurrence(occurrence_id)
        if control is None or control.state != "pause_requested" or current is None:
            return False
        store.ack_occurrence_pause(
            occurrence_id=occurrence_id,
            owner_id="worker",
            fence=current.fence,
            request_id=control.pause_request_id,
            expected_revision=control.revision,
            safe_point=SAFE_POINT_ADAPTER_CHECKPOINT,
        )
        return True

    return act


def test_concurrent_pauses_and_resumes_all_succeed_and_act_once(place: StorePlace) -> None:
    with place.open() as store:
        occurrence = running_occurrence(store)
    pauses = Forked(place, "pause", occurrence)
    with worker(place, acknowledge_pause(occurrence)):
        paused = pauses.outcomes()
    assert_one_did_it(paused, lambda body: body["control"].get("deduplicated", False))
    with place.open() as store:
        control = store.get_occurrence_control(occurrence)
        assert control is not None and control.state == "paused"
        assert events(store, occurrence, "occurrence_pause_requested") == 1
    resumes = Forked(place, "resume", occurrence)
    with worker(place, claim):
        resumed = resumes.outcomes()
    assert_one_did_it(resumed, lambda body: body["control"].get("deduplicated", False))
    with place.open() as store:
        assert events(store, occurrence, "occurrence_resume_requested") == 1
        current = store.get_occurrence(occurrence)
        assert current is not None and (current.status, current.lease_owner) == ("running", "worker")


@pytest.mark.parametrize("place", ["sqlite"], indirect=True)
def test_concurrent_prunes_delete_each_row_once(place: StorePlace) -> None:
    with place.open() as store:
        store.create_job(id="job", kind="mail", authority=AUTHORITY)
        for key in range(30):
            occurrence = store.enqueue_occurrence(job_id="job", scheduled_for=0, trigger_key=f"k{key}").id
            claimed = store.claim_next(owner_id="w", lease_ms=LEASE)
            assert claimed is not None and claimed.id == occurrence
            store.settle(occurrence_id=occurrence, owner_id="w", fence=claimed.fence, outcome="succeeded")
    outcomes = Forked(place, "prune", "--older-than", "0ms", "--batch-size", "4").outcomes()
    assert [code for code, _ in outcomes] == [0] * len(outcomes), outcomes
    assert sum(body["prune"]["occurrences"] for _, body in outcomes) == 30


def test_concurrent_identical_decisions_all_succeed_and_record_once(place: StorePlace) -> None:
    with place.open() as store:
        store.create_job(id="job", kind="mail", authority=AUTHORITY, max_attempts=1)
        occurrence = store.enqueue_occurrence(job_id="job", scheduled_for=0, trigger_key="k").id
        claimed = store.claim_next(owner_id="first", lease_ms=LEASE)
        assert claimed is not None
        unknown = {"code": "MAIL_OUTCOME_UNKNOWN"}
        store.settle(
            occurrence_id=occurrence, owner_id="first", fence=claimed.fence, outcome="failed", error=unknown
        )
        case = store.get_adjudication_case(occurrence)
        assert case is not None and case.eligible and case.evidence_digest is not None
    decision = [
        *("adjudication", "decide", occurrence, "--decision", "confirmed_not_applied"),
        *("--evidence-digest", case.evidence_digest, "--attempt", str(case.attempt)),
        *("--fence", str(case.fence), "--reason", "checked the mailbox", "--operator", "ops@example"),
    ]
    decisions = Forked(place, *decision)
    with worker(place, claim):  # the reopened occurrence is claimed at once
        decided = decisions.outcomes()
    assert_one_did_it(decided, lambda body: body["deduplicated"])
    with place.open() as store:
        assert events(store, occurrence, "occurrence_adjudication_recorded") == 1
    other = invoke(*cli_target(place), *decision[:4], "confirmed_applied", *decision[5:], "--json")
    assert other.exit_code == 1
    assert json.loads(other.stdout)["error"]["code"] == "SCHEDULER_ADJUDICATION_ALREADY_RECORDED"
