"""The v2 authority backfill (seed: ``migrateAuthorityV2``), dialect-free Core for both backends.

Every job and every non-terminal occurrence gets a policy for its principal (capabilities: the
sorted union of what they request; default window and budgets; timestamps ``now``) and its stored
authority bound to ``schedulerPolicyRevision = "scheduler-authority:1"``. Terminal occurrences
are validated (``SCHEDULER_DATA_CORRUPT``) but left as they are. The connection given must
already address the scheduler's schema (``SchemaTarget.bind``).
"""

from __future__ import annotations

import json
from typing import Any, Final

from sqlalchemy import Connection, insert, select, update

from scheduler.contract.authority import normalize_authority_envelope
from scheduler.contract.canonical import canonical_json
from scheduler.contract.constants import (
    DEFAULT_AUTHORITY_MAX_RUNS,
    DEFAULT_AUTHORITY_MAX_UNITS,
    DEFAULT_AUTHORITY_WINDOW_MS,
    TERMINAL_STATUSES,
)
from scheduler.contract.errors import SchedulerKernelError
from scheduler.contract.scalars import utf16_sorted
from scheduler.schema import tables as t

DATA_CORRUPT: Final = "SCHEDULER_DATA_CORRUPT"
SCHEDULER_POLICY_REVISION_REF: Final = "scheduler-authority:1"
"""The ``authorizationRefs.schedulerPolicyRevision`` the v2 backfill binds every live authority to."""


def _data_corrupt(message: str, cause: BaseException | None = None) -> SchedulerKernelError:
    error = SchedulerKernelError(DATA_CORRUPT, message)
    error.__cause__ = cause
    return error


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


def _read_stored_authority(encoded: str, field: str) -> dict[str, Any]:
    """The seed's ``readStoredAuthority``: parse and normalize, else ``SCHEDULER_DATA_CORRUPT``."""
    try:
        value = json.loads(encoded, parse_constant=_reject_constant)
    except (TypeError, ValueError) as cause:
        raise _data_corrupt(f"Stored {field} is not valid JSON", cause) from cause
    try:
        return normalize_authority_envelope(value)
    except SchedulerKernelError as cause:
        if cause.code == DATA_CORRUPT:
            raise
        raise _data_corrupt(f"Stored {field} does not match authority envelope v1", cause) from cause
    except (TypeError, ValueError) as cause:
        raise _data_corrupt(f"Stored {field} does not match authority envelope v1", cause) from cause


class _PolicyCollector:
    """Principals seen by the backfill, in first-seen order, with their capability union."""

    def __init__(self) -> None:
        self.policies: dict[str, tuple[dict[str, Any], set[str]]] = {}

    def bind(self, encoded: str, field: str) -> dict[str, Any]:
        """Record the authority's principal and capabilities; return it bound to the policy."""
        authority = _read_stored_authority(encoded, field)
        principal = authority["principal"]
        key = canonical_json(principal, f"{field}.principal")
        _, capabilities = self.policies.setdefault(key, (principal, set()))
        capabilities.update(authority["requestedCapabilities"])
        refs = dict(authority.get("authorizationRefs") or {})
        refs["schedulerPolicyRevision"] = SCHEDULER_POLICY_REVISION_REF
        return {**authority, "authorizationRefs": refs}

    def rows(self, now: int) -> list[dict[str, Any]]:
        """One ``scheduler_authority_policies`` row per principal, in first-seen order."""
        return [
            {
                "principal_type": principal["type"],
                "principal_id": principal["id"],
                "revision": 1,
                "enabled": 1,
                "capabilities_json": canonical_json(
                    utf16_sorted(capabilities), "authorityPolicy.capabilities"
                ),
                "window_ms": DEFAULT_AUTHORITY_WINDOW_MS,
                "max_runs": DEFAULT_AUTHORITY_MAX_RUNS,
                "max_units": DEFAULT_AUTHORITY_MAX_UNITS,
                "created_at": now,
                "updated_at": now,
            }
            for principal, capabilities in self.policies.values()
        ]


def _bind_jobs(connection: Connection, collector: _PolicyCollector) -> list[tuple[str, dict[str, Any]]]:
    rows = connection.execute(
        select(t.jobs.c.job_id, t.jobs.c.authority_json).order_by(t.jobs.c.job_id)
    ).all()
    return [(row.job_id, collector.bind(row.authority_json, f"job {row.job_id} authority")) for row in rows]


def _bind_occurrences(
    connection: Connection, collector: _PolicyCollector
) -> list[tuple[str, dict[str, Any]]]:
    """Bind every non-terminal occurrence; terminal ones are validated but not rewritten."""
    occ = t.occurrences.c
    rows = connection.execute(
        select(occ.occurrence_id, occ.status, occ.authority_json).order_by(occ.occurrence_id)
    ).all()
    bound: list[tuple[str, dict[str, Any]]] = []
    for row in rows:
        field = f"occurrence {row.occurrence_id} authority"
        if row.status in TERMINAL_STATUSES:
            _read_stored_authority(row.authority_json, field)
        else:
            bound.append((row.occurrence_id, collector.bind(row.authority_json, field)))
    return bound


def backfill_authority_v2(connection: Connection, now: int) -> None:
    """Insert the policies and rewrite the bound authorities (the v2 tables already exist)."""
    collector = _PolicyCollector()
    bound_jobs = _bind_jobs(connection, collector)
    bound_occurrences = _bind_occurrences(connection, collector)
    policy_rows = collector.rows(now)
    if policy_rows:
        connection.execute(insert(t.authority_policies), policy_rows)
    for job_id, authority in bound_jobs:
        connection.execute(
            update(t.jobs)
            .where(t.jobs.c.job_id == job_id)
            .values(authority_json=canonical_json(authority, "job.authority"))
        )
    for occurrence_id, authority in bound_occurrences:
        connection.execute(
            update(t.occurrences)
            .where(t.occurrences.c.occurrence_id == occurrence_id)
            .values(authority_json=canonical_json(authority, "occurrence.authority"))
        )
