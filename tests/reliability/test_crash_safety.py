"""Crash safety: child processes writing through the public API are SIGKILLed at random moments.

After every kill the database must open, verify as schema v6, pass ``quick_check``, satisfy
every invariant of ``invariants.py`` and contain every write the child reported (on its stdout
pipe, after the call returned) as committed.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from dump import diff, dump
from recorded import REFERENCE_DBS, copy_reference, reference_dump

from scheduler import open_store
from scheduler.schema.catalog import verify_schema

from . import workloads
from .invariants import Dump, assert_invariants, dump_database, file_sha256, quick_check

pytestmark = pytest.mark.reliability

KILLS_PER_DATABASE = 25


class Child:
    """A workload child whose stdout lines are read continuously by a thread."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[dict[str, Any]] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        # stderr is drained as it comes, so a child that logs much never blocks on a full pipe
        self._stderr: list[bytes] = []
        self.stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.stderr_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if not raw.endswith(b"\n"):
                break  # a line cut by SIGKILL was never reported
            record = json.loads(raw)
            self.lines.append(record)
            if "ready" in record or "imported" in record:
                self.ready.set()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):  # type: ignore[union-attr]
            self._stderr.append(chunk)

    def became_ready(self, timeout: float) -> bool:
        """Whether the child said it is ready within ``timeout`` s; ``False`` at once if it exited
        first (its own failure is then what :meth:`fatal` reports)."""
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.reader.join(timeout=5)
                return self.ready.is_set()
        return True

    def kill(self) -> int:
        self.proc.kill()
        code = self.proc.wait(timeout=30)
        self.reader.join(timeout=30)
        self.stderr_reader.join(timeout=30)
        return code

    def never_ready(self) -> str:
        """Why the child did not become ready: its failure, or (still running past the timeout:
        killed now, so it outlives no test) what it wrote to stderr."""
        if self.proc.poll() is None:
            self.kill()
            return "still running, killed; stderr:\n" + b"".join(self._stderr).decode(errors="replace")
        return self.fatal() or f"exited with code {self.proc.returncode} before it was ready"

    def fatal(self) -> str | None:
        messages = [str(line["fatal"]) for line in self.lines if "fatal" in line]
        if messages:
            return messages[0]
        if self.proc.poll() not in (None, 0, -9):
            self.stderr_reader.join(timeout=30)
            return b"".join(self._stderr).decode(errors="replace")
        return None


def verify_after_crash(path: Path) -> Dump:
    """open_store succeeds, the v6 catalog verifies, quick_check is ok; returns the dump."""
    store = open_store(path)
    try:
        verify_schema(store.connection, 6)
    finally:
        store.close()
    assert quick_check(path) == ["ok"]
    return dump_database(path)


def _index(dump: Dump) -> dict[str, set[tuple[Any, ...]]]:
    index: dict[str, set[tuple[Any, ...]]] = {"jobs": {(j["job_id"],) for j in dump["jobs"]}}
    index["occ"] = {(o["occurrence_id"],) for o in dump["occurrences"]}
    index["holder"], index["request"], index["value"], index["settled"] = set(), set(), set(), set()
    for event in dump["events"]:
        data = json.loads(event["data_json"])
        kind, subject = event["event_type"], event["occurrence_id"] or event["job_id"]
        index["holder"].add((kind, subject, event["fence"], event["owner_id"]))
        index["request"].add((kind, subject, data.get("requestId")))
        index["value"].add((kind, subject, data.get("leaseExpiresAt") or data.get("toRevision")))
        if kind in SETTLED and data.get("reason") != "lease_expired":  # not the expired-lease sweep
            index["settled"].add((subject, event["fence"], event["owner_id"]))
    index["reservations"] = {
        (r["occurrence_id"], r["units"]) for r in dump["scheduler_authority_reservations"]
    }
    index["retries"] = {(r["occurrence_id"], r["request_id"]) for r in dump["scheduler_occurrence_retries"]}
    index["policy"] = {(p["revision"],) for p in dump["scheduler_authority_policies"]}
    return index


CLAIMS = ("occurrence_claimed", "occurrence_reclaimed")
SETTLED = ("occurrence_succeeded", "occurrence_retry_scheduled", "occurrence_dead_lettered")


def _present(index: dict[str, set[tuple[Any, ...]]], report: dict[str, Any]) -> bool:
    """Is the write this report describes in the database?"""
    op, occ = report["op"], report.get("occ")
    holder, request, value = index["holder"], index["request"], index["value"]
    if op == "create_job":
        return (report["job"],) in index["jobs"]
    if op == "update_job":
        return ("job_updated", report["job"], report["revision"]) in value
    if op == "enqueue":
        return (occ,) in index["occ"]
    if op == "claim":
        return any((kind, occ, report["fence"], report["owner"]) in holder for kind in CLAIMS)
    if op == "renew":
        return ("occurrence_renewed", occ, report["until"]) in value
    if op == "settle":
        return (report["event"], occ, report["fence"], report["owner"]) in holder
    if op == "reserve":
        return (occ, report["units"]) in index["reservations"]
    if op in ("pause", "ack", "resume"):
        kind = {"pause": "occurrence_pause_requested", "ack": "occurrence_paused"}.get(
            op, "occurrence_resume_requested"
        )
        return (kind, occ, report["request"]) in request
    if op == "requeue":
        return (occ, report["request"]) in index["retries"]
    if op == "policy":
        return any(revision >= report["revision"] for (revision,) in index["policy"])
    raise AssertionError(f"unknown report {report}")


def missing_reports(dump: Dump, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    index = _index(dump)
    return [report for report in reports if "op" in report and not _present(index, report)]


def half_applied_batches(dump: Dump, intents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Batches announced before the call that are now partly in the database."""
    index = _index(dump)
    broken = []
    for intent in intents:
        if intent["intent"] == "enqueue_many":
            applied = [(occ,) in index["occ"] for occ in intent["occs"]]
        else:
            applied = [(occ, fence, owner) in index["settled"] for occ, fence, owner in intent["items"]]
        if any(applied) and not all(applied):
            broken.append(intent)
    return broken


def test_sigkill_during_random_writes(tmp_path: Path, scale: Any, seed: int, figures: dict[str, Any]) -> None:
    rng = random.Random(seed)
    kills = early = 0
    ops: Counter[str] = Counter()
    expected_errors: Counter[str] = Counter()
    reports: list[dict[str, Any]] = []
    intents: list[dict[str, Any]] = []
    batches = 0
    path = tmp_path / "db-0" / "kernel.sqlite"
    started = time.monotonic()
    while kills < scale.kills:
        if kills and kills % KILLS_PER_DATABASE == 0 and reports:
            path = tmp_path / f"db-{kills}" / "kernel.sqlite"
            reports, intents = [], []
        child = Child(workloads.command("crash", path, rng.randrange(2**31)))
        if rng.random() < 0.15:  # also kill during interpreter start-up and open_store
            time.sleep(rng.uniform(0.0, 0.6))
        else:
            if not child.became_ready(120):
                raise AssertionError(f"crash child never became ready: {child.never_ready()}")
            time.sleep(rng.uniform(0.0, 0.35))
        landed_after_ready = child.ready.is_set()
        problem = child.fatal()
        code = child.kill()
        problem = problem or child.fatal()
        assert problem is None, f"child failed on its own:\n{problem}"
        assert code == -9, f"child exit code {code}"
        new = [line for line in child.lines if "op" in line]
        reports.extend(new)
        announced = [line for line in child.lines if "intent" in line]
        intents.extend(announced)
        batches += len(announced)
        ops.update(line["op"] for line in new)
        expected_errors.update(line["expected_error"] for line in child.lines if "expected_error" in line)
        if landed_after_ready:
            kills += 1
        else:
            early += 1
        if not path.exists():
            continue  # killed before the database file was created
        dump = verify_after_crash(path)
        assert_invariants(dump, f"after kill {kills + early}")
        lost = missing_reports(dump, reports)
        assert not lost, f"after kill {kills + early}: reported commits missing: {lost[:5]}"
        partial = half_applied_batches(dump, intents)
        assert not partial, f"after kill {kills + early}: half-applied batches: {partial[:5]}"
    figures["crash_safety"] = {
        "kills_while_writing": kills,
        "kills_during_startup_or_open": early,
        "committed_writes_reported": sum(ops.values()),
        "batches_checked_all_or_nothing": batches,
        "by_operation": dict(sorted(ops.items())),
        "expected_errors_met": dict(sorted(expected_errors.items())),
        "seconds": round(time.monotonic() - started, 1),
    }
    assert kills >= scale.kills
    assert sum(ops.values()) > 0


def _upgrade_outcome(path: Path, original: str, child: Child) -> str:
    if Path(f"{path}-journal").exists():
        return "killed_mid_upgrade_hot_journal"
    if file_sha256(path) == original:
        return "killed_before_upgrade"
    return "upgraded_before_kill" if any("opened" in line for line in child.lines) else "killed_after_commit"


def test_sigkill_during_upgrade(tmp_path: Path, scale: Any, seed: int, figures: dict[str, Any]) -> None:
    """A v1 file killed at any moment of its upgrade opens later exactly as a clean upgrade would."""
    source = REFERENCE_DBS / "v1.sqlite"
    expected = reference_dump(1, upgraded=True)
    rng = random.Random(seed + 1)
    duration = 0.0
    outcomes: Counter[str] = Counter()
    for attempt in range(scale.upgrade_kills + 1):
        path = tmp_path / f"up-{attempt}" / "kernel.sqlite"
        path.parent.mkdir(mode=0o700)
        copy_reference(path.parent, 1, path.name)
        child = Child(workloads.command("open", path))
        if not child.became_ready(120):
            raise AssertionError(f"open child never started: {child.never_ready()}")
        if attempt == 0:  # not killed: measures how long the upgrade takes in the child
            assert child.proc.wait(timeout=60) == 0
            child.reader.join(timeout=30)
            duration = child.lines[-1]["at"] - child.lines[0]["imported"]
        else:
            time.sleep(rng.uniform(0.0, 1.5 * duration))
            child.kill()
            outcomes[_upgrade_outcome(path, file_sha256(source), child)] += 1
        assert child.fatal() is None, child.fatal()
        store = open_store(path, clock=lambda: 1767312000000)
        verify_schema(store.connection, 6)
        store.close()
        problems = diff(expected, dump(path))
        assert not problems, f"attempt {attempt}: {problems[:3]}"
    figures["crash_during_upgrade"] = {
        "kills": scale.upgrade_kills,
        "upgrade_ms": round(duration * 1000, 1),
        **dict(sorted(outcomes.items())),
    }
