"""The index-served claim selection chooses exactly what the seed's v6 claimNext chooses.

A literal port of the seed's SQL (sweep, candidate SELECT, claim UPDATE and its bookkeeping) runs
in a transaction that is rolled back; then the store runs the same call. Both resulting database
states must be identical, on hypothesis-randomized states with disabled jobs, kinds, workspaces,
runtime controls, requeue requests, pending adjudications, exhausted attempts and ties on every
sort key. A second test checks with EXPLAIN QUERY PLAN that no claim-path query sorts.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as note
from hypothesis import strategies as st
from lifecycle_support import CAPABILITY_DIGEST, CAPABILITY_JSON, DIGEST, T0
from sqlalchemy import event

from scheduler import SchedulerStore, canonical_json, normalize_authority_envelope, open_store
from scheduler.store.capabilities import claim_query

NOW = T0 + 100_000
LEASE = 30_000
OWNER = "w-new"
TABLES = {
    "jobs": "job_id",
    "occurrences": "occurrence_id",
    "events": "event_id",
    "scheduler_occurrence_controls": "occurrence_id",
    "scheduler_occurrence_retries": "occurrence_id, request_id",
    "scheduler_occurrence_adjudications": "occurrence_id",
    "scheduler_authority_reservations": "occurrence_id",
    "sqlite_sequence": "name",
}

# ------------------------------------------------------------------ literal port of the seed (v6)

SEED_SWEEP_SELECT = """
        SELECT occurrence_id, job_id, lease_owner, fence, attempt, max_attempts
        FROM occurrences
        WHERE status = 'running'
          AND lease_expires_at <= ?
          AND attempt >= max_attempts
          AND NOT EXISTS (
            SELECT 1 FROM scheduler_occurrence_controls c
            WHERE c.occurrence_id = occurrences.occurrence_id
              AND c.state IN ('pause_requested', 'resumed')
          )
        ORDER BY lease_expires_at, occurrence_id
        LIMIT 100
"""
SEED_SWEEP_UPDATE = """
      UPDATE occurrences
      SET status = 'dead_letter',
          lease_owner = NULL,
          lease_expires_at = NULL,
          last_error_json = @errorJson,
          updated_at = @now,
          settled_at = @now
      WHERE occurrence_id = @occurrenceId
        AND status = 'running'
        AND lease_owner = @ownerId
        AND fence = @fence
        AND lease_expires_at <= @now
        AND attempt >= max_attempts
        AND NOT EXISTS (
          SELECT 1 FROM scheduler_occurrence_controls c
          WHERE c.occurrence_id = occurrences.occurrence_id
            AND c.state IN ('pause_requested', 'resumed')
        )
"""
SEED_CANDIDATE = """
          SELECT o.*, c.state AS control_state,
                 c.expected_fence AS control_expected_fence,
                 r.request_id AS retry_request_id
          FROM occurrences o
          JOIN jobs j ON j.job_id = o.job_id
          LEFT JOIN scheduler_occurrence_controls c
            ON c.occurrence_id = o.occurrence_id
          LEFT JOIN scheduler_occurrence_retries r
            ON r.occurrence_id = o.occurrence_id
           AND r.claimed_at IS NULL
           AND r.expected_fence = o.fence
          WHERE j.enabled = 1
            AND (@jobKinds IS NULL OR j.kind IN (SELECT value FROM json_each(@jobKinds)))
            AND (
              @workspaceId IS NULL
              OR json_extract(j.authority_json, '$.workspaceId') = @workspaceId
            )
            AND (
              o.attempt < o.max_attempts
              OR c.state IN ('pause_requested', 'resumed')
              OR r.request_id IS NOT NULL
            )
            AND (c.state IS NULL OR c.state <> 'paused')
            AND (
              c.state IS NULL OR c.state <> 'pause_requested'
              OR o.status = 'running'
            )
            AND (
              (o.status IN ('queued', 'retry_wait') AND o.available_at <= @now)
              OR
              (o.status = 'running' AND o.lease_expires_at <= @now)
            )
          ORDER BY
            CASE WHEN o.status = 'running' THEN o.lease_expires_at ELSE o.available_at END,
            o.scheduled_for,
            o.occurrence_id
          LIMIT 1
"""
SEED_CLAIM_UPDATE = """
          UPDATE occurrences
          SET status = 'running',
              attempt = attempt + CASE
                WHEN EXISTS (
                  SELECT 1 FROM scheduler_occurrence_controls c
                  WHERE c.occurrence_id = occurrences.occurrence_id
                    AND c.state = 'pause_requested'
                ) THEN 0
                WHEN EXISTS (
                  SELECT 1 FROM scheduler_occurrence_controls c
                  WHERE c.occurrence_id = occurrences.occurrence_id
                    AND c.state = 'resumed'
                    AND c.expected_fence = occurrences.fence
                ) THEN 0
                WHEN EXISTS (
                  SELECT 1 FROM scheduler_occurrence_retries r
                  WHERE r.occurrence_id = occurrences.occurrence_id
                    AND r.claimed_at IS NULL
                    AND r.expected_fence = occurrences.fence
                ) THEN 0
                ELSE 1 END,
              fence = fence + 1,
              lease_owner = @ownerId,
              lease_expires_at = @leaseExpiresAt,
              updated_at = @now,
              settled_at = NULL
          WHERE occurrence_id = @occurrenceId
            AND fence = @expectedFence
            AND (
              attempt < max_attempts
              OR EXISTS (
                SELECT 1 FROM scheduler_occurrence_controls c
                WHERE c.occurrence_id = occurrences.occurrence_id
                  AND c.state IN ('pause_requested', 'resumed')
              )
              OR EXISTS (
                SELECT 1 FROM scheduler_occurrence_retries r
                WHERE r.occurrence_id = occurrences.occurrence_id
                  AND r.claimed_at IS NULL
                  AND r.expected_fence = occurrences.fence
              )
            )
            AND NOT EXISTS (
              SELECT 1 FROM scheduler_occurrence_controls c
              WHERE c.occurrence_id = occurrences.occurrence_id
                AND c.state = 'paused'
            )
            AND (
              (status IN ('queued', 'retry_wait') AND available_at <= @now)
              OR
              (status = 'running' AND lease_expires_at <= @now)
            )
"""
SEED_REBIND = """UPDATE scheduler_occurrence_controls
             SET expected_fence = ?, revision = revision + 1, updated_at = ?
             WHERE occurrence_id = ? AND state = '{state}'
               AND expected_fence = ?"""
LEASE_EXPIRED = {
    "code": "lease_expired",
    "message": "Execution lease expired after the final allowed attempt",
}


class SeedError(Exception):
    """A SchedulerKernelError of the ported seed code."""


def append_event(
    db: sqlite3.Connection,
    job_id: str,
    occurrence_id: str,
    kind: str,
    owner: Any,
    fence: Any,
    data: dict[str, Any],
) -> None:
    db.execute(
        "INSERT INTO events (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (job_id, occurrence_id, kind, NOW, owner, fence, canonical_json(data)),
    )


def seed_sweep(db: sqlite3.Connection) -> None:
    """``_deadLetterExpiredLeases(now)`` of the seed."""
    for row in db.execute(SEED_SWEEP_SELECT, (NOW,)).fetchall():
        occurrence_id, job_id, owner, fence, attempt, max_attempts = row
        changes = db.execute(
            SEED_SWEEP_UPDATE,
            {
                "occurrenceId": occurrence_id,
                "ownerId": owner,
                "fence": fence,
                "errorJson": canonical_json(LEASE_EXPIRED),
                "now": NOW,
            },
        ).rowcount
        if changes != 1:
            continue
        adjudication = db.execute(
            "SELECT request_id FROM scheduler_occurrence_adjudications "
            "WHERE occurrence_id = ? AND status = 'pending'",
            (occurrence_id,),
        ).fetchone()
        data: dict[str, Any] = {"attempt": attempt, "maxAttempts": max_attempts, "reason": "lease_expired"}
        if adjudication:
            outcome = canonical_json({"status": "dead_letter", "error": LEASE_EXPIRED})
            db.execute(
                "UPDATE scheduler_occurrence_adjudications SET status = 'applied', applied_at = ?, "
                "retry_settled_at = ?, retry_outcome_json = ? WHERE occurrence_id = ? AND status = 'pending'",
                (NOW, NOW, outcome, occurrence_id),
            )
            db.execute(
                "UPDATE scheduler_authority_reservations SET status = 'failed', outcome_json = ?, "
                "settled_at = ? WHERE occurrence_id = ? AND status = 'reserved'",
                (outcome, NOW, occurrence_id),
            )
            data["adjudicationRequestId"] = adjudication[0]
        append_event(db, job_id, occurrence_id, "occurrence_dead_lettered", owner, fence, data)


def seed_claim(
    db: sqlite3.Connection, candidate: sqlite3.Row, targeted: bool, control: Any, retry: Any
) -> str:
    """The seed's claim UPDATE and bookkeeping for a chosen candidate."""
    occurrence_id = candidate["occurrence_id"]
    changes = db.execute(
        SEED_CLAIM_UPDATE,
        {
            "occurrenceId": occurrence_id,
            "expectedFence": candidate["fence"],
            "ownerId": OWNER,
            "leaseExpiresAt": NOW + LEASE,
            "now": NOW,
        },
    ).rowcount
    if changes != 1:
        raise SeedError("SCHEDULER_CLAIM_CONFLICT")
    claimed = db.execute("SELECT * FROM occurrences WHERE occurrence_id = ?", (occurrence_id,)).fetchone()
    state = control["state"] if control is not None else None
    if state in ("pause_requested", "resumed"):
        rebound = db.execute(
            SEED_REBIND.format(state=state), (claimed["fence"], NOW, occurrence_id, control["expected_fence"])
        ).rowcount
        if state == "resumed" and rebound != 1:
            raise SeedError("SCHEDULER_OCCURRENCE_CONTROL_CONFLICT")
    if retry is not None:
        db.execute(
            "UPDATE scheduler_occurrence_retries SET claimed_at = ? "
            "WHERE occurrence_id = ? AND request_id = ? AND claimed_at IS NULL",
            (NOW, occurrence_id, retry),
        )
    data: dict[str, Any] = {
        "attempt": claimed["attempt"],
        "previousOwner": candidate["lease_owner"],
        "previousStatus": candidate["status"],
    }
    if targeted:
        data["targeted"] = True
    if state == "pause_requested":
        data["pauseRequestRebound"] = True
    if state == "resumed":
        data["resumedWithoutAttempt"] = True
    if retry is not None:
        data["retryRequestId"] = retry
    kind = "occurrence_reclaimed" if candidate["status"] == "running" else "occurrence_claimed"
    append_event(db, candidate["job_id"], occurrence_id, kind, OWNER, claimed["fence"], data)
    return str(occurrence_id)


def seed_kinds(job_kind: Any) -> str | None:
    """The seed's ``j.kind = @jobKind`` generalized to "any of these kinds" (a JSON array or NULL)."""
    if job_kind is None:
        return None
    return canonical_json([job_kind] if isinstance(job_kind, str) else list(job_kind))


def seed_claim_next(db: sqlite3.Connection, job_kind: Any, workspace_id: str | None) -> str | None:
    seed_sweep(db)
    candidate = db.execute(
        SEED_CANDIDATE, {"now": NOW, "jobKinds": seed_kinds(job_kind), "workspaceId": workspace_id}
    ).fetchone()
    if candidate is None:
        return None
    control = {"state": candidate["control_state"], "expected_fence": candidate["control_expected_fence"]}
    return seed_claim(
        db, candidate, False, control if control["state"] else None, candidate["retry_request_id"]
    )


def seed_claim_batch(
    db: sqlite3.Connection, limit: int, job_kind: Any, workspace_id: str | None
) -> list[str]:
    """``limit`` successive seed ``claimNext`` calls (what ``claim_batch`` must equal)."""
    claimed = []
    for _ in range(limit):
        occurrence_id = seed_claim_next(db, job_kind, workspace_id)
        if occurrence_id is None:
            break
        claimed.append(occurrence_id)
    return claimed


def seed_claim_occurrence(db: sqlite3.Connection, occurrence_id: str) -> str | None:
    seed_sweep(db)
    candidate = db.execute("SELECT * FROM occurrences WHERE occurrence_id = ?", (occurrence_id,)).fetchone()
    if candidate is None:
        raise SeedError("SCHEDULER_NOT_FOUND")
    job = db.execute("SELECT * FROM jobs WHERE job_id = ?", (candidate["job_id"],)).fetchone()
    control = db.execute(
        "SELECT * FROM scheduler_occurrence_controls WHERE occurrence_id = ?", (occurrence_id,)
    ).fetchone()
    retry = db.execute(
        "SELECT * FROM scheduler_occurrence_retries WHERE occurrence_id = ? AND claimed_at IS NULL "
        "AND expected_fence = ? ORDER BY created_at, request_id LIMIT 1",
        (occurrence_id, candidate["fence"]),
    ).fetchone()
    state = control["state"] if control is not None else None
    status = candidate["status"]
    eligible = (
        job is not None
        and job["enabled"] == 1
        and (
            candidate["attempt"] < candidate["max_attempts"]
            or state in ("pause_requested", "resumed")
            or retry is not None
        )
        and state != "paused"
        and not (state == "pause_requested" and status != "running")
        and (
            (status in ("queued", "retry_wait") and candidate["available_at"] <= NOW)
            or (status == "running" and candidate["lease_expires_at"] <= NOW)
        )
    )
    if not eligible:
        return None
    return seed_claim(db, candidate, True, control, retry["request_id"] if retry is not None else None)


# ------------------------------------------------------------------ randomized states


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    kind: str
    enabled: bool
    workspace: str | None


@dataclass(frozen=True)
class OccurrenceSpec:
    occurrence_id: str
    job: int
    status: str
    available_at: int
    scheduled_for: int
    lease_expires_at: int
    max_attempts: int
    attempt: int
    fence: int
    control: str | None
    control_fence_offset: int
    retry: str | None
    retry_fence_offset: int
    adjudication: bool
    reservation: bool


TIMES = [NOW - 2000, NOW - 1000, NOW, NOW + 1000]
jobs_strategy = st.lists(
    st.builds(
        JobSpec,
        job_id=st.just(""),
        kind=st.sampled_from(["agenda", "routine", "nightly"]),
        enabled=st.sampled_from([True, True, True, False]),
        workspace=st.sampled_from([None, "ws-a", "ws-b"]),
    ),
    min_size=1,
    max_size=3,
)


@st.composite
def occurrence_strategy(draw: st.DrawFn) -> OccurrenceSpec:
    max_attempts = draw(st.integers(1, 3))
    attempt = draw(st.integers(0, max_attempts))
    return OccurrenceSpec(
        occurrence_id="occ_" + draw(st.text("abcdef", min_size=1, max_size=3)),
        job=draw(st.integers(0, 2)),
        status=draw(
            st.sampled_from(["queued", "retry_wait", "running", "running", "succeeded", "dead_letter"])
        ),
        available_at=draw(st.sampled_from(TIMES)),
        scheduled_for=draw(st.sampled_from([T0, T0 + 1, T0 + 2])),
        lease_expires_at=draw(st.sampled_from(TIMES)),
        max_attempts=max_attempts,
        attempt=attempt,
        fence=draw(st.integers(max(attempt, 1), 4)),
        control=draw(st.sampled_from([None, None, "pause_requested", "paused", "resumed", "terminal"])),
        control_fence_offset=draw(st.sampled_from([0, 0, 1])),
        # The seed writes a requeue request only for a dead letter that ran (attempt >= 1); one at
        # attempt 0 exists only after a cancellation (API §12, beyond the seed), whose first claim
        # counts attempt 1 (tests/test_cancel.py), so it is not compared with the seed here.
        retry=draw(st.sampled_from([None, None, "unclaimed", "claimed"])) if attempt > 0 else None,
        retry_fence_offset=draw(st.sampled_from([0, 0, 1])),
        adjudication=draw(st.booleans()),
        reservation=draw(st.booleans()),
    )


states_strategy = st.tuples(
    jobs_strategy,
    st.lists(occurrence_strategy(), min_size=1, max_size=12, unique_by=lambda spec: spec.occurrence_id),
)


def raw(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None)
    connection.row_factory = sqlite3.Row
    return connection


def build_state(db: sqlite3.Connection, jobs: list[JobSpec], occurrences: list[OccurrenceSpec]) -> list[str]:
    db.execute("BEGIN IMMEDIATE")
    for table in (
        "events",
        "scheduler_occurrence_retries",
        "scheduler_occurrence_controls",
        "scheduler_occurrence_adjudications",
        "scheduler_authority_reservations",
        "occurrences",
        "jobs",
    ):
        db.execute(f"DELETE FROM {table}")
    db.execute("DELETE FROM sqlite_sequence")
    job_ids = []
    for index, job in enumerate(jobs):
        job_id = f"job-{index}"
        job_ids.append(job_id)
        envelope = {"principal": {"type": "user", "id": f"u{index}"}}
        if job.workspace:
            envelope["workspaceId"] = job.workspace
        authority = canonical_json(normalize_authority_envelope(envelope))
        db.execute(
            "INSERT INTO jobs VALUES (?, ?, '{}', '{}', ?, ?, 1, 3, ?, ?)",
            (job_id, job.kind, authority, int(job.enabled), T0, T0),
        )
    for spec in occurrences:
        job_id = job_ids[spec.job % len(job_ids)]
        running = spec.status == "running"
        settled = spec.status in ("succeeded", "dead_letter")
        db.execute(
            "INSERT INTO occurrences VALUES (?, ?, 1, ?, 'trigger', ?, ?, ?, ?, ?, ?, ?, ?, "
            "(SELECT authority_json FROM jobs WHERE job_id = ?), '{}', NULL, NULL, ?, ?, ?)",
            (
                spec.occurrence_id,
                job_id,
                "key:" + spec.occurrence_id,
                spec.scheduled_for,
                spec.available_at,
                spec.status,
                spec.attempt,
                spec.max_attempts,
                spec.fence,
                "w-old" if running else None,
                spec.lease_expires_at if running else None,
                job_id,
                T0,
                T0,
                T0 if settled else None,
            ),
        )
        if spec.control:
            paused = spec.control in ("paused", "resumed")
            db.execute(
                "INSERT INTO scheduler_occurrence_controls "
                "VALUES (?, ?, ?, ?, 1, ?, ?, ?, NULL, ?, ?, ?, ?, ?)",
                (
                    spec.occurrence_id,
                    CAPABILITY_JSON,
                    CAPABILITY_DIGEST,
                    spec.control,
                    "p-" + spec.occurrence_id,
                    "r-" + spec.occurrence_id if spec.control == "resumed" else None,
                    spec.fence + spec.control_fence_offset,
                    T0,
                    T0 if paused else None,
                    T0 if spec.control == "resumed" else None,
                    T0 if spec.control == "terminal" else None,
                    T0,
                ),
            )
        if spec.retry:
            db.execute(
                "INSERT INTO scheduler_occurrence_retries VALUES (?, ?, ?, 'E', ?, ?)",
                (
                    spec.occurrence_id,
                    "rq-" + spec.occurrence_id,
                    spec.fence + spec.retry_fence_offset,
                    T0,
                    T0 if spec.retry == "claimed" else None,
                ),
            )
        if spec.adjudication:
            db.execute(
                "INSERT INTO scheduler_occurrence_adjudications VALUES (?, ?, ?, 'confirmed_not_applied', "
                "'local-operator', ?, 1, 1, ?, ?, 'pending', ?, NULL, NULL, NULL)",
                (spec.occurrence_id, job_id, "adj-" + spec.occurrence_id, DIGEST, DIGEST, DIGEST, T0),
            )
        if spec.reservation:
            db.execute(
                "INSERT INTO scheduler_authority_reservations "
                "VALUES (?, ?, 'user', 'u', 1, ?, 1, 'reserved', NULL, ?, NULL)",
                (spec.occurrence_id, job_id, T0, T0),
            )
    db.execute("COMMIT")
    return [spec.occurrence_id for spec in occurrences]


def snapshot(db: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {
        table: [tuple(row) for row in db.execute(f"SELECT * FROM {table} ORDER BY {order}")]
        for table, order in TABLES.items()
    }


def seed_result(db: sqlite3.Connection, run: Any) -> tuple[Any, dict[str, list[tuple[Any, ...]]]]:
    """Run the seed port in one write transaction; a failure rolls it back, as the seed's _write does."""
    db.execute("BEGIN IMMEDIATE")
    try:
        outcome: Any = run(db)
    except SeedError as error:
        db.execute("ROLLBACK")
        return ("error", str(error)), snapshot(db)
    except sqlite3.IntegrityError:
        db.execute("ROLLBACK")
        return ("error", "constraint"), snapshot(db)
    try:
        return outcome, snapshot(db)
    finally:
        db.execute("ROLLBACK")


def store_result(db: sqlite3.Connection, run: Any) -> tuple[Any, dict[str, list[tuple[Any, ...]]]]:
    from sqlalchemy.exc import IntegrityError

    from scheduler import SchedulerKernelError

    try:
        outcome = run()
    except SchedulerKernelError as error:
        outcome = ("error", error.code)
    except IntegrityError:
        outcome = ("error", "constraint")
    return outcome, snapshot(db)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SchedulerStore, sqlite3.Connection]]:
    path = tmp_path_factory.mktemp("equivalence") / "claims.sqlite"
    store = open_store(path, clock=lambda: NOW)
    db = raw(path)
    try:
        yield store, db
    finally:
        db.close()
        store.close()


KINDS = st.sampled_from(
    [None, None, "agenda", "routine", ["agenda"], ("routine", "agenda"), ["agenda", "nightly"], ["nightly"]]
)
FILTERS = st.tuples(KINDS, st.sampled_from([None, None, "ws-a", "ws-b"]))
EQUIVALENCE = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def classify(outcome: Any, snapshot_rows: dict[str, list[tuple[Any, ...]]]) -> None:
    """Hypothesis statistics: what the examples exercised."""
    note("error" if isinstance(outcome, tuple) else "claimed" if outcome else "nothing claimed")
    types = {row[3] for row in snapshot_rows["events"]}
    for kind in ("occurrence_dead_lettered", "occurrence_reclaimed"):
        if kind in types:
            note(kind)
    if any(
        '"retryRequestId"' in row[7] or "Rebound" in row[7] or "resumed" in row[7]
        for row in snapshot_rows["events"]
    ):
        note("control or requeue bookkeeping")


def ids(result: Any) -> Any:
    if isinstance(result, list):
        return [occurrence.id for occurrence in result]
    return getattr(result, "id", result)


@EQUIVALENCE
@given(state=states_strategy, filters=FILTERS)
def test_claim_next_matches_the_seed(harness: Any, state: Any, filters: tuple[Any, str | None]) -> None:
    store, db = harness
    build_state(db, *state)
    job_kind, workspace_id = filters
    expected = seed_result(db, lambda c: seed_claim_next(c, job_kind, workspace_id))
    actual = store_result(
        db,
        lambda: ids(
            store.claim_next(owner_id=OWNER, lease_ms=LEASE, job_kind=job_kind, workspace_id=workspace_id)
        ),
    )
    classify(*expected)
    assert actual == expected


@EQUIVALENCE
@given(state=states_strategy, filters=FILTERS, limit=st.integers(1, 6))
def test_claim_batch_matches_successive_seed_claims(
    harness: Any, state: Any, filters: tuple[Any, str | None], limit: int
) -> None:
    store, db = harness
    build_state(db, *state)
    job_kind, workspace_id = filters

    expected = seed_result(db, lambda c: seed_claim_batch(c, limit, job_kind, workspace_id))
    actual = store_result(
        db,
        lambda: ids(
            store.claim_batch(
                owner_id=OWNER, lease_ms=LEASE, limit=limit, job_kind=job_kind, workspace_id=workspace_id
            )
        ),
    )
    classify(expected[0] if expected[0] != [] else None, expected[1])
    assert actual == expected


# Bounds small enough that these states need every path: the first window, the probe through
# the eligible jobs beyond it, and the continued walk when those jobs exceed the budget.
SMALL_BOUNDS = st.sampled_from([(1, 0), (1, 100), (2, 2), (3, 100), (2, 0)])


@EQUIVALENCE
@given(state=states_strategy, filters=FILTERS, limit=st.integers(1, 6), bounds=SMALL_BOUNDS)
def test_claims_beyond_small_windows_match_successive_seed_claims(
    harness: Any, state: Any, filters: tuple[Any, str | None], limit: int, bounds: tuple[int, int]
) -> None:
    store, db = harness
    build_state(db, *state)
    job_kind, workspace_id = filters
    window, budget = bounds

    expected = seed_result(db, lambda c: seed_claim_batch(c, limit, job_kind, workspace_id))
    with patch.object(claim_query, "WINDOW", window), patch.object(claim_query, "JOB_PROBE_BUDGET", budget):
        actual = store_result(
            db,
            lambda: ids(
                store.claim_batch(
                    owner_id=OWNER, lease_ms=LEASE, limit=limit, job_kind=job_kind, workspace_id=workspace_id
                )
            ),
        )
    note(f"window {window}, budget {budget}")
    assert actual == expected


@EQUIVALENCE
@given(state=states_strategy, pick=st.integers(0, 20))
def test_claim_occurrence_matches_the_seed(harness: Any, state: Any, pick: int) -> None:
    store, db = harness
    made = build_state(db, *state)
    target = made[pick % len(made)] if made and pick < 18 else "occ_missing"
    expected = seed_result(db, lambda c: seed_claim_occurrence(c, target))
    actual = store_result(
        db, lambda: ids(store.claim_occurrence(occurrence_id=target, owner_id=OWNER, lease_ms=LEASE))
    )
    classify(*expected)
    assert actual == expected


def test_equivalence_harness_sees_interesting_states(harness: Any) -> None:
    """A fixed state exercising the sweep, a reclaim, a control, a requeue and filters."""
    store, db = harness
    jobs = [JobSpec("", "agenda", True, "ws-a"), JobSpec("", "routine", True, None)]
    spec = dict(
        scheduled_for=T0,
        control=None,
        control_fence_offset=0,
        retry=None,
        retry_fence_offset=0,
        adjudication=False,
        reservation=False,
        max_attempts=2,
        attempt=1,
        fence=1,
        job=0,
    )
    occurrences = [
        OccurrenceSpec(
            occurrence_id="occ_sweep",
            status="running",
            available_at=NOW,
            lease_expires_at=NOW - 2000,
            **{**spec, "attempt": 2, "fence": 2, "adjudication": True, "reservation": True},
        ),
        OccurrenceSpec(
            occurrence_id="occ_reclaim",
            status="running",
            available_at=NOW,
            lease_expires_at=NOW - 1000,
            **spec,
        ),
        OccurrenceSpec(
            occurrence_id="occ_requeued",
            status="retry_wait",
            available_at=NOW - 2000,
            lease_expires_at=NOW,
            **{**spec, "attempt": 2, "retry": "unclaimed", "job": 1},
        ),
        OccurrenceSpec(
            occurrence_id="occ_paused",
            status="retry_wait",
            available_at=NOW - 2000,
            lease_expires_at=NOW,
            **{**spec, "control": "paused"},
        ),
    ]
    build_state(db, jobs, occurrences)
    expected = seed_result(db, lambda c: [seed_claim_next(c, None, None) for _ in range(4)])
    assert expected[0] == ["occ_requeued", "occ_reclaim", None, None]
    actual = store_result(db, lambda: ids(store.claim_batch(owner_id=OWNER, lease_ms=LEASE, limit=4)))
    assert actual == (expected[0][:2], expected[1])


# ------------------------------------------------------------------ no claim-path query sorts


def captured_plans(store: SchedulerStore, calls: list[Any]) -> list[tuple[str, list[str]]]:
    statements: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        statements.append((statement, parameters[0] if many else parameters))

    event.listen(store.connection, "before_cursor_execute", record)
    try:
        for call in calls:
            call()
    finally:
        event.remove(store.connection, "before_cursor_execute", record)
    dbapi: Any = store.connection.connection.dbapi_connection
    plans = []
    for statement, parameters in statements:
        if statement.lstrip().upper().startswith(("SELECT", "UPDATE", "INSERT")):
            rows = dbapi.execute("EXPLAIN QUERY PLAN " + statement, parameters).fetchall()
            plans.append((statement, [row[3] for row in rows]))
    return plans


def test_no_claim_path_query_uses_a_temporary_b_tree(tmp_path: Path) -> None:
    path = tmp_path / "plans.sqlite"
    store = open_store(path, clock=lambda: NOW)
    db = raw(path)
    try:
        jobs = [JobSpec("", "agenda", True, "ws-a"), JobSpec("", "routine", True, None)]
        occurrences = [
            OccurrenceSpec(
                occurrence_id=f"occ_{i:03d}",
                job=i % 2,
                status=status,
                available_at=TIMES[i % 4],
                scheduled_for=T0 + i % 3,
                lease_expires_at=TIMES[(i + 1) % 4],
                max_attempts=2,
                attempt=1,
                fence=1,
                control=control,
                control_fence_offset=0,
                retry=retry,
                retry_fence_offset=0,
                adjudication=i % 5 == 0,
                reservation=i % 3 == 0,
            )
            for i, (status, control, retry) in enumerate(
                (s, c, r)
                for s in ("queued", "retry_wait", "running")
                for c in (None, "pause_requested", "resumed")
                for r in (None, "unclaimed")
            )
        ]
        build_state(db, jobs, occurrences)
        db.execute("ANALYZE")
        calls = [
            lambda: store.claim_next(owner_id="w", lease_ms=LEASE),
            lambda: store.claim_next(owner_id="w", lease_ms=LEASE, job_kind="agenda"),
            lambda: store.claim_next(owner_id="w", lease_ms=LEASE, workspace_id="ws-a"),
            lambda: store.claim_next(owner_id="w", lease_ms=LEASE, job_kind="routine", workspace_id="ws-a"),
            lambda: store.claim_batch(owner_id="w", lease_ms=LEASE, limit=50),
            lambda: store.claim_occurrence(occurrence_id="occ_000", owner_id="w", lease_ms=LEASE),
        ]
        plans = captured_plans(store, calls)
        claimed = store.claim_occurrence(
            occurrence_id="occ_001", owner_id="w2", lease_ms=LEASE
        ) or store.claim_next(owner_id="w3", lease_ms=LEASE)
        if claimed is not None:
            plans += captured_plans(
                store,
                [
                    lambda: store.renew(
                        occurrence_id=claimed.id,
                        owner_id=claimed.lease_owner,
                        fence=claimed.fence,
                        lease_ms=LEASE,
                    ),
                    lambda: store.settle(
                        occurrence_id=claimed.id,
                        owner_id=claimed.lease_owner,
                        fence=claimed.fence,
                        outcome="failed",
                    ),
                ],
            )
        assert plans
        for statement, plan in plans:
            assert not any("TEMP B-TREE" in step for step in plan), (statement, plan)
        due_arms = [step for _, plan in plans for step in plan if "scheduler_occurrences_claim" in step]
        assert any("(status=? AND available_at<?)" in step for step in due_arms)
        assert not any(
            step.startswith("SCAN o") or step.startswith("SCAN occurrences") for _, p in plans for step in p
        )
    finally:
        db.close()
        store.close()
