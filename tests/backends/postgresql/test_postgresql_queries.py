"""The hand-written statements of ``scheduler/backends/postgresql/queries.sql``: they run in the
store's schema, their result columns are the ones ``queries.COLUMNS`` declares (the fast path
reads rows by position), and the constants written into them are the store's."""

from __future__ import annotations

from typing import Any

import pytest
from backends import PostgresServer, unique_name
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError
from test_postgresql_claims import LEASE, enqueue
from test_postgresql_cycle_statement import T0
from test_postgresql_races import AUTHORITY

from scheduler import open_store
from scheduler.backends.postgresql import cycle_read, enqueue_statement, queries
from scheduler.backends.postgresql.backend import key_space
from scheduler.contract.identity import derive_occurrence_identity, identity_digest_parts
from scheduler.store.capabilities.claim_query import HEAD_WINDOW

pytestmark = pytest.mark.postgresql


def _parameters(occurrence_id: str, kinds: list[str] | None, workspace_id: str | None) -> dict[str, Any]:
    return {
        "p_id": occurrence_id,
        "p_owner": "w",
        "p_fence": 1,
        "p_result": None,
        "p_lease": LEASE,
        "now": T0,
        "job_kinds": kinds,
        "workspace_id": workspace_id,
    }


CYCLE_STATEMENTS = sorted(name for name in queries.COLUMNS if not name.startswith("enqueue"))


@pytest.mark.parametrize("name", CYCLE_STATEMENTS)
@pytest.mark.parametrize(("kinds", "workspace_id"), [(None, None), (["agenda", "other"], "nowhere")])
def test_each_statement_runs_in_the_store_schema_with_its_declared_columns(
    postgres_server: PostgresServer, name: str, kinds: list[str] | None, workspace_id: str | None
) -> None:
    schema = unique_name("t_queries")
    store = open_store(postgres_server.engine, schema=schema, clock=lambda: T0)
    try:
        made = enqueue(store, 3)
        held = store.claim_next(owner_id="w", lease_ms=LEASE)
        assert held is not None and held.id == made[0]
        compiled = queries.prepared(name).statement.compile(
            dialect=postgresql.psycopg.dialect(),
            schema_translate_map={None: schema},
            render_schema_translate=True,
        )
        assert f'"{schema}".occurrences' in str(compiled) or f"{schema}.occurrences" in str(compiled)
        connection = store.connection
        connection.rollback()
        parameters = _parameters(held.id, kinds, workspace_id)
        cycle = name in ("cycle", "cycle_window", "claim", "claim_window")
        if cycle and kinds is not None:  # nothing the filter may take is due: the check fails it
            with connection.begin(), pytest.raises(DBAPIError, match="kept-writes-changed"):
                connection.exec_driver_sql(str(compiled), parameters)
            return
        with connection.begin() as transaction:
            result = connection.exec_driver_sql(str(compiled), parameters)
            assert tuple(result.keys()) == queries.COLUMNS[name]
            rows = result.all()
            transaction.rollback()
        first = rows[0]._mapping
        if name == "settle":  # settled made[0]
            assert (first["s_occurrence_id"], first["s_status"], first["checked"]) == (
                made[0],
                "succeeded",
                1,
            )
            return
        if cycle:  # settled made[0] (the cycle), claimed the next row
            settled = first.get("s_occurrence_id", made[0])
            claimed = (settled, first["c_occurrence_id"], first["checked"])
            assert claimed == (made[0], made[1], 1)
            return
        if name.startswith("cycle_read"):
            assert first["settled_occurrence_id"] == made[0]
        # the heads: made[1] due first (eligible unless filtered out); a window reads up to 8
        due = made[1:] if name.endswith("window") else made[1:2]
        assert {row.occurrence_id: row.job_ok for row in rows} == dict.fromkeys(due, kinds is None)
        if name != "cycle_read_window":  # a plain head is locked as it is now
            locked = {row.locked_occurrence_id for row in rows} - {None}
            assert (locked, first["head_plain"]) == (({made[1]}, True) if kinds is None else (set(), False))
    finally:
        store.close()
        postgres_server.drop_schema(schema)


def _compiled(name: str, schema: str) -> str:
    return str(
        queries.prepared(name).statement.compile(
            dialect=postgresql.psycopg.dialect(),
            schema_translate_map={None: schema},
            render_schema_translate=True,
        )
    )


def test_the_enqueue_statements_run_in_the_store_schema_with_their_declared_columns(
    postgres_server: PostgresServer,
) -> None:
    schema = unique_name("t_queries")
    store = open_store(postgres_server.engine, schema=schema, clock=lambda: T0)
    try:
        store.create_job(id="job-1", kind="agenda", authority=AUTHORITY)
        connection = store.connection
        connection.rollback()
        texts = connection.exec_driver_sql(
            f'SELECT authority_json, payload_json, trigger_json FROM "{schema}".jobs'
        ).one()
        connection.rollback()
        head, tail = identity_digest_parts("job-1", T0, "t")
        parameters: dict[str, Any] = {
            "space": key_space(schema, "enqueue"),
            "lock_key": f"job-1\x1f{T0}\x1ft",
            "job_id": "job-1",
            "trigger_key": "t",
            "scheduled_for": T0,
            "available_at": T0,
            "payload_json": None,
            "now": T0,
            "job_texts": None,  # not verified: the job's texts come back, nothing is written
            "identity_head": head.hex(),
            "identity_tail": tail.hex(),
            "event_tail": f',"scheduledFor":{T0},"triggerKey":"t"}}',
            "channel": "scheduler_work.test",
        }
        lead = _compiled("enqueue_lock", schema)
        with connection.begin() as transaction:
            assert (
                tuple(connection.exec_driver_sql(lead, parameters).keys()) == queries.COLUMNS["enqueue_lock"]
            )
            result = connection.exec_driver_sql(_compiled("enqueue", schema), parameters)
            assert tuple(result.keys()) == queries.COLUMNS["enqueue"]
            row = result.one()._mapping
            assert (row["checked"], row["occurrence_id"]) == (1, None)
            assert enqueue_statement.verified_digest(
                row["job_authority_json"], row["job_payload_json"], row["job_trigger_json"]
            ) == enqueue_statement.texts_digest(*texts)
            transaction.rollback()
        parameters["job_texts"] = enqueue_statement.texts_digest(*texts)
        with connection.begin() as transaction:
            row = connection.exec_driver_sql(_compiled("enqueue", schema), parameters).one()._mapping
            identity = derive_occurrence_identity(
                job_id="job-1", job_revision=1, scheduled_for=T0, trigger_key="t"
            )
            assert (
                row["checked"],
                row["occurrence_id"],
                row["idempotency_key"],
                row["job_authority_json"],
            ) == (
                1,
                identity.occurrence_id,
                identity.idempotency_key,
                None,
            )
            transaction.rollback()
    finally:
        store.close()
        postgres_server.drop_schema(schema)


def test_the_constants_written_into_the_statements_are_the_stores() -> None:
    window = f"LIMIT {HEAD_WINDOW})"
    for name in ("cycle_read_window", "cycle_window", "claim_window"):
        assert queries.SQL[name].count(window) == 2, name  # one per waiting status
    for name in ("cycle_window", "claim_window"):
        assert f"arm_rows = {HEAD_WINDOW} AND arm_rank = {HEAD_WINDOW}" in queries.SQL[name]
    for name in ("cycle", "cycle_window"):
        assert f"(SELECT waited_us FROM cycle_clock) <= {cycle_read.MAX_WAIT_US}" in queries.SQL[name]


def test_a_placeholder_that_is_not_a_scheduler_table_is_refused() -> None:
    with pytest.raises(ValueError, match="not a scheduler table"):
        queries.load("-- name: broken\nSELECT 1 FROM {nowhere}\n")
    assert queries.load("-- name: a\n-- a comment\nSELECT 1\n\n-- name: b\nSELECT 2\n") == {
        "a": "SELECT 1",
        "b": "SELECT 2",
    }
