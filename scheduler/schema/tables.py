"""SQLAlchemy Core description of the scheduler schema v6 (all 13 tables).

The canonical DDL lives in ``ddl.py`` as text (its bytes are checksummed and fingerprinted);
this module describes the same schema as Core ``Table`` objects so that every store query can
be written as a Core expression. ``tests/backends/sqlite/test_schema_metadata.py`` proves both agree.

Every CHECK expression is the DDL's expression with whitespace folded. ``Table.info`` and
``Column.info`` carry ``"since"``: the schema version that introduced the table or column
(``versions.py`` derives each version's expected tables, columns and indexes from it).

The same objects describe the PostgreSQL catalog (API §8): integers are ``BIGINT`` and text is
``COLLATE "C"`` through type variants, the CHECKs SQLite spells with ``json_valid``/``GLOB`` are
:class:`~scheduler.schema.checks.DialectCheck` (SQLite text unchanged, translated for
PostgreSQL), ``events.event_id`` is a ``BIGSERIAL``, and the claim path's PostgreSQL-only indexes
are created only there (``ddl_if``; ``info["dialect"]``). The SQLite DDL that
``metadata.create_all`` emits is unchanged by all of this.

The tables carry no schema: statements reach them through ``schema_translate_map``
(see ``target.py``), so one ``MetaData`` serves ``main``, an attached database or any
PostgreSQL schema.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from scheduler.schema.checks import DialectCheck, needs_translation

SINCE: Final = "since"
"""Key in ``Table.info`` / ``Column.info`` holding the schema version that introduced it."""
DIALECT: Final = "dialect"
"""Key in ``Index.info`` naming the only dialect the index exists on (absent: every dialect)."""

metadata = MetaData()

_INTEGER: Final = Integer().with_variant(BigInteger(), "postgresql")
_TEXT: Final = Text().with_variant(Text(collation="C"), "postgresql")


def _check(expression: str) -> CheckConstraint:
    folded = " ".join(expression.split())
    return CheckConstraint(DialectCheck(folded) if needs_translation(folded) else folded)


def _json(name: str) -> CheckConstraint:
    return _check(f"json_valid({name})")


def _optional_json(name: str) -> CheckConstraint:
    return _check(f"{name} IS NULL OR json_valid({name})")


def _non_negative(name: str) -> CheckConstraint:
    return _check(f"{name} >= 0")


def _positive(name: str) -> CheckConstraint:
    return _check(f"{name} >= 1")


def _fk(target: str) -> ForeignKey:
    return ForeignKey(target, ondelete="RESTRICT")


def _text(name: str, *args: Any, nullable: bool = False, **kwargs: Any) -> Column[Any]:
    return Column(name, _TEXT, *args, nullable=nullable, **kwargs)


def _int(name: str, *args: Any, nullable: bool = False, **kwargs: Any) -> Column[Any]:
    return Column(name, _INTEGER, *args, nullable=nullable, **kwargs)


def _since(version: int) -> dict[str, int]:
    return {SINCE: version}


def _partial(condition: str) -> dict[str, Any]:
    return {"sqlite_where": text(condition), "postgresql_where": text(condition)}


# --------------------------------------------------------------------------- v1

migrations = Table(
    "migrations",
    metadata,
    _int("version", primary_key=True, autoincrement=False),
    _text("name", unique=True),
    _text("checksum"),
    _int("applied_at", _non_negative("applied_at")),
    info=_since(1),
)

jobs = Table(
    "jobs",
    metadata,
    _text("job_id", primary_key=True),
    _text("kind"),
    _text("trigger_json", _json("trigger_json")),
    _text("payload_json", _json("payload_json")),
    _text("authority_json", _json("authority_json")),
    _int("enabled", _check("enabled IN (0, 1)")),
    _int("revision", _positive("revision")),
    _int("max_attempts", _check("max_attempts BETWEEN 1 AND 32")),
    _int("created_at", _non_negative("created_at")),
    _int("updated_at", _non_negative("updated_at")),
    info=_since(1),
)

occurrences = Table(
    "occurrences",
    metadata,
    _text("occurrence_id", primary_key=True),
    _text("job_id", _fk("jobs.job_id")),
    _int("job_revision", _positive("job_revision")),
    _text("idempotency_key"),
    _text("trigger_key"),
    _int("scheduled_for", _non_negative("scheduled_for")),
    _int("available_at", _non_negative("available_at")),
    _text("status", _check("status IN ('queued', 'running', 'retry_wait', 'succeeded', 'dead_letter')")),
    _int("attempt", _non_negative("attempt"), server_default=text("0")),
    _int("max_attempts", _check("max_attempts BETWEEN 1 AND 32")),
    _int("fence", _non_negative("fence"), server_default=text("0")),
    _text("lease_owner", nullable=True),
    _int("lease_expires_at", nullable=True),
    _text("authority_json", _json("authority_json")),
    _text("payload_json", _json("payload_json")),
    _text("last_error_json", _optional_json("last_error_json"), nullable=True),
    _text("result_json", _optional_json("result_json"), nullable=True),
    _int("created_at", _non_negative("created_at")),
    _int("updated_at", _non_negative("updated_at")),
    _int("settled_at", nullable=True),
    _check("attempt <= max_attempts"),
    _check(
        "(status = 'running' AND lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL) OR "
        "(status <> 'running' AND lease_owner IS NULL AND lease_expires_at IS NULL)"
    ),
    _check(
        "(status IN ('succeeded', 'dead_letter') AND settled_at IS NOT NULL) OR "
        "(status NOT IN ('succeeded', 'dead_letter') AND settled_at IS NULL)"
    ),
    Index("scheduler_occurrences_idempotency", "idempotency_key", unique=True),
    Index(
        "scheduler_occurrences_claim",
        "status",
        "available_at",
        "lease_expires_at",
        "scheduled_for",
        "occurrence_id",
    ),
    Index("scheduler_occurrences_job", "job_id", "created_at", "occurrence_id"),
    info=_since(1),
)
OCCURRENCE_COLUMNS: Final = tuple(column.name for column in occurrences.c)
"""``occurrences``' column names in table order (rows read by position, rows written as values)."""

events = Table(
    "events",
    metadata,
    # ``INTEGER PRIMARY KEY AUTOINCREMENT`` without NOT NULL: table_info reports notnull = 0.
    _int("event_id", primary_key=True, nullable=True, autoincrement=True),
    _text("job_id", _fk("jobs.job_id")),
    _text("occurrence_id", _fk("occurrences.occurrence_id"), nullable=True),
    _text("event_type"),
    _int("occurred_at", _non_negative("occurred_at")),
    _text("owner_id", nullable=True),
    _int("fence", nullable=True),
    _text("data_json", _json("data_json")),
    sqlite_autoincrement=True,
    info=_since(1),
)
Index("scheduler_events_occurrence", events.c.occurrence_id, events.c.event_id.desc())
Index("scheduler_events_job", events.c.job_id, events.c.event_id.desc())


# --------------------------------------------------------------------------- PostgreSQL-only (v1)
#
# The claim path reads the same bounded probes on both dialects (scheduler/store/capabilities/claim_query.py),
# served by scheduler_occurrences_claim, except the expired-final-attempt sweep (seed: WHERE
# status = 'running' AND lease_expires_at <= :now ORDER BY lease_expires_at, occurrence_id
# LIMIT 100, run on every claim): on PostgreSQL the planner serves it from this partial index, an
# ordered walk of the running rows only (scheduler_occurrences_claim leads with status and
# available_at, so lease_expires_at would only filter the running rows). Only running rows are
# in it, so writes of queued rows never maintain it.


def _postgresql_only(index: Index) -> Index:
    index.info[DIALECT] = "postgresql"
    return index.ddl_if(dialect="postgresql")


_postgresql_only(
    Index(
        "scheduler_pg_occurrences_expired",
        occurrences.c.lease_expires_at,
        occurrences.c.occurrence_id,
        postgresql_where=text("status = 'running'"),
    )
)

# --------------------------------------------------------------------------- v2

authority_policies = Table(
    "scheduler_authority_policies",
    metadata,
    _text("principal_type"),
    _text("principal_id"),
    _int("revision", _positive("revision")),
    _int("enabled", _check("enabled IN (0, 1)")),
    _text("capabilities_json", _json("capabilities_json")),
    _int("window_ms", _check("window_ms BETWEEN 60000 AND 2678400000")),
    _int("max_runs", _check("max_runs BETWEEN 1 AND 1000000")),
    _int("max_units", _check("max_units BETWEEN 1 AND 1000000")),
    _int("created_at", _non_negative("created_at")),
    _int("updated_at", _non_negative("updated_at")),
    PrimaryKeyConstraint("principal_type", "principal_id"),
    info=_since(2),
)

authority_usage = Table(
    "scheduler_authority_usage",
    metadata,
    _text("principal_type"),
    _text("principal_id"),
    _int("policy_revision", _positive("policy_revision")),
    _int("window_started_at", _non_negative("window_started_at")),
    _int("runs", _check("runs BETWEEN 0 AND 1000000")),
    _int("units", _check("units BETWEEN 0 AND 1000000")),
    _int("updated_at", _non_negative("updated_at")),
    PrimaryKeyConstraint("principal_type", "principal_id", "policy_revision", "window_started_at"),
    info=_since(2),
)

authority_reservations = Table(
    "scheduler_authority_reservations",
    metadata,
    _text("occurrence_id", _fk("occurrences.occurrence_id"), primary_key=True),
    _text("job_id", _fk("jobs.job_id")),
    _text("principal_type"),
    _text("principal_id"),
    _int("policy_revision", _positive("policy_revision")),
    _int("window_started_at", _non_negative("window_started_at")),
    _int("units", _check("units BETWEEN 1 AND 1000000")),
    _text("status", _check("status IN ('reserved', 'succeeded', 'failed')")),
    _text("outcome_json", _optional_json("outcome_json"), nullable=True),
    _int("created_at", _non_negative("created_at")),
    _int("settled_at", nullable=True),
    _check(
        "(status = 'reserved' AND outcome_json IS NULL AND settled_at IS NULL) OR "
        "(status <> 'reserved' AND outcome_json IS NOT NULL AND settled_at IS NOT NULL)"
    ),
    Index(
        "scheduler_authority_reservations_principal",
        "principal_type",
        "principal_id",
        "policy_revision",
        "window_started_at",
    ),
    Index("scheduler_authority_reservations_status", "status", "created_at"),
    info=_since(2),
)

# --------------------------------------------------------------------------- v3

adjudications = Table(
    "scheduler_occurrence_adjudications",
    metadata,
    _text("occurrence_id", _fk("occurrences.occurrence_id"), primary_key=True),
    _text("job_id", _fk("jobs.job_id")),
    _text("request_id", unique=True),
    _text("decision", _check("decision IN ('confirmed_applied', 'confirmed_not_applied')")),
    _text("authority", _check("authority = 'local-operator'")),
    _text("evidence_digest"),
    _int("expected_attempt", _positive("expected_attempt")),
    _int("expected_fence", _positive("expected_fence")),
    _text("reason_digest"),
    _text("operator_digest"),
    _text("status", _check("status IN ('pending', 'applied')")),
    _int("created_at", _non_negative("created_at")),
    _int("applied_at", nullable=True),
    _int("retry_settled_at", nullable=True),
    _text("retry_outcome_json", _optional_json("retry_outcome_json"), nullable=True),
    _check("(status = 'pending' AND applied_at IS NULL) OR (status = 'applied' AND applied_at IS NOT NULL)"),
    _check(
        "(retry_settled_at IS NULL AND retry_outcome_json IS NULL) OR "
        "(status = 'applied' AND retry_settled_at IS NOT NULL AND retry_outcome_json IS NOT NULL)"
    ),
    Index("scheduler_adjudications_status", "status", "created_at", "occurrence_id"),
    info=_since(3),
)

# --------------------------------------------------------------------------- v4 (+ v5 column)

domain_migrations = Table(
    "scheduler_domain_migrations",
    metadata,
    _text("migration_id", primary_key=True),
    _text("manifest_digest", unique=True),
    _text("manifest_json", _json("manifest_json")),
    _text(
        "state",
        _check(
            "state IN ('prepared', 'applied', 'verified', 'retiring', 'retired', "
            "'rolling_back', 'rolled_back')"
        ),
    ),
    _int("entry_count", _check("entry_count BETWEEN 1 AND 1000")),
    _int("created_at", _non_negative("created_at")),
    _int("updated_at", _non_negative("updated_at")),
    _int("completed_at", nullable=True),
    _text("last_error_json", _optional_json("last_error_json"), nullable=True),
    _check(
        "(state IN ('retired', 'rolled_back') AND completed_at IS NOT NULL) OR "
        "(state NOT IN ('retired', 'rolled_back') AND completed_at IS NULL)"
    ),
    Index("scheduler_domain_migrations_state", "state", "updated_at", "migration_id"),
    info=_since(4),
)

_ENTRY_PROGRESS_CHECK = (
    "(state = 'prepared' AND target_action IS NULL "
    "AND target_applied_revision IS NULL AND target_applied_at IS NULL "
    "AND target_occurrence_count_before IS NULL "
    "AND target_execution_event_count_before IS NULL) "
    "OR "
    "(state <> 'prepared' AND state <> 'rolled_back' "
    "AND target_action IS NOT NULL AND target_applied_revision IS NOT NULL "
    "AND target_applied_at IS NOT NULL "
    "AND target_occurrence_count_before IS NOT NULL "
    "AND target_execution_event_count_before IS NOT NULL) "
    "OR "
    "(state = 'rolled_back')"
)
_ENTRY_BEFORE_CHECK = (
    "(target_action IN ('updated', 'reused') AND target_before_json IS NOT NULL) OR "
    "(target_action = 'created' AND target_before_json IS NULL) OR "
    "(target_action IS NULL AND target_before_json IS NULL)"
)

domain_migration_entries = Table(
    "scheduler_domain_migration_entries",
    metadata,
    _text("migration_id", _fk("scheduler_domain_migrations.migration_id")),
    _text("entry_id"),
    _text(
        "domain",
        _check("domain IN ('agenda', 'cowork-cron', 'routine', 'automation', 'loop-iteration')"),
    ),
    _text("source_id"),
    _text("source_scope_digest"),
    _text("source_digest"),
    _text("target_job_id"),
    _text("target_job_digest"),
    _text("rollback_strategy", _check("rollback_strategy IN ('restore', 'disable')")),
    _text(
        "state",
        _check(
            "state IN ('prepared', 'applied', 'verified', 'retiring', 'retired', "
            "'rollback_target_disabled', 'source_restored', 'rolled_back')"
        ),
    ),
    _text(
        "target_action",
        _check("target_action IS NULL OR target_action IN ('created', 'updated', 'reused')"),
        nullable=True,
    ),
    _text("target_before_json", _optional_json("target_before_json"), nullable=True),
    _int("target_applied_revision", _positive("target_applied_revision"), nullable=True),
    _int("target_applied_at", _non_negative("target_applied_at"), nullable=True),
    _int(
        "target_occurrence_count_before",
        _non_negative("target_occurrence_count_before"),
        nullable=True,
    ),
    _int(
        "target_execution_event_count_before",
        _non_negative("target_execution_event_count_before"),
        nullable=True,
    ),
    _int("target_rollback_revision", _positive("target_rollback_revision"), nullable=True),
    _text("retirement_token", nullable=True),
    _text("source_retirement_digest", nullable=True),
    _text("source_restored_digest", nullable=True),
    _int("created_at", _non_negative("created_at")),
    _int("updated_at", _non_negative("updated_at")),
    _text(
        "source_locator_json",
        _optional_json("source_locator_json"),
        nullable=True,
        info=_since(5),
    ),
    PrimaryKeyConstraint("migration_id", "entry_id"),
    UniqueConstraint("migration_id", "domain", "source_scope_digest", "source_id"),
    UniqueConstraint("migration_id", "target_job_id"),
    _check(_ENTRY_PROGRESS_CHECK),
    _check(_ENTRY_BEFORE_CHECK),
    _check("state NOT IN ('retiring', 'retired') OR retirement_token IS NOT NULL"),
    _check("state <> 'retired' OR source_retirement_digest IS NOT NULL"),
    Index(
        "scheduler_domain_migration_entries_state",
        "state",
        "updated_at",
        "migration_id",
        "entry_id",
    ),
    Index(
        "scheduler_domain_migration_active_source",
        "domain",
        "source_scope_digest",
        "source_id",
        unique=True,
        **_partial("state <> 'rolled_back'"),
    ),
    Index(
        "scheduler_domain_migration_active_target",
        "target_job_id",
        unique=True,
        **_partial("state <> 'rolled_back'"),
    ),
    info=_since(4),
)

# --------------------------------------------------------------------------- v6

_CONTROL_STATE_CHECK = (
    "(state = 'pause_requested' AND paused_at IS NULL "
    "AND resumed_at IS NULL AND terminal_at IS NULL) "
    "OR "
    "(state = 'paused' AND paused_at IS NOT NULL "
    "AND resumed_at IS NULL AND terminal_at IS NULL) "
    "OR "
    "(state = 'resumed' AND paused_at IS NOT NULL "
    "AND resumed_at IS NOT NULL AND terminal_at IS NULL) "
    "OR "
    "(state = 'terminal' AND terminal_at IS NOT NULL)"
)

occurrence_controls = Table(
    "scheduler_occurrence_controls",
    metadata,
    _text("occurrence_id", _fk("occurrences.occurrence_id"), primary_key=True),
    _text("capability_json", _json("capability_json")),
    _text(
        "capability_digest",
        _check("capability_digest GLOB 'sha256:[0-9a-f]*' AND length(capability_digest) = 71"),
    ),
    _text("state", _check("state IN ('pause_requested', 'paused', 'resumed', 'terminal')")),
    _int("revision", _positive("revision")),
    _text("pause_request_id"),
    _text("resume_request_id", nullable=True, unique=True),
    _int("expected_fence", _positive("expected_fence")),
    _text("checkpoint_json", _optional_json("checkpoint_json"), nullable=True),
    _int("requested_at", _non_negative("requested_at")),
    _int("paused_at", _non_negative("paused_at"), nullable=True),
    _int("resumed_at", _non_negative("resumed_at"), nullable=True),
    _int("terminal_at", _non_negative("terminal_at"), nullable=True),
    _int("updated_at", _non_negative("updated_at")),
    _check(_CONTROL_STATE_CHECK),
    Index("scheduler_occurrence_controls_pause_request", "pause_request_id", unique=True),
    Index("scheduler_occurrence_controls_state", "state", "updated_at", "occurrence_id"),
    info=_since(6),
)

occurrence_retries = Table(
    "scheduler_occurrence_retries",
    metadata,
    _text("occurrence_id", _fk("occurrences.occurrence_id")),
    _text("request_id", unique=True),
    _int("expected_fence", _positive("expected_fence")),
    _text("expected_error_code"),
    _int("created_at", _non_negative("created_at")),
    _int("claimed_at", _non_negative("claimed_at"), nullable=True),
    PrimaryKeyConstraint("occurrence_id", "request_id"),
    Index("scheduler_occurrence_retries_pending", "occurrence_id", "claimed_at", "expected_fence"),
    info=_since(6),
)

ALL_TABLES: Final = (
    migrations,
    jobs,
    occurrences,
    events,
    authority_policies,
    authority_usage,
    authority_reservations,
    adjudications,
    domain_migrations,
    domain_migration_entries,
    occurrence_controls,
    occurrence_retries,
)
"""Every table in creation order (``sqlite_sequence`` is SQLite's own, not described here)."""
