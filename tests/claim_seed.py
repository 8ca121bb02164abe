"""The claim-equivalence harness: a literal port of the seed's v6 claim SQL, and randomized states.

The seed's ``claimNext`` (expired-lease sweep, candidate SELECT, claim UPDATE and its bookkeeping)
and its targeted claim are ported statement for statement and run on a raw ``sqlite3`` connection
to a scheduler file, inside a transaction that is rolled back: the oracle the store's claims are
compared with (``tests/conformance/test_claim_equivalence.py``). The states are hypothesis-built
rows with disabled jobs, kinds, workspaces, runtime controls, requeue requests, pending
adjudications, exhausted attempts and ties on every sort key.

:class:`PgCopy` copies such a state, row for row, into a PostgreSQL schema and reads the tables
back in the snapshot's layout (event ids renumbered densely, API §8), so that a PostgreSQL store
can run the same call on the same rows. ``captured_plans`` records SQLite's query plans of the
statements a store runs (the claim paths must not sort).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from backends import PostgresServer, unique_name
from hypothesis import HealthCheck, settings
from hypothesis import event as note
from hypothesis import strategies as st
from lifecycle_support import CAPABILITY_DIGEST, CAPABILITY_JSON, DIGEST, T0
from sqlalchemy import delete, event, insert, select
from sqlalchemy.exc import IntegrityError

from scheduler import (
    SchedulerKernelError,
    SchedulerStore,
    canonical_json,
    normalize_authority_envelope,
    open_store,
)
from scheduler.schema import tables as t

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
job_strategy = st.builds(
    JobSpec,
    job_id=st.just(""),
    kind=st.sampled_from(["agenda", "routine", "nightly"]),
    enabled=st.sampled_from([True, True, True, False]),
    workspace=st.sampled_from([None, "ws-a", "ws-b"]),
)
jobs_strategy = st.lists(job_strategy, min_size=1, max_size=3)


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
        # counts attempt 1 (tests/conformance/test_cancel.py), so it is not compared with the seed here.
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


Snapshot = dict[str, list[dict[str, Any]]]


def snapshot(db: sqlite3.Connection) -> Snapshot:
    """Every compared table's rows (column name -> value) in primary-key order."""
    return {
        table: [dict(row) for row in db.execute(f"SELECT * FROM {table} ORDER BY {order}")]
        for table, order in TABLES.items()
    }


def seed_result(db: sqlite3.Connection, run: Any) -> tuple[Any, Snapshot]:
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


def outcome(run: Callable[[], Any]) -> Any:
    """A store call's result as ids, or ``("error", code)``; ``("error", "constraint")`` for a seed
    state the store refuses to write (the seed's own statements refuse it too)."""
    try:
        return ids(run())
    except SchedulerKernelError as error:
        return ("error", error.code)
    except IntegrityError:
        return ("error", "constraint")


KINDS = st.sampled_from(
    [None, None, "agenda", "routine", ["agenda"], ("routine", "agenda"), ["agenda", "nightly"], ["nightly"]]
)
FILTERS = st.tuples(KINDS, st.sampled_from([None, None, "ws-a", "ws-b"]))
EQUIVALENCE = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Bounds (window, job probe budget, walk page) small enough that these states need every path:
# the first window, the read through the eligible jobs beyond it, and the walk on in pages (one
# or several rounds) when those jobs exceed the budget.
SMALL_BOUNDS = st.sampled_from(
    [(1, 0, 1), (1, 100, 1), (2, 2, 1), (3, 100, 2), (2, 0, 3), (1, 1, 1), (2, 3, 2), (1, 0, 2)]
)


@st.composite
def backlog_state(draw: st.DrawFn) -> tuple[list[JobSpec], list[OccurrenceSpec]]:
    """A state with a backlog of one job's due rows at one ``available_at`` (the claims below may
    not take them: the job is disabled, or of a kind or workspace a filter leaves out) among the
    randomized occurrences, some of which tie with the backlog on ``available_at`` and
    ``scheduled_for``: the shape of a paused job's backlog ahead of other work."""
    backlog_job = JobSpec(
        "",
        draw(st.sampled_from(["agenda", "nightly"])),
        draw(st.sampled_from([False, False, True])),
        draw(st.sampled_from([None, "ws-b"])),
    )
    jobs = [backlog_job, *draw(st.lists(job_strategy, min_size=1, max_size=2))]
    available_at = draw(st.sampled_from(TIMES[:3]))
    statuses = draw(st.sampled_from([("queued",), ("retry_wait",), ("queued", "retry_wait")]))
    backlog = [
        OccurrenceSpec(
            occurrence_id=f"occ_m{index:03d}",
            job=0,
            status=statuses[index % len(statuses)],
            available_at=available_at,
            scheduled_for=T0 + draw(st.integers(0, 2)),
            lease_expires_at=NOW,
            max_attempts=3,
            attempt=0,
            fence=1,
            control=None,
            control_fence_offset=0,
            retry=None,
            retry_fence_offset=0,
            adjudication=False,
            reservation=False,
        )
        for index in range(draw(st.integers(3, 30)))
    ]
    work = [
        replace(
            backlog[0],
            occurrence_id=f"occ_w{index:03d}",
            job=1 + index % (len(jobs) - 1),
            status=draw(st.sampled_from(["queued", "retry_wait"])),
            available_at=draw(st.sampled_from([time for time in TIMES if available_at <= time <= NOW])),
            scheduled_for=T0 + draw(st.integers(0, 2)),
        )
        for index in range(draw(st.integers(0, 6)))
    ]
    others = draw(
        st.lists(occurrence_strategy(), min_size=1, max_size=6, unique_by=lambda spec: spec.occurrence_id)
    )
    return jobs, backlog + work + others


def classify(outcome: Any, snapshot_rows: Snapshot) -> None:
    """Hypothesis statistics: what the examples exercised."""
    note("error" if isinstance(outcome, tuple) else "claimed" if outcome else "nothing claimed")
    types = {row["event_type"] for row in snapshot_rows["events"]}
    for kind in ("occurrence_dead_lettered", "occurrence_reclaimed"):
        if kind in types:
            note(kind)
    if any(
        '"retryRequestId"' in row["data_json"]
        or "Rebound" in row["data_json"]
        or "resumed" in row["data_json"]
        for row in snapshot_rows["events"]
    ):
        note("control or requeue bookkeeping")


def ids(result: Any) -> Any:
    if isinstance(result, list):
        return [occurrence.id for occurrence in result]
    return getattr(result, "id", result)


# ------------------------------------------------------------------ the same rows on PostgreSQL

COPIED = (
    t.jobs,
    t.occurrences,
    t.occurrence_controls,
    t.occurrence_retries,
    t.adjudications,
    t.authority_reservations,
)
COMPARED = (*COPIED, t.events)  # parents first


def renumbered(tables: Snapshot) -> Snapshot:
    """Event ids renumbered densely in order (PostgreSQL's may have gaps, API §8)."""
    events = [{**row, "event_id": index} for index, row in enumerate(tables["events"], 1)]
    return {**tables, "events": events}


def comparable(tables: Snapshot) -> Snapshot:
    """A snapshot as PostgreSQL can equal it: no ``sqlite_sequence``, event ids renumbered."""
    return renumbered({name: rows for name, rows in tables.items() if name != "sqlite_sequence"})


class PgCopy:
    """A PostgreSQL schema that takes a copy of a SQLite state's rows and is read back as a snapshot."""

    def __init__(self, server: PostgresServer, schema: str) -> None:
        self.server, self.schema = server, schema
        self.options = {"schema_translate_map": {None: schema}}

    def load(self, db: sqlite3.Connection) -> None:
        """Replace the schema's rows by the SQLite file's."""
        with self.server.engine.begin() as connection:
            for table in reversed(COMPARED):  # children first
                connection.execute(delete(table), execution_options=self.options)
            for table in COPIED:
                rows = [dict(row) for row in db.execute(f"SELECT * FROM {table.name}")]
                if rows:
                    connection.execute(insert(table), rows, execution_options=self.options)

    def tables(self) -> Snapshot:
        with self.server.engine.connect() as connection:
            return renumbered(
                {
                    table.name: [
                        dict(row)
                        for row in connection.execute(
                            select(table).order_by(*table.primary_key), execution_options=self.options
                        ).mappings()
                    ]
                    for table in COMPARED
                }
            )


def sqlite_tables(db: sqlite3.Connection) -> Snapshot:
    """The SQLite file's compared tables in :meth:`PgCopy.tables`' layout."""
    return renumbered(
        {
            table.name: [
                dict(row)
                for row in db.execute(
                    f"SELECT * FROM {table.name} ORDER BY {', '.join(c.name for c in table.primary_key)}"
                )
            ]
            for table in COMPARED
        }
    )


class Pair:
    """A SQLite store and a PostgreSQL store that start every example from the same rows."""

    def __init__(
        self,
        sqlite_store: SchedulerStore,
        db: sqlite3.Connection,
        pg: SchedulerStore,
        server: PostgresServer,
        schema: str,
    ) -> None:
        self.sqlite_store, self.db, self.pg, self.server, self.schema = sqlite_store, db, pg, server, schema
        self.copy = PgCopy(server, schema)

    def build(self, state: Any) -> list[str]:
        made = build_state(self.db, *state)
        self.copy.load(self.db)
        return made

    def sqlite_tables(self) -> Snapshot:
        return sqlite_tables(self.db)

    def pg_tables(self) -> Snapshot:
        return self.copy.tables()

    def both(self, call: Callable[[SchedulerStore], Any]) -> None:
        """``call(store)`` on each store; the outcomes and the tables afterwards must be equal."""
        expected = outcome(lambda: call(self.sqlite_store)), self.sqlite_tables()
        actual = outcome(lambda: call(self.pg)), self.pg_tables()
        assert actual == expected


def paired_stores(tmp_path_factory: Any, postgres_server: PostgresServer) -> Iterator[Pair]:
    """A :class:`Pair` on a fresh SQLite file and a fresh schema, closed and dropped after."""
    path = tmp_path_factory.mktemp("pg_equivalence") / "claims.sqlite"
    schema = unique_name("t_claims_eq")
    sqlite_store = open_store(path, clock=lambda: NOW)
    pg = open_store(postgres_server.engine, schema=schema, clock=lambda: NOW)
    db = raw(path)
    try:
        yield Pair(sqlite_store, db, pg, postgres_server, schema)
    finally:
        db.close()
        sqlite_store.close()
        pg.close()
        postgres_server.drop_schema(schema)


def as_among_workers(store: SchedulerStore) -> None:
    """Keep ``store``'s single claims on the path they take once other workers held their first
    candidates (the window of heads, ``ClaimContention``), whatever its own claims meet."""
    store._claims.stay_among_workers()


@contextmanager
def among_workers(store: SchedulerStore) -> Iterator[None]:
    """``store``'s single claims on the path among workers for the block, then quiet again."""
    quiet = store._claims.quiet
    as_among_workers(store)
    try:
        yield
    finally:
        store._claims.quiet = quiet


# ------------------------------------------------------------------ SQLite's query plans


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
