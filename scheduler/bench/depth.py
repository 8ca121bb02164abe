"""Building a queue of a given depth by bulk insert (one transaction, raw ``sqlite3``).

Every row is exactly what ``enqueue_occurrence`` would write for the bench job: the identity
comes from :func:`derive_occurrence_identity`, the authority and payload from the job's
canonical JSON, and each occurrence gets its ``occurrence_enqueued`` event.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from scheduler.bench.context import BENCH_JOB_ID
from scheduler.bench.stores import PAST_MS, wall_ms
from scheduler.contract.canonical import canonical_json
from scheduler.contract.identity import derive_occurrence_identity

CHUNK: Final = 10_000
BUILD_CACHE_KIB: Final = 32_768
_OCCURRENCE_COLUMNS: Final = (
    "occurrence_id, job_id, job_revision, idempotency_key, trigger_key, scheduled_for, available_at, "
    "status, attempt, max_attempts, fence, lease_owner, lease_expires_at, authority_json, payload_json, "
    "last_error_json, result_json, created_at, updated_at, settled_at"
)
INSERT_OCCURRENCE: Final = (
    f"INSERT INTO occurrences ({_OCCURRENCE_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, 'queued', 0, ?, 0, NULL, NULL, ?, ?, NULL, NULL, ?, ?, NULL)"
)
INSERT_EVENT: Final = (
    "INSERT INTO events (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json) "
    "VALUES (?, ?, 'occurrence_enqueued', ?, NULL, NULL, ?)"
)


@dataclass(frozen=True, slots=True)
class DepthJob:
    """The stored form of the job every depth row belongs to."""

    job_id: str
    revision: int
    max_attempts: int
    authority_json: str
    payload_json: str


def depth_job(store: Any, job_id: str = BENCH_JOB_ID) -> DepthJob:
    """Read the job through the store and encode it as ``enqueue_occurrence`` does."""
    job = store.get_job(job_id)
    if job is None:
        raise LookupError(f"job {job_id} does not exist")
    return DepthJob(
        job_id=job.id,
        revision=job.revision,
        max_attempts=job.max_attempts,
        authority_json=canonical_json(job.authority, "occurrence.authority"),
        payload_json=canonical_json(job.payload, "occurrence.payload"),
    )


class DepthBuilder:
    """Appends due, queued occurrences (index ``0, 1, 2, …``) to a store's database file."""

    def __init__(self, path: Path, job: DepthJob, *, prefix: str = "depth") -> None:
        self.path = path
        self.job = job
        self.prefix = prefix
        self.base = wall_ms() - PAST_MS
        self.built = 0

    def trigger_key(self, index: int) -> str:
        return f"{self.prefix}-{index:08d}"

    def occurrence_id(self, index: int) -> str:
        return derive_occurrence_identity(
            job_id=self.job.job_id,
            job_revision=self.job.revision,
            scheduled_for=self.base + index,
            trigger_key=self.trigger_key(index),
        ).occurrence_id

    def rows(self, start: int, stop: int, now: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        job = self.job
        occurrences: list[tuple[Any, ...]] = []
        events: list[tuple[Any, ...]] = []
        for index in range(start, stop):
            scheduled = self.base + index
            key = self.trigger_key(index)
            identity = derive_occurrence_identity(
                job_id=job.job_id, job_revision=job.revision, scheduled_for=scheduled, trigger_key=key
            )
            occurrences.append(
                (
                    identity.occurrence_id,
                    job.job_id,
                    job.revision,
                    identity.idempotency_key,
                    key,
                    scheduled,
                    scheduled,
                    job.max_attempts,
                    job.authority_json,
                    job.payload_json,
                    now,
                    now,
                )
            )
            data = {"jobRevision": job.revision, "scheduledFor": scheduled, "triggerKey": key}
            events.append((job.job_id, identity.occurrence_id, now, canonical_json(data, "event.data")))
        return occurrences, events

    def _chunks(self, count: int) -> Iterator[tuple[int, int]]:
        for start in range(self.built, self.built + count, CHUNK):
            yield start, min(self.built + count, start + CHUNK)

    def add(self, count: int, on_rows: Callable[[int], None] | None = None) -> float:
        """Insert ``count`` more occurrences in ONE transaction; returns the seconds it took."""
        started = time.perf_counter()
        connection = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        try:
            connection.execute("PRAGMA foreign_keys = ON")
            connection.execute("PRAGMA synchronous = FULL")
            connection.execute(f"PRAGMA cache_size = -{BUILD_CACHE_KIB}")
            connection.execute("BEGIN IMMEDIATE")
            now = wall_ms()
            for start, stop in self._chunks(count):
                occurrences, events = self.rows(start, stop, now)
                connection.executemany(INSERT_OCCURRENCE, occurrences)
                connection.executemany(INSERT_EVENT, events)
                if on_rows is not None:
                    on_rows(stop - start)
            connection.execute("COMMIT")
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            connection.close()
        self.built += count
        return time.perf_counter() - started


def queued_count(path: Path) -> int:
    """How many occurrences are ``queued`` (read with raw ``sqlite3``)."""
    connection = sqlite3.connect(path, timeout=30)
    try:
        row = connection.execute("SELECT count(*) FROM occurrences WHERE status = 'queued'").fetchone()
        return int(row[0])
    finally:
        connection.close()
