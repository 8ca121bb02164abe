"""Queue depth on PostgreSQL: set-based bulk rows and the claim statements' query plans.

``fill_queue`` writes ``count`` due, queued occurrences of one existing job with ONE
``INSERT … SELECT … FROM generate_series`` into the store's schema, bypassing the API (a million
rows through ``enqueue_many`` would take many minutes). The rows satisfy every CHECK rule and
carry the job's stored authority and payload, but their identities are synthetic
(``occ_bulk_<prefix>_<n>``, not :func:`derive_occurrence_identity`) and no ``occurrence_enqueued``
events are written: they are load for the claim path, not replayable history. ``ANALYZE`` runs
afterwards so the planner sees the depth.

:func:`claim_plan_nodes` runs ``EXPLAIN (FORMAT JSON)`` on the claim path's statements (the
candidate read, the lock statements and the re-read) so tests and the bench can check that no
step scans ``occurrences`` sequentially: claim cost does not grow with the queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from sqlalchemy import Connection

from scheduler.schema.target import quote_identifier

_COLUMNS: Final = (
    "occurrence_id, job_id, job_revision, idempotency_key, trigger_key, scheduled_for, available_at, "
    "status, attempt, max_attempts, fence, lease_owner, lease_expires_at, authority_json, payload_json, "
    "last_error_json, result_json, created_at, updated_at, settled_at"
)


def fill_queue(
    connection: Connection, schema: str, job_id: str, count: int, *, due_at: int, prefix: str
) -> None:
    """Insert ``count`` queued occurrences of ``job_id``, due from ``due_at - count`` ms on (one
    ms apart, the first oldest), in the caller's transaction; then ``ANALYZE occurrences``."""
    table = f"{quote_identifier(schema)}.occurrences"
    jobs = f"{quote_identifier(schema)}.jobs"
    connection.exec_driver_sql(
        f"INSERT INTO {table} ({_COLUMNS}) "
        "SELECT 'occ_bulk_' || %(prefix)s || '_' || lpad(g::text, 9, '0'), j.job_id, j.revision, "
        "'scheduler:v1:bulk_' || %(prefix)s || '_' || lpad(g::text, 9, '0'), "
        "'bulk-' || %(prefix)s || '-' || lpad(g::text, 9, '0'), "
        "%(due)s - %(count)s + g, %(due)s - %(count)s + g, 'queued', 0, j.max_attempts, 0, NULL, NULL, "
        "j.authority_json, j.payload_json, NULL, NULL, %(due)s, %(due)s, NULL "
        f"FROM {jobs} AS j CROSS JOIN generate_series(1, %(count)s::bigint) AS g WHERE j.job_id = %(job)s",
        {"prefix": prefix, "due": due_at, "count": count, "job": job_id},
    )
    connection.exec_driver_sql(f"ANALYZE {table}")


def explain(connection: Connection, schema: str, statement: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The plan PostgreSQL chooses for a Core statement in ``schema`` (``EXPLAIN (FORMAT JSON)``)."""
    compiled = statement.compile(
        dialect=connection.dialect, schema_translate_map={None: schema}, render_schema_translate=True
    )
    state = compiled.construct_expanded_state(params)
    row = connection.exec_driver_sql(
        f"EXPLAIN (FORMAT JSON) {state.statement}", state.parameters
    ).scalar_one()
    plan: dict[str, Any] = row[0]["Plan"]
    return plan


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan, depth first."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)
