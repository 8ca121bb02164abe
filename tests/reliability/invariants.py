"""Invariants every scheduler database must satisfy, checked on a read-only dump.

``check_database(dump)`` returns human-readable problems (empty = all hold):

* every running occurrence has a lease; non-running ones have none;
* ``attempt <= max_attempts``; a claim that did not consume an attempt carries the
  documented reason (pause rebound, resume, requeue request);
* terminal rows (succeeded / dead_letter) have ``settled_at``, others do not;
* authority usage rows equal the sums of their reservations;
* nothing is half-applied: replaying each occurrence's events reproduces its row
  (status, attempt, fence, lease owner, settled_at, renewed lease expiry) and its runtime
  control (state, revision, expected fence); job revisions match their events; requeue
  requests match their events and claims.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Row = dict[str, Any]
Dump = dict[str, list[Row]]

TERMINAL = frozenset({"succeeded", "dead_letter"})
CLAIM_EVENTS = frozenset({"occurrence_claimed", "occurrence_reclaimed"})
SETTLE_EVENTS = frozenset({"occurrence_succeeded", "occurrence_retry_scheduled", "occurrence_dead_lettered"})
NO_ATTEMPT_FLAGS = ("pauseRequestRebound", "resumedWithoutAttempt", "retryRequestId")


def dump_database(path: Path | str) -> Dump:
    """Every table of the file, rows in primary-key order (read-only connection)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        con.row_factory = sqlite3.Row
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return {
            name: [dict(r) for r in con.execute(f'SELECT * FROM "{name}" ORDER BY rowid')] for name in names
        }
    finally:
        con.close()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def quick_check(path: Path | str) -> list[str]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [str(r[0]) for r in con.execute("PRAGMA quick_check")]
    finally:
        con.close()


@dataclass
class _Control:
    state: str
    revision: int
    expected_fence: int


@dataclass
class _Occurrence:
    status: str = "queued"
    attempt: int = 0
    fence: int = 0
    owner: str | None = None
    settled_at: int | None = None
    renewed_until: int | None = None
    control: _Control | None = None
    problems: list[str] = field(default_factory=list)


def _data(event: Row) -> dict[str, Any]:
    value = json.loads(event["data_json"])
    return value if isinstance(value, dict) else {}


def _expect(state: _Occurrence, ok: bool, event: Row, what: str) -> None:
    if not ok:
        state.problems.append(f"event {event['event_id']} {event['event_type']}: {what}")


def _holder_matches(state: _Occurrence, event: Row) -> bool:
    return state.status == "running" and state.fence == event["fence"] and state.owner == event["owner_id"]


def _apply_claim(state: _Occurrence, event: Row, data: dict[str, Any]) -> None:
    _expect(state, event["fence"] == state.fence + 1, event, f"fence {event['fence']} after {state.fence}")
    reclaimed = event["event_type"] == "occurrence_reclaimed"
    _expect(state, reclaimed == (state.status == "running"), event, f"claimed from {state.status}")
    _expect(state, data.get("previousStatus") == state.status, event, "previousStatus differs")
    _expect(state, data.get("previousOwner") == state.owner, event, "previousOwner differs")
    attempt = data.get("attempt")
    free = any(flag in data for flag in NO_ATTEMPT_FLAGS)
    _expect(
        state,
        attempt == state.attempt + 1 or (free and attempt == state.attempt),
        event,
        f"attempt {attempt} after {state.attempt} (flags {sorted(k for k in NO_ATTEMPT_FLAGS if k in data)})",
    )
    control = state.control
    if control is not None and (data.get("pauseRequestRebound") or data.get("resumedWithoutAttempt")):
        control.revision += 1
        control.expected_fence = event["fence"]
    state.status, state.owner, state.fence = "running", event["owner_id"], event["fence"]
    state.attempt = attempt if isinstance(attempt, int) else state.attempt
    state.renewed_until = None


def _apply_settle(state: _Occurrence, event: Row, data: dict[str, Any]) -> None:
    kind = event["event_type"]
    expired = kind == "occurrence_dead_lettered" and data.get("reason") == "lease_expired"
    _expect(state, _holder_matches(state, event), event, f"settled by a non-holder ({state.status})")
    _expect(state, data.get("attempt") == state.attempt, event, "attempt in event differs")
    control = state.control
    if kind == "occurrence_retry_scheduled":
        state.status = "retry_wait"
        if control and control.state == "resumed" and control.expected_fence == event["fence"]:
            control.revision += 1
            control.expected_fence = event["fence"] + 1
    else:
        state.status = "succeeded" if kind == "occurrence_succeeded" else "dead_letter"
        state.settled_at = event["occurred_at"]
    terminalized = bool(data.get("runtimeControlTerminalized"))
    if control is not None and not expired:
        should = control.state == "pause_requested" or (
            control.state == "resumed" and state.status != "retry_wait"
        )
        _expect(
            state, terminalized == should, event, f"control terminalization {terminalized} in {control.state}"
        )
        if terminalized:
            control.state, control.revision = "terminal", control.revision + 1
    state.owner, state.renewed_until = None, None


def _apply_control(state: _Occurrence, event: Row, data: dict[str, Any]) -> None:
    kind, control = event["event_type"], state.control
    if kind == "occurrence_pause_requested":
        _expect(
            state, state.status == "running" and state.fence == event["fence"], event, "not running at fence"
        )
        _expect(state, control is None or control.state == "terminal", event, "an active control existed")
        revision = data.get("controlRevision")
        expected = 1 if control is None else control.revision + 1
        _expect(state, revision == expected, event, f"control revision {revision}, expected {expected}")
        state.control = _Control("pause_requested", expected, event["fence"])
    elif kind == "occurrence_paused":
        # the seed records the fence but not the owner on occurrence_paused
        _expect(state, state.status == "running" and state.fence == event["fence"], event, "paused off-fence")
        ok = control is not None and control.state == "pause_requested"
        _expect(state, ok, event, "no pending pause request")
        if control is not None:
            control.state, control.revision = "paused", control.revision + 1
        state.status, state.owner, state.renewed_until = "retry_wait", None, None
    elif kind == "occurrence_resume_requested":
        ok = control is not None and control.state == "paused" and state.status == "retry_wait"
        _expect(state, ok, event, "resumed while not paused")
        if control is not None:
            control.state, control.revision = "resumed", control.revision + 1
            _expect(state, data.get("controlRevision") == control.revision, event, "controlRevision differs")


def _apply(state: _Occurrence, event: Row) -> bool:
    """Apply one event; ``False`` if the event type is not modelled (stop comparing)."""
    kind, data = event["event_type"], _data(event)
    if kind in CLAIM_EVENTS:
        _apply_claim(state, event, data)
    elif kind in SETTLE_EVENTS:
        _apply_settle(state, event, data)
    elif kind == "occurrence_renewed":
        _expect(state, _holder_matches(state, event), event, "renewed by a non-holder")
        state.renewed_until = data.get("leaseExpiresAt")
    elif kind in ("occurrence_pause_requested", "occurrence_paused", "occurrence_resume_requested"):
        _apply_control(state, event, data)
    elif kind == "occurrence_released":
        _expect(state, _holder_matches(state, event), event, "released by a non-holder")
        attempt, returned = data.get("attempt"), data.get("attemptReturned")
        expected = max(0, state.attempt - 1) if returned else state.attempt
        _expect(
            state,
            attempt == expected,
            event,
            f"attempt {attempt} after {state.attempt} (returned {returned})",
        )
        state.status, state.owner, state.renewed_until = "queued", None, None
        state.attempt = attempt if isinstance(attempt, int) else state.attempt
    elif kind == "occurrence_requeued":
        ok = state.status == "dead_letter" and state.fence == event["fence"]
        _expect(state, ok, event, f"requeued from {state.status}")
        state.status, state.settled_at = "retry_wait", None
    elif kind != "occurrence_enqueued":
        return False
    return True


def _replay_occurrence(row: Row, events: list[Row], control: Row | None) -> list[str]:
    oid = row["occurrence_id"]
    if not events or events[0]["event_type"] != "occurrence_enqueued":
        return [f"{oid}: history does not start with occurrence_enqueued"]
    state = _Occurrence()
    if any(ev["event_type"] == "occurrence_enqueued" for ev in events[1:]):
        return [f"{oid}: enqueued twice"]
    for event in events[1:]:
        if not _apply(state, event):
            return [f"{oid}: {p}" for p in state.problems]  # adjudication etc.: not modelled here
    got = (row["status"], row["attempt"], row["fence"], row["lease_owner"], row["settled_at"])
    want = (state.status, state.attempt, state.fence, state.owner, state.settled_at)
    problems = [f"{oid}: {p}" for p in state.problems]
    if got != want:
        problems.append(f"{oid}: row (status, attempt, fence, owner, settled_at)={got}, events say {want}")
    if state.renewed_until is not None and row["lease_expires_at"] != state.renewed_until:
        problems.append(f"{oid}: lease_expires_at {row['lease_expires_at']} != renewed {state.renewed_until}")
    problems.extend(_compare_control(oid, state.control, control))
    return problems


def _compare_control(oid: str, model: _Control | None, row: Row | None) -> list[str]:
    if model is None and row is None:
        return []
    if model is None or row is None:
        return [f"{oid}: control row {row is not None} but control events {model is not None}"]
    got = (row["state"], row["revision"], row["expected_fence"])
    want = (model.state, model.revision, model.expected_fence)
    return [] if got == want else [f"{oid}: control (state, revision, fence)={got}, events say {want}"]


def check_rows(dump: Dump) -> list[str]:
    """Row-local invariants of occurrences and reservations."""
    problems: list[str] = []
    for row in dump.get("occurrences", []):
        oid, status = row["occurrence_id"], row["status"]
        leased = row["lease_owner"] is not None and row["lease_expires_at"] is not None
        unleased = row["lease_owner"] is None and row["lease_expires_at"] is None
        if (status == "running" and not leased) or (status != "running" and not unleased):
            problems.append(
                f"{oid}: status {status} with lease ({row['lease_owner']}, {row['lease_expires_at']})"
            )
        if not 0 <= row["attempt"] <= row["max_attempts"]:
            problems.append(f"{oid}: attempt {row['attempt']} > max_attempts {row['max_attempts']}")
        if (status in TERMINAL) != (row["settled_at"] is not None):
            problems.append(f"{oid}: status {status} with settled_at {row['settled_at']}")
    for res in dump.get("scheduler_authority_reservations", []):
        if (res["status"] == "reserved") != (res["settled_at"] is None):
            problems.append(
                f"reservation {res['occurrence_id']}: {res['status']} settled_at {res['settled_at']}"
            )
    return problems


def check_usage(dump: Dump) -> list[str]:
    """Each usage row equals the count and unit sum of its reservations (and vice versa)."""
    sums: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0])
    for res in dump.get("scheduler_authority_reservations", []):
        key = (res["principal_type"], res["principal_id"], res["policy_revision"], res["window_started_at"])
        sums[key][0] += 1
        sums[key][1] += res["units"]
    usage = {
        (u["principal_type"], u["principal_id"], u["policy_revision"], u["window_started_at"]): [
            u["runs"],
            u["units"],
        ]
        for u in dump.get("scheduler_authority_usage", [])
    }
    return [
        f"usage {key}: {usage.get(key, [0, 0])} but reservations {sums.get(key, [0, 0])}"
        for key in sorted(set(sums) | set(usage), key=repr)
        if usage.get(key, [0, 0]) != sums.get(key, [0, 0])
    ]


def check_history(dump: Dump) -> list[str]:
    """Replays events against occurrences, controls, jobs and requeue requests."""
    by_occurrence: dict[str, list[Row]] = defaultdict(list)
    for event in dump.get("events", []):
        if event["occurrence_id"] is not None:
            by_occurrence[event["occurrence_id"]].append(event)
    controls = {c["occurrence_id"]: c for c in dump.get("scheduler_occurrence_controls", [])}
    problems: list[str] = []
    for row in dump.get("occurrences", []):
        events = sorted(by_occurrence.get(row["occurrence_id"], []), key=lambda e: e["event_id"])
        problems.extend(_replay_occurrence(row, events, controls.get(row["occurrence_id"])))
    problems.extend(_check_jobs(dump))
    problems.extend(_check_retries(dump))
    return problems


def _check_jobs(dump: Dump) -> list[str]:
    created = Counter(e["job_id"] for e in dump.get("events", []) if e["event_type"] == "job_created")
    updates: dict[str, list[int]] = defaultdict(list)
    for event in dump.get("events", []):
        if event["event_type"] == "job_updated":
            updates[event["job_id"]].append(_data(event).get("toRevision", -1))
    problems = []
    for job in dump.get("jobs", []):
        jid = job["job_id"]
        if created[jid] != 1:
            problems.append(f"job {jid}: {created[jid]} job_created events")
        revisions = updates.get(jid, [])
        if revisions != list(range(2, 2 + len(revisions))) or job["revision"] != 1 + len(revisions):
            problems.append(f"job {jid}: revision {job['revision']} but job_updated events {revisions}")
    return problems


def _check_retries(dump: Dump) -> list[str]:
    requeued: Counter[tuple[Any, Any]] = Counter()
    claimed: Counter[tuple[Any, Any]] = Counter()
    for event in dump.get("events", []):
        data = _data(event)
        if event["event_type"] == "occurrence_requeued":
            requeued[(event["occurrence_id"], data.get("requestId"))] += 1
        elif event["event_type"] in CLAIM_EVENTS and "retryRequestId" in data:
            claimed[(event["occurrence_id"], data["retryRequestId"])] += 1
    problems = []
    rows = dump.get("scheduler_occurrence_retries", [])
    for retry in rows:
        key = (retry["occurrence_id"], retry["request_id"])
        if requeued[key] != 1:
            problems.append(f"retry {key}: {requeued[key]} occurrence_requeued events")
        if claimed[key] != (0 if retry["claimed_at"] is None else 1):
            problems.append(f"retry {key}: claimed_at {retry['claimed_at']} but {claimed[key]} claims")
    if sum(requeued.values()) != len(rows):
        problems.append(f"{sum(requeued.values())} requeue events but {len(rows)} retry rows")
    return problems


def check_database(dump: Dump) -> list[str]:
    """All invariants of the module docstring."""
    return check_rows(dump) + check_usage(dump) + check_history(dump)


def assert_invariants(dump: Dump, context: str = "") -> None:
    problems = check_database(dump)
    assert not problems, f"{context}: {len(problems)} invariant violations:\n" + "\n".join(problems[:25])
