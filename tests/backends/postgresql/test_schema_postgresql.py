"""The schema layer on the real PostgreSQL server: DDL, fingerprints, verification, upgrades, locking."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from backends import sqlite_engine, unique_name
from schema_support import T0, UPGRADE_NOW, seed_v1_rows, table_rows
from sqlalchemy import Connection, Engine, text

from scheduler import open_store
from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema import (
    MIGRATION_CHECKSUMS,
    MIGRATION_NAMES,
    PG_SCHEMA_FINGERPRINTS,
    SCHEMA_V6_PG_FINGERPRINT,
    apply_step,
    apply_upgrade,
    initialize_or_upgrade,
    inspect_database,
    metadata,
    pg_catalog,
    pg_ddl,
    schema_fingerprint,
    schema_target,
    verify_schema,
)
from scheduler.schema.target import quote_identifier

REPO = Path(__file__).resolve().parents[3]
VERSIONS = range(1, 7)


def create(engine: Engine, schema: str, version: int = 6, now: int = T0) -> None:
    with engine.begin() as connection:
        apply_upgrade(connection, 0, now, to_version=version, schema=schema)


def snapshot(engine: Engine, schema: str) -> str:
    """Everything a refusal must leave as it was: the catalog description and the history."""
    with engine.connect() as connection:
        target = schema_target(connection, schema)
        description = pg_catalog.describe(connection, target)
        history = pg_catalog.read_history(connection, target) if "migrations" in description["tables"] else []
        return json.dumps([description, history], sort_keys=True, default=str)


def tamper(engine: Engine, schema: str, *statements: str) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql(f"SET LOCAL search_path TO {quote_identifier(schema)}")
        for statement in statements:
            connection.exec_driver_sql(statement)


def refused(engine: Engine, check: Callable[[Connection], object]) -> SchedulerKernelError:
    with pytest.raises(SchedulerKernelError) as caught, engine.begin() as connection:
        check(connection)
    return caught.value


# ----------------------------------------------------------------- DDL and fingerprints


@pytest.mark.parametrize("version", VERSIONS)
def test_each_version_has_its_fingerprint(pg_engine: Engine, pg_schema: str, version: int) -> None:
    create(pg_engine, pg_schema, version)
    with pg_engine.begin() as connection:
        assert schema_fingerprint(connection, schema=pg_schema) == PG_SCHEMA_FINGERPRINTS[version]
        verify_schema(connection, version, schema=pg_schema)
        assert inspect_database(connection, schema=pg_schema) == version
        rows = connection.execute(text(f'SELECT * FROM "{pg_schema}".migrations ORDER BY version')).all()
        assert [tuple(row) for row in rows] == [
            (v, MIGRATION_NAMES[v], MIGRATION_CHECKSUMS[v], T0) for v in range(1, version + 1)
        ]
        if version < 6:
            with pytest.raises(SchedulerKernelError) as caught:
                verify_schema(connection, version + 1, schema=pg_schema)
            assert caught.value.code == "SCHEDULER_SCHEMA_UNKNOWN"


def test_create_all_builds_the_v6_catalog_under_any_schema_name(pg_engine: Engine) -> None:
    """``metadata.create_all`` on PostgreSQL equals the v1..v6 steps; the name never enters the hash."""
    names = [unique_name("t_plain"), unique_name('Odd "Name" ') + "ü"]
    try:
        for name in names:
            with pg_engine.begin() as connection:
                connection.exec_driver_sql(f"CREATE SCHEMA {quote_identifier(name)}")
                metadata.create_all(connection.execution_options(schema_translate_map={None: name}))
            with pg_engine.connect() as connection:
                assert schema_fingerprint(connection, schema=name) == SCHEMA_V6_PG_FINGERPRINT
                description = json.dumps(pg_catalog.describe(connection, schema_target(connection, name)))
                assert name not in description and json.dumps(name)[1:-1] not in description
    finally:
        for name in names:
            with pg_engine.begin() as connection:
                connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {quote_identifier(name)} CASCADE")


def test_column_rules_of_api_8(pg_engine: Engine, pg_schema: str) -> None:
    create(pg_engine, pg_schema)
    with pg_engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT data_type, coalesce(collation_name, ''), count(*) FROM information_schema.columns "
                "WHERE table_schema = :s GROUP BY 1, 2 ORDER BY 1, 2"
            ),
            {"s": pg_schema},
        ).all()
        assert [(kind, collation) for kind, collation, _ in rows] == [("bigint", ""), ("text", "C")]
        default = connection.execute(
            text(
                "SELECT column_default FROM information_schema.columns "
                "WHERE table_schema = :s AND table_name = 'events' AND column_name = 'event_id'"
            ),
            {"s": pg_schema},
        ).scalar_one()
        assert default.startswith("nextval(")


def test_json_checks_cast_to_json_not_jsonb(pg_engine: Engine, pg_schema: str) -> None:
    create(pg_engine, pg_schema)
    insert_job = "INSERT INTO jobs VALUES ('{id}', 'k', '{trigger}', '{{}}', '{{}}', 1, 1, 3, 0, 0)"
    tamper(pg_engine, pg_schema, insert_job.format(id="nul", trigger='{"a":"\\u0000"}'))
    with pytest.raises(Exception) as caught:
        tamper(pg_engine, pg_schema, insert_job.format(id="bad", trigger="{"))
    assert "invalid input syntax for type json" in str(caught.value)
    with pg_engine.connect() as connection:
        assert connection.exec_driver_sql(f'SELECT job_id FROM "{pg_schema}".jobs').scalars().all() == ["nul"]


# ----------------------------------------------------------------- upgrades and the v2 backfill


@pytest.mark.parametrize("start", range(1, 6))
def test_every_version_upgrades_to_v6(pg_engine: Engine, pg_schema: str, start: int) -> None:
    create(pg_engine, pg_schema, start)
    with pg_engine.begin() as connection:
        assert initialize_or_upgrade(connection, now=UPGRADE_NOW, schema=pg_schema) == start
    with pg_engine.connect() as connection:
        verify_schema(connection, schema=pg_schema)
        applied = connection.exec_driver_sql(f'SELECT applied_at FROM "{pg_schema}".migrations ORDER BY 1')
        assert list(applied.scalars()) == [T0] * start + [UPGRADE_NOW] * (6 - start)


def test_v2_backfill_gives_the_same_rows_as_on_sqlite(
    pg_engine: Engine, pg_schema: str, tmp_path: Path
) -> None:
    names = ("jobs", "occurrences", "scheduler_authority_policies", "migrations")
    results = []
    sqlite = sqlite_engine(tmp_path / "v1.sqlite")
    for engine, schema in ((sqlite, None), (pg_engine, pg_schema)):
        with engine.begin() as connection:
            apply_upgrade(connection, 0, T0, to_version=1, schema=schema)
            seed_v1_rows(connection, schema_target(connection, schema))
        with engine.begin() as connection:
            assert initialize_or_upgrade(connection, now=UPGRADE_NOW, schema=schema) == 1
            results.append(table_rows(connection, schema_target(connection, schema), *names))
    sqlite.dispose()
    assert results[0] == results[1]
    policies = results[1]["scheduler_authority_policies"]
    assert [(p["principal_id"], p["capabilities_json"]) for p in policies] == [
        ("svc-a", '["b.read","z.read"]'),
        ("svc-b", '["a.read","c.read","x.write"]'),
        ("svc-c", '["q.read"]'),
    ]
    assert '"schedulerPolicyRevision":"scheduler-authority:1"' in results[1]["jobs"][0]["authority_json"]


def test_failed_backfill_leaves_the_schema_untouched(pg_engine: Engine, pg_schema: str) -> None:
    create(pg_engine, pg_schema, 1)
    with pg_engine.begin() as connection:
        seed_v1_rows(connection, schema_target(connection, pg_schema))
    tamper(pg_engine, pg_schema, "UPDATE jobs SET authority_json = '[1]' WHERE job_id = 'job-b'")
    before = snapshot(pg_engine, pg_schema)
    error = refused(pg_engine, lambda c: initialize_or_upgrade(c, now=UPGRADE_NOW, schema=pg_schema))
    assert error.code == "SCHEDULER_DATA_CORRUPT"
    assert snapshot(pg_engine, pg_schema) == before


def test_steps_refuse_out_of_order_and_autocommit(pg_engine: Engine, pg_schema: str) -> None:
    create(pg_engine, pg_schema, 2)
    error = refused(pg_engine, lambda c: apply_step(c, 4, T0, schema=pg_schema))
    assert (error.code, error.details) == ("SCHEDULER_SCHEMA_UNKNOWN", {"expected": 3, "actual": 2})
    error = refused(pg_engine, lambda c: apply_step(c, 1, T0, schema=pg_schema))
    assert error.code == "SCHEDULER_SCHEMA_UNKNOWN" and "migrations" in error.details["tables"]
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        with pytest.raises(SchedulerKernelError) as caught:
            apply_step(connection, 3, T0, schema=pg_schema)
        assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"
    with pg_engine.connect().execution_options(isolation_level="REPEATABLE READ") as connection:
        with pytest.raises(SchedulerKernelError) as caught, connection.begin():
            apply_step(connection, 3, T0, schema=pg_schema)
        assert "READ COMMITTED" in caught.value.message


def test_verification_in_autocommit_mode_keeps_the_session(pg_engine: Engine, pg_schema: str) -> None:
    create(pg_engine, pg_schema)
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("SET search_path TO public")
        verify_schema(connection, schema=pg_schema)
        assert schema_fingerprint(connection, schema=pg_schema) == SCHEMA_V6_PG_FINGERPRINT
        assert connection.exec_driver_sql("SHOW search_path").scalar_one() == "public"


def test_schema_argument_is_validated(pg_engine: Engine) -> None:
    with pg_engine.connect() as connection:
        for schema, exclusive in (("", True), ("pg_x", True), ("x" * 64, True), ("scheduler", False)):
            with pytest.raises(SchedulerKernelError) as caught:
                verify_schema(connection, schema=schema, exclusive=exclusive)
            assert caught.value.code == "SCHEDULER_INVALID_ARGUMENT"


# ----------------------------------------------------------------- refusals, leaving the schema unchanged

TAMPERS: list[tuple[str, tuple[str, ...], str, str]] = [
    ("dropped column", ("ALTER TABLE jobs DROP COLUMN kind",), "CORRUPT", "table shape is invalid: jobs"),
    (
        "added column",
        ("ALTER TABLE events ADD COLUMN extra text",),
        "CORRUPT",
        "table shape is invalid: events",
    ),
    (
        "changed check",
        (
            "ALTER TABLE jobs DROP CONSTRAINT jobs_max_attempts_check",
            "ALTER TABLE jobs ADD CONSTRAINT jobs_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 33)",
        ),
        "CORRUPT",
        "description does not match v6",
    ),
    (
        "changed index",
        (
            "DROP INDEX scheduler_events_job",
            "CREATE INDEX scheduler_events_job ON events (job_id, event_id)",
        ),
        "CORRUPT",
        "description does not match v6",
    ),
    (
        "missing index",
        ("DROP INDEX scheduler_pg_occurrences_expired",),
        "CORRUPT",
        "description does not match v6",
    ),
    ("extra index", ("CREATE INDEX app_kind ON jobs (kind)",), "CORRUPT", "description does not match v6"),
    (
        "linguistic collation",
        ('ALTER TABLE jobs ALTER COLUMN kind TYPE text COLLATE "default"',),
        "CORRUPT",
        "description does not match v6",
    ),
    ("unlogged table", ("ALTER TABLE events SET UNLOGGED",), "CORRUPT", "description does not match v6"),
    ("view", ("CREATE VIEW job_kinds AS SELECT kind FROM jobs",), "CORRUPT", "description does not match v6"),
    (
        "trigger",
        (
            "CREATE TRIGGER t_jobs BEFORE UPDATE ON jobs FOR EACH ROW "
            "EXECUTE FUNCTION suppress_redundant_updates_trigger()",
        ),
        "CORRUPT",
        "description does not match v6",
    ),
    (
        "rule",
        ("CREATE RULE drop_events AS ON INSERT TO events DO INSTEAD NOTHING",),
        "CORRUPT",
        "description does not match v6",
    ),
    ("function", ("CREATE FUNCTION helper() RETURNS int LANGUAGE sql AS 'SELECT 1'",), "CORRUPT", "v6"),
    ("foreign table", ("CREATE TABLE app_orders (id bigint)",), "UNKNOWN", "unknown or missing tables"),
    ("dropped table", ("DROP TABLE scheduler_occurrence_retries",), "UNKNOWN", "unknown or missing tables"),
    (
        "unknown version",
        ("INSERT INTO migrations VALUES (7, 'scheduler-kernel-v7', 'x', 0)",),
        "UNKNOWN",
        "migration history is unknown",
    ),
    (
        "unknown row",
        ("UPDATE migrations SET checksum = 'x' WHERE version = 4",),
        "UNKNOWN",
        "migration history is unknown",
    ),
    ("missing row", ("DELETE FROM migrations WHERE version = 2",), "UNKNOWN", "migration history is unknown"),
]


@pytest.mark.parametrize(("label", "statements", "code", "fragment"), TAMPERS, ids=[t[0] for t in TAMPERS])
def test_drift_is_refused_and_nothing_changes(
    pg_engine: Engine, pg_schema: str, label: str, statements: tuple[str, ...], code: str, fragment: str
) -> None:
    create(pg_engine, pg_schema)
    tamper(pg_engine, pg_schema, *statements)
    before = snapshot(pg_engine, pg_schema)
    for check in (
        lambda c: verify_schema(c, schema=pg_schema),
        lambda c: initialize_or_upgrade(c, now=UPGRADE_NOW, schema=pg_schema),
    ):
        error = refused(pg_engine, check)
        assert error.code == f"SCHEDULER_SCHEMA_{code}", error
        assert fragment in error.message
    assert snapshot(pg_engine, pg_schema) == before


def test_a_real_foreign_table_is_refused(pg_engine: Engine, pg_schema: str) -> None:
    """A FOREIGN TABLE (a wrapper without a handler is enough to declare one) inside the schema."""
    create(pg_engine, pg_schema)
    wrapper, server = unique_name("t_fdw"), unique_name("t_srv")
    try:
        with pg_engine.begin() as connection:
            connection.exec_driver_sql(f"CREATE FOREIGN DATA WRAPPER {wrapper}")
            connection.exec_driver_sql(f"CREATE SERVER {server} FOREIGN DATA WRAPPER {wrapper}")
            connection.exec_driver_sql(
                f'CREATE FOREIGN TABLE "{pg_schema}".remote_jobs (id bigint) SERVER {server}'
            )
        before = snapshot(pg_engine, pg_schema)
        error = refused(pg_engine, lambda c: initialize_or_upgrade(c, now=UPGRADE_NOW, schema=pg_schema))
        assert error.code == "SCHEDULER_SCHEMA_UNKNOWN" and "remote_jobs" in error.details["actual"]
        assert snapshot(pg_engine, pg_schema) == before
    finally:
        with pg_engine.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')
            connection.exec_driver_sql(f"DROP SERVER IF EXISTS {server}")
            connection.exec_driver_sql(f"DROP FOREIGN DATA WRAPPER IF EXISTS {wrapper}")


def test_non_empty_schema_without_migrations_is_unknown(pg_engine: Engine, pg_schema: str) -> None:
    tamper(pg_engine, "public", f'CREATE SCHEMA "{pg_schema}"', f'CREATE TABLE "{pg_schema}".jobs (x int)')
    before = snapshot(pg_engine, pg_schema)
    error = refused(pg_engine, lambda c: initialize_or_upgrade(c, now=T0, schema=pg_schema))
    assert (error.code, error.details) == ("SCHEDULER_SCHEMA_UNKNOWN", {"tables": ["jobs"], "objects": []})
    assert snapshot(pg_engine, pg_schema) == before


def test_empty_existing_schema_is_created_into(pg_engine: Engine, pg_schema: str) -> None:
    tamper(pg_engine, "public", f'CREATE SCHEMA "{pg_schema}"')
    with pg_engine.begin() as connection:
        assert initialize_or_upgrade(connection, now=T0, schema=pg_schema) == 0
    with pg_engine.connect() as connection:
        assert schema_fingerprint(connection, schema=pg_schema) == SCHEMA_V6_PG_FINGERPRINT


def test_autovacuum_settings_on_the_queue_table_are_not_drift(pg_engine: Engine, pg_schema: str) -> None:
    """docs/postgresql.md ("Vacuum and the head of the queue") advises operators to set
    autovacuum storage parameters on ``occurrences``: the fingerprint does not cover them, so the
    catalog still verifies and the store opens."""
    create(pg_engine, pg_schema)
    tamper(
        pg_engine,
        pg_schema,
        f"ALTER TABLE {quote_identifier(pg_schema)}.occurrences "
        "SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000)",
    )
    with pg_engine.connect() as connection:
        assert schema_fingerprint(connection, schema=pg_schema) == SCHEMA_V6_PG_FINGERPRINT
        verify_schema(connection, 6, schema=pg_schema)
    open_store(pg_engine, schema=pg_schema).close()


def test_application_tables_elsewhere_are_untouched(pg_engine: Engine, pg_schema: str) -> None:
    """Tables named like the scheduler's in another schema are neither read nor written."""
    app = unique_name("t_app")
    tamper(pg_engine, "public", f'CREATE SCHEMA "{app}"', f'CREATE TABLE "{app}".migrations (v int)')
    tamper(pg_engine, app, "INSERT INTO migrations VALUES (42)", "CREATE TABLE jobs (job_id text)")
    try:
        with pg_engine.begin() as connection:
            connection.exec_driver_sql(f'SET LOCAL search_path TO "{app}", public')
            initialize_or_upgrade(connection, now=T0, schema=pg_schema)
        with pg_engine.connect() as connection:
            assert connection.exec_driver_sql(f'SELECT v FROM "{app}".migrations').scalars().all() == [42]
            verify_schema(connection, schema=pg_schema)
    finally:
        tamper(pg_engine, "public", f'DROP SCHEMA "{app}" CASCADE')


# ----------------------------------------------------------------- two processes, one empty database

_OPENER = """
import sys
from sqlalchemy import create_engine
from scheduler.schema import initialize_or_upgrade
engine = create_engine(sys.argv[1])
with engine.begin() as connection:
    print(initialize_or_upgrade(connection, now=1767225600000, schema=sys.argv[2]))
"""


def _waiting_on_the_lock(engine: Engine, schema: str) -> int:
    classid, objid = pg_ddl.lock_key(schema)
    with engine.connect() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND classid = CAST(:classid AS oid) "
                    "AND objid = CAST(CAST(:objid AS bigint) & 4294967295 AS oid)"
                ),
                {"classid": classid, "objid": objid},
            ).scalar_one()
        )


def test_two_processes_opening_an_empty_database(pg_engine: Engine, pg_schema: str) -> None:
    """Both block on the schema lock the test holds; released, one creates and the other verifies."""
    url = pg_engine.url.render_as_string(hide_password=False)
    holder = pg_engine.connect()
    try:
        with holder.begin():
            pg_ddl.lock_schema(holder, schema_target(holder, pg_schema))
            processes = [
                subprocess.Popen(
                    [sys.executable, "-c", _OPENER, url, pg_schema],
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for _ in range(2)
            ]
            deadline = time.monotonic() + 60
            while _waiting_on_the_lock(pg_engine, pg_schema) < 2:
                assert time.monotonic() < deadline, "the openers never reached the lock"
                assert all(p.poll() is None for p in processes), [p.communicate() for p in processes]
                time.sleep(0.05)
        outputs = [p.communicate(timeout=120) for p in processes]
        assert [p.returncode for p in processes] == [0, 0], outputs
        assert sorted(int(out.strip()) for out, _ in outputs) == [0, 6]
        with pg_engine.connect() as connection:
            verify_schema(connection, schema=pg_schema)
            migrations = connection.exec_driver_sql(f'SELECT count(*) FROM "{pg_schema}".migrations')
            assert migrations.scalar_one() == 6
    finally:
        holder.close()


def test_lock_keys_are_int4_and_differ_by_schema() -> None:
    keys = {pg_ddl.lock_key(name) for name in ("scheduler", "Scheduler", "jobs_kernel", "ü")}
    assert len(keys) == 4
    assert all(-(2**31) <= part < 2**31 for key in keys for part in key)
