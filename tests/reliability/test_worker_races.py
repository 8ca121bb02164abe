"""Worker races: several processes claim, renew and settle the same queue with short leases.

Each (occurrence, fence) must be claimed by exactly one owner, stale owners' renew/settle must
fail with SCHEDULER_LEASE_LOST, every occurrence must end settled exactly once, and the event
history must replay to the final rows.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from scheduler import open_store

from . import workloads
from .invariants import Dump, assert_invariants, dump_database, quick_check

pytestmark = pytest.mark.reliability

LEASE_MS = 250
ARRIVAL_MS = 40  # about the pace 4 workers settle at, so the queue stays short
AUTHORITY = {"principal": {"type": "service", "id": "race"}}


def _request(now: int, n: int) -> dict[str, Any]:
    # Work becomes available gradually, so an expired lease is reclaimed while its stale owner
    # still sleeps (claims take expired leases and available work in time order).
    available = now + ARRIVAL_MS * n
    return {"job_id": "race-job", "scheduled_for": now, "trigger_key": f"race-{n}", "available_at": available}


def _prepare(path: Path, count: int) -> None:
    store = open_store(path)
    try:
        store.create_job(id="race-job", kind="automation", authority=AUTHORITY, max_attempts=32)
        now = workloads.now_ms()
        for start in range(0, count, 200):
            batch = range(start, min(count, start + 200))
            store.enqueue_many([_request(now, n) for n in batch])
    finally:
        store.close()


def _run_workers(path: Path, workers: int, seed: int, tmp: Path) -> list[dict[str, Any]]:
    go = tmp / "go"
    logs = [tmp / f"worker-{i}.jsonl" for i in range(workers)]
    procs = [
        subprocess.Popen(
            workloads.command("race", path, i, seed + i, logs[i], go, LEASE_MS),
            stdout=(tmp / f"worker-{i}.out").open("wb"),
            stderr=subprocess.STDOUT,
        )
        for i in range(workers)
    ]
    deadline = time.monotonic() + 120
    while not all(log.exists() and log.read_text().count("\n") >= 1 for log in logs):
        assert time.monotonic() < deadline, "race workers did not start"
        assert all(p.poll() is None for p in procs), "a race worker exited early"
        time.sleep(0.01)
    go.touch()
    for i, proc in enumerate(procs):
        code = proc.wait(timeout=900)
        assert code == 0, f"worker {i} failed:\n{(tmp / f'worker-{i}.out').read_text()[-4000:]}"
    records = []
    for log in logs:
        records.extend(json.loads(line) for line in log.read_text().splitlines())
    return records


def _claims_by_fence(records: list[dict[str, Any]], dump: Dump) -> dict[tuple[str, int], dict[str, Any]]:
    """(occurrence, fence) -> the single logged claim; checks events agree one-to-one."""
    logged: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if record["t"] == "claim" and "occ" in record:
            logged[(record["occ"], record["fence"])].append(record)
    doubles = {key: [r["owner"] for r in rs] for key, rs in logged.items() if len(rs) > 1}
    assert not doubles, f"(occurrence, fence) claimed by more than one owner: {list(doubles.items())[:5]}"
    events: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for event in dump["events"]:
        if event["event_type"] in ("occurrence_claimed", "occurrence_reclaimed"):
            events[(event["occurrence_id"], event["fence"])].append(event)
    assert set(events) == set(logged), "claim events differ from the claims the workers saw"
    for key, claim_events in events.items():
        assert len(claim_events) == 1, f"{key}: {len(claim_events)} claim events"
        assert claim_events[0]["owner_id"] == logged[key][0]["owner"], f"{key}: event owner differs"
        logged[key][0]["occurred_at"] = claim_events[0]["occurred_at"]
    return {key: rs[0] for key, rs in logged.items()}


def _lease_timeline(records: list[dict[str, Any]]) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """(occ, fence) -> [(call end, lease expiry it returned)] of successful claims and renews."""
    timeline: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for record in records:
        if record["t"] in ("claim", "renew") and "error" not in record and record.get("expires") is not None:
            timeline[(record["occ"], record["fence"])].append((record["end"], record["expires"]))
    return timeline


def _known_expiry(timeline: list[tuple[int, int]], before: int) -> int:
    """The latest lease expiry the holder had learned before ``before`` (ms)."""
    return max((expires for end, expires in timeline if end <= before), default=0)


def _check_stale_calls(
    records: list[dict[str, Any]], claims: dict[tuple[str, int], dict[str, Any]]
) -> Counter[str]:
    """Stale renew/settle must fail with LEASE_LOST; every LEASE_LOST must be justified."""
    timeline = _lease_timeline(records)
    superseded = {
        (occ, fence): claims[(occ, fence + 1)]["occurred_at"]
        for (occ, fence) in claims
        if (occ, fence + 1) in claims
    }
    tally: Counter[str] = Counter()
    for record in records:
        if record["t"] not in ("renew", "settle"):
            continue
        key = (record["occ"], record["fence"])
        known_expiry = _known_expiry(timeline.get(key, []), record["start"])
        newer_claim = superseded.get(key)
        stale = record["start"] >= known_expiry or (newer_claim is not None and newer_claim < record["start"])
        error = record.get("error")
        if record.get("stale") or stale:
            assert error == "SCHEDULER_LEASE_LOST", f"stale {record['t']} did not fail: {record}"
            reclaimed = newer_claim is not None and newer_claim < record["start"]
            tally[f"stale_{record['t']}_rejected"] += 1
            tally[f"stale_{record['t']}_rejected_{'after_reclaim' if reclaimed else 'after_expiry'}"] += 1
        elif error is not None:
            justified = record["end"] >= known_expiry or (
                newer_claim is not None and newer_claim <= record["end"]
            )
            assert error == "SCHEDULER_LEASE_LOST" and justified, f"unjustified failure: {record}"
            tally[f"{record['t']}_lost_while_waiting"] += 1
        else:
            tally[f"{record['t']}_ok"] += 1
    return tally


def _check_settled_once(records: list[dict[str, Any]], dump: Dump) -> Counter[str]:
    terminal = Counter(
        e["occurrence_id"]
        for e in dump["events"]
        if e["event_type"] in ("occurrence_succeeded", "occurrence_dead_lettered")
    )
    successes = Counter(r["occ"] for r in records if r["t"] == "settle" and r.get("status") == "succeeded")
    statuses: Counter[str] = Counter()
    for row in dump["occurrences"]:
        oid = row["occurrence_id"]
        statuses[row["status"]] += 1
        assert row["status"] in ("succeeded", "dead_letter"), f"{oid} ended {row['status']}"
        assert terminal[oid] == 1, f"{oid}: {terminal[oid]} terminal events"
        assert successes[oid] == (1 if row["status"] == "succeeded" else 0), (
            f"{oid}: {successes[oid]} successes"
        )
    return statuses


def test_lease_races_between_processes(
    tmp_path: Path, scale: Any, seed: int, figures: dict[str, Any]
) -> None:
    path = tmp_path / "store" / "kernel.sqlite"
    _prepare(path, scale.race_occurrences)
    started = time.monotonic()
    records = _run_workers(path, scale.race_workers, random.Random(seed).randrange(2**31), tmp_path)
    elapsed = time.monotonic() - started
    assert quick_check(path) == ["ok"]
    dump = dump_database(path)
    assert len(dump["occurrences"]) == scale.race_occurrences
    claims = _claims_by_fence(records, dump)
    tally = _check_stale_calls(records, claims)
    statuses = _check_settled_once(records, dump)
    assert_invariants(dump, "after the race")
    assert tally["stale_renew_rejected"] > 0 and tally["stale_settle_rejected"] > 0, tally
    reclaims = sum(1 for e in dump["events"] if e["event_type"] == "occurrence_reclaimed")
    figures["worker_races"] = {
        "workers": scale.race_workers,
        "occurrences": scale.race_occurrences,
        "claims": len(claims),
        "reclaims_after_expiry": reclaims,
        "final_statuses": dict(statuses),
        "calls": dict(sorted(tally.items())),
        "seconds": round(elapsed, 1),
    }
