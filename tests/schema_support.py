"""Helpers for the schema-layer tests on both backends: v1 data to upgrade, catalog snapshots."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, insert, select

from scheduler.contract.canonical import canonical_json
from scheduler.schema import tables as t
from scheduler.schema.target import SchemaTarget

T0 = 1767225600000
UPGRADE_NOW = 1767312000000


def raw(path: Path, *statements: str) -> None:
    """Run statements with the plain sqlite3 driver in autocommit mode (tampering)."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            con.execute(statement)
    finally:
        con.close()


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def authority(principal_id: str, *capabilities: str) -> str:
    return canonical_json(
        {
            "principal": {"type": "service", "id": principal_id},
            "tenantId": "tenant-acme",
            "workspaceId": "ws-main",
            "requestedCapabilities": list(capabilities),
        }
    )


def _occurrence(occurrence_id: str, job_id: str, status: str, auth: str) -> dict[str, Any]:
    running = status == "running"
    settled = status in ("succeeded", "dead_letter")
    return {
        "occurrence_id": occurrence_id,
        "job_id": job_id,
        "job_revision": 1,
        "idempotency_key": f"key-{occurrence_id}",
        "trigger_key": f"trigger-{occurrence_id}",
        "scheduled_for": T0,
        "available_at": T0,
        "status": status,
        "attempt": 1 if running or settled else 0,
        "max_attempts": 3,
        "fence": 1 if running or settled else 0,
        "lease_owner": "worker" if running else None,
        "lease_expires_at": T0 + 1000 if running else None,
        "authority_json": auth,
        "payload_json": "{}",
        "created_at": T0,
        "updated_at": T0,
        "settled_at": T0 if settled else None,
    }


def seed_v1_rows(connection: Connection, target: SchemaTarget) -> None:
    """Jobs and live/terminal occurrences for the v2 authority backfill to bind (code-point ids)."""
    bound = target.bind(connection)
    jobs = [("job-b", authority("svc-b", "x.write", "a.read")), ("job-a", authority("svc-a", "b.read"))]
    jobs.append(("Job-Z", authority("svc-b", "c.read")))  # "Job-Z" < "job-a" by code point
    bound.execute(
        insert(t.jobs),
        [
            {
                "job_id": job_id,
                "kind": "routine",
                "trigger_json": '{"type":"event"}',
                "payload_json": '{"n":1}',
                "authority_json": auth,
                "enabled": 1,
                "revision": 1,
                "max_attempts": 3,
                "created_at": T0,
                "updated_at": T0,
            }
            for job_id, auth in jobs
        ],
    )
    bound.execute(
        insert(t.occurrences),
        [
            _occurrence("occ-1", "job-a", "queued", authority("svc-c", "q.read")),
            _occurrence("occ-2", "job-a", "running", authority("svc-a", "z.read")),
            _occurrence("occ-3", "job-b", "succeeded", authority("svc-d", "never.bound")),
        ],
    )


def table_rows(connection: Connection, target: SchemaTarget, *names: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of the named scheduler tables, ordered by primary key (comparable across backends)."""
    bound = target.bind(connection)
    result: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        table = t.metadata.tables[name]
        rows = bound.execute(select(table).order_by(*table.primary_key.columns)).mappings()
        result[name] = [dict(row) for row in rows]
    return result
