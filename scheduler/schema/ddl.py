"""The canonical migration texts, names, checksums and catalog fingerprints.

The SQL texts are byte-identical to the original implementation: their checksums are
stored in every database and their catalog is fingerprinted, so they are kept as text
here (the Core ``Table`` objects in ``tables.py`` describe the same schema).
"""

from __future__ import annotations

import hashlib
from typing import Final

SCHEDULER_APPLICATION_ID: Final = 0x4343534B  # "CCSK"
SCHEDULER_STORE_SCHEMA_VERSION: Final = 6

MIGRATION_V1_NAME: Final = "scheduler-kernel-v1"
MIGRATION_V1_SQL: Final = """
CREATE TABLE migrations (
  version     INTEGER PRIMARY KEY NOT NULL,
  name        TEXT NOT NULL UNIQUE,
  checksum    TEXT NOT NULL,
  applied_at  INTEGER NOT NULL CHECK (applied_at >= 0)
);

CREATE TABLE jobs (
  job_id          TEXT PRIMARY KEY NOT NULL,
  kind            TEXT NOT NULL,
  trigger_json    TEXT NOT NULL CHECK (json_valid(trigger_json)),
  payload_json    TEXT NOT NULL CHECK (json_valid(payload_json)),
  authority_json  TEXT NOT NULL CHECK (json_valid(authority_json)),
  enabled         INTEGER NOT NULL CHECK (enabled IN (0, 1)),
  revision        INTEGER NOT NULL CHECK (revision >= 1),
  max_attempts    INTEGER NOT NULL CHECK (max_attempts BETWEEN 1 AND 32),
  created_at      INTEGER NOT NULL CHECK (created_at >= 0),
  updated_at      INTEGER NOT NULL CHECK (updated_at >= 0)
);

CREATE TABLE occurrences (
  occurrence_id    TEXT PRIMARY KEY NOT NULL,
  job_id           TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE RESTRICT,
  job_revision     INTEGER NOT NULL CHECK (job_revision >= 1),
  idempotency_key  TEXT NOT NULL,
  trigger_key      TEXT NOT NULL,
  scheduled_for    INTEGER NOT NULL CHECK (scheduled_for >= 0),
  available_at     INTEGER NOT NULL CHECK (available_at >= 0),
  status           TEXT NOT NULL CHECK (
    status IN ('queued', 'running', 'retry_wait', 'succeeded', 'dead_letter')
  ),
  attempt           INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
  max_attempts      INTEGER NOT NULL CHECK (max_attempts BETWEEN 1 AND 32),
  fence             INTEGER NOT NULL DEFAULT 0 CHECK (fence >= 0),
  lease_owner       TEXT,
  lease_expires_at  INTEGER,
  authority_json    TEXT NOT NULL CHECK (json_valid(authority_json)),
  payload_json      TEXT NOT NULL CHECK (json_valid(payload_json)),
  last_error_json   TEXT CHECK (
    last_error_json IS NULL OR json_valid(last_error_json)
  ),
  result_json       TEXT CHECK (result_json IS NULL OR json_valid(result_json)),
  created_at        INTEGER NOT NULL CHECK (created_at >= 0),
  updated_at        INTEGER NOT NULL CHECK (updated_at >= 0),
  settled_at        INTEGER,
  CHECK (attempt <= max_attempts),
  CHECK (
    (status = 'running' AND lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
    OR
    (status <> 'running' AND lease_owner IS NULL AND lease_expires_at IS NULL)
  ),
  CHECK (
    (status IN ('succeeded', 'dead_letter') AND settled_at IS NOT NULL)
    OR
    (status NOT IN ('succeeded', 'dead_letter') AND settled_at IS NULL)
  )
);

CREATE UNIQUE INDEX scheduler_occurrences_idempotency
  ON occurrences(idempotency_key);
CREATE INDEX scheduler_occurrences_claim
  ON occurrences(status, available_at, lease_expires_at, scheduled_for, occurrence_id);
CREATE INDEX scheduler_occurrences_job
  ON occurrences(job_id, created_at, occurrence_id);

CREATE TABLE events (
  event_id       INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id         TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE RESTRICT,
  occurrence_id  TEXT REFERENCES occurrences(occurrence_id) ON DELETE RESTRICT,
  event_type     TEXT NOT NULL,
  occurred_at    INTEGER NOT NULL CHECK (occurred_at >= 0),
  owner_id       TEXT,
  fence          INTEGER,
  data_json      TEXT NOT NULL CHECK (json_valid(data_json))
);

CREATE INDEX scheduler_events_occurrence
  ON events(occurrence_id, event_id DESC);
CREATE INDEX scheduler_events_job
  ON events(job_id, event_id DESC);
"""

MIGRATION_V2_NAME: Final = "scheduler-kernel-authority-v2"
MIGRATION_V2_SQL: Final = """
CREATE TABLE scheduler_authority_policies (
  principal_type     TEXT NOT NULL,
  principal_id       TEXT NOT NULL,
  revision           INTEGER NOT NULL CHECK (revision >= 1),
  enabled            INTEGER NOT NULL CHECK (enabled IN (0, 1)),
  capabilities_json  TEXT NOT NULL CHECK (json_valid(capabilities_json)),
  window_ms          INTEGER NOT NULL CHECK (
    window_ms BETWEEN 60000 AND 2678400000
  ),
  max_runs           INTEGER NOT NULL CHECK (
    max_runs BETWEEN 1 AND 1000000
  ),
  max_units          INTEGER NOT NULL CHECK (
    max_units BETWEEN 1 AND 1000000
  ),
  created_at         INTEGER NOT NULL CHECK (created_at >= 0),
  updated_at         INTEGER NOT NULL CHECK (updated_at >= 0),
  PRIMARY KEY (principal_type, principal_id)
);

CREATE TABLE scheduler_authority_usage (
  principal_type     TEXT NOT NULL,
  principal_id       TEXT NOT NULL,
  policy_revision    INTEGER NOT NULL CHECK (policy_revision >= 1),
  window_started_at  INTEGER NOT NULL CHECK (window_started_at >= 0),
  runs               INTEGER NOT NULL CHECK (runs BETWEEN 0 AND 1000000),
  units              INTEGER NOT NULL CHECK (units BETWEEN 0 AND 1000000),
  updated_at         INTEGER NOT NULL CHECK (updated_at >= 0),
  PRIMARY KEY (
    principal_type,
    principal_id,
    policy_revision,
    window_started_at
  )
);

CREATE TABLE scheduler_authority_reservations (
  occurrence_id      TEXT PRIMARY KEY NOT NULL
                     REFERENCES occurrences(occurrence_id) ON DELETE RESTRICT,
  job_id             TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE RESTRICT,
  principal_type     TEXT NOT NULL,
  principal_id       TEXT NOT NULL,
  policy_revision    INTEGER NOT NULL CHECK (policy_revision >= 1),
  window_started_at  INTEGER NOT NULL CHECK (window_started_at >= 0),
  units              INTEGER NOT NULL CHECK (units BETWEEN 1 AND 1000000),
  status             TEXT NOT NULL CHECK (
    status IN ('reserved', 'succeeded', 'failed')
  ),
  outcome_json       TEXT CHECK (
    outcome_json IS NULL OR json_valid(outcome_json)
  ),
  created_at         INTEGER NOT NULL CHECK (created_at >= 0),
  settled_at         INTEGER,
  CHECK (
    (status = 'reserved' AND outcome_json IS NULL AND settled_at IS NULL)
    OR
    (status <> 'reserved' AND outcome_json IS NOT NULL AND settled_at IS NOT NULL)
  )
);

CREATE INDEX scheduler_authority_reservations_principal
  ON scheduler_authority_reservations
    (principal_type, principal_id, policy_revision, window_started_at);
CREATE INDEX scheduler_authority_reservations_status
  ON scheduler_authority_reservations(status, created_at);
"""

MIGRATION_V3_NAME: Final = "scheduler-kernel-adjudication-v3"
MIGRATION_V3_SQL: Final = """
CREATE TABLE scheduler_occurrence_adjudications (
  occurrence_id       TEXT PRIMARY KEY NOT NULL
                      REFERENCES occurrences(occurrence_id) ON DELETE RESTRICT,
  job_id              TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE RESTRICT,
  request_id          TEXT NOT NULL UNIQUE,
  decision            TEXT NOT NULL CHECK (
    decision IN ('confirmed_applied', 'confirmed_not_applied')
  ),
  authority           TEXT NOT NULL CHECK (authority = 'local-operator'),
  evidence_digest     TEXT NOT NULL,
  expected_attempt    INTEGER NOT NULL CHECK (expected_attempt >= 1),
  expected_fence      INTEGER NOT NULL CHECK (expected_fence >= 1),
  reason_digest       TEXT NOT NULL,
  operator_digest     TEXT NOT NULL,
  status              TEXT NOT NULL CHECK (status IN ('pending', 'applied')),
  created_at          INTEGER NOT NULL CHECK (created_at >= 0),
  applied_at          INTEGER,
  retry_settled_at    INTEGER,
  retry_outcome_json  TEXT CHECK (
    retry_outcome_json IS NULL OR json_valid(retry_outcome_json)
  ),
  CHECK (
    (status = 'pending' AND applied_at IS NULL)
    OR
    (status = 'applied' AND applied_at IS NOT NULL)
  ),
  CHECK (
    (retry_settled_at IS NULL AND retry_outcome_json IS NULL)
    OR
    (status = 'applied' AND retry_settled_at IS NOT NULL
      AND retry_outcome_json IS NOT NULL)
  )
);

CREATE INDEX scheduler_adjudications_status
  ON scheduler_occurrence_adjudications(status, created_at, occurrence_id);
"""

MIGRATION_V4_NAME: Final = "scheduler-kernel-domain-migration-v4"
MIGRATION_V4_SQL: Final = """
CREATE TABLE scheduler_domain_migrations (
  migration_id       TEXT PRIMARY KEY NOT NULL,
  manifest_digest    TEXT NOT NULL UNIQUE,
  manifest_json      TEXT NOT NULL CHECK (json_valid(manifest_json)),
  state              TEXT NOT NULL CHECK (
    state IN (
      'prepared', 'applied', 'verified', 'retiring', 'retired',
      'rolling_back', 'rolled_back'
    )
  ),
  entry_count        INTEGER NOT NULL CHECK (entry_count BETWEEN 1 AND 1000),
  created_at         INTEGER NOT NULL CHECK (created_at >= 0),
  updated_at         INTEGER NOT NULL CHECK (updated_at >= 0),
  completed_at       INTEGER,
  last_error_json    TEXT CHECK (
    last_error_json IS NULL OR json_valid(last_error_json)
  ),
  CHECK (
    (state IN ('retired', 'rolled_back') AND completed_at IS NOT NULL)
    OR
    (state NOT IN ('retired', 'rolled_back') AND completed_at IS NULL)
  )
);

CREATE TABLE scheduler_domain_migration_entries (
  migration_id                  TEXT NOT NULL
                                REFERENCES scheduler_domain_migrations(migration_id)
                                ON DELETE RESTRICT,
  entry_id                      TEXT NOT NULL,
  domain                        TEXT NOT NULL CHECK (
    domain IN ('agenda', 'cowork-cron', 'routine', 'automation', 'loop-iteration')
  ),
  source_id                     TEXT NOT NULL,
  source_scope_digest           TEXT NOT NULL,
  source_digest                 TEXT NOT NULL,
  target_job_id                 TEXT NOT NULL,
  target_job_digest             TEXT NOT NULL,
  rollback_strategy             TEXT NOT NULL CHECK (
    rollback_strategy IN ('restore', 'disable')
  ),
  state                         TEXT NOT NULL CHECK (
    state IN (
      'prepared', 'applied', 'verified', 'retiring', 'retired',
      'rollback_target_disabled', 'source_restored', 'rolled_back'
    )
  ),
  target_action                 TEXT CHECK (
    target_action IS NULL OR target_action IN ('created', 'updated', 'reused')
  ),
  target_before_json            TEXT CHECK (
    target_before_json IS NULL OR json_valid(target_before_json)
  ),
  target_applied_revision       INTEGER CHECK (target_applied_revision >= 1),
  target_applied_at             INTEGER CHECK (target_applied_at >= 0),
  target_occurrence_count_before INTEGER CHECK (
    target_occurrence_count_before >= 0
  ),
  target_execution_event_count_before INTEGER CHECK (
    target_execution_event_count_before >= 0
  ),
  target_rollback_revision      INTEGER CHECK (target_rollback_revision >= 1),
  retirement_token             TEXT,
  source_retirement_digest     TEXT,
  source_restored_digest       TEXT,
  created_at                    INTEGER NOT NULL CHECK (created_at >= 0),
  updated_at                    INTEGER NOT NULL CHECK (updated_at >= 0),
  PRIMARY KEY (migration_id, entry_id),
  UNIQUE (migration_id, domain, source_scope_digest, source_id),
  UNIQUE (migration_id, target_job_id),
  CHECK (
    (state = 'prepared' AND target_action IS NULL
      AND target_applied_revision IS NULL AND target_applied_at IS NULL
      AND target_occurrence_count_before IS NULL
      AND target_execution_event_count_before IS NULL)
    OR
    (state <> 'prepared' AND state <> 'rolled_back'
      AND target_action IS NOT NULL AND target_applied_revision IS NOT NULL
      AND target_applied_at IS NOT NULL
      AND target_occurrence_count_before IS NOT NULL
      AND target_execution_event_count_before IS NOT NULL)
    OR
    (state = 'rolled_back')
  ),
  CHECK (
    (target_action IN ('updated', 'reused') AND target_before_json IS NOT NULL)
    OR
    (target_action = 'created' AND target_before_json IS NULL)
    OR
    (target_action IS NULL AND target_before_json IS NULL)
  ),
  CHECK (
    state NOT IN ('retiring', 'retired')
    OR retirement_token IS NOT NULL
  ),
  CHECK (
    state <> 'retired'
    OR source_retirement_digest IS NOT NULL
  )
);

CREATE INDEX scheduler_domain_migrations_state
  ON scheduler_domain_migrations(state, updated_at, migration_id);
CREATE INDEX scheduler_domain_migration_entries_state
  ON scheduler_domain_migration_entries(state, updated_at, migration_id, entry_id);
CREATE UNIQUE INDEX scheduler_domain_migration_active_source
  ON scheduler_domain_migration_entries(domain, source_scope_digest, source_id)
  WHERE state <> 'rolled_back';
CREATE UNIQUE INDEX scheduler_domain_migration_active_target
  ON scheduler_domain_migration_entries(target_job_id)
  WHERE state <> 'rolled_back';
"""

MIGRATION_V5_NAME: Final = "scheduler-kernel-source-locator-v5"
MIGRATION_V5_SQL: Final = """
ALTER TABLE scheduler_domain_migration_entries
  ADD COLUMN source_locator_json TEXT CHECK (
    source_locator_json IS NULL OR json_valid(source_locator_json)
  );
"""

MIGRATION_V6_NAME: Final = "scheduler-kernel-runtime-control-v6"
MIGRATION_V6_SQL: Final = """
CREATE TABLE scheduler_occurrence_controls (
  occurrence_id       TEXT PRIMARY KEY NOT NULL
                      REFERENCES occurrences(occurrence_id) ON DELETE RESTRICT,
  capability_json     TEXT NOT NULL CHECK (json_valid(capability_json)),
  capability_digest   TEXT NOT NULL CHECK (
    capability_digest GLOB 'sha256:[0-9a-f]*'
    AND length(capability_digest) = 71
  ),
  state                TEXT NOT NULL CHECK (
    state IN ('pause_requested', 'paused', 'resumed', 'terminal')
  ),
  revision             INTEGER NOT NULL CHECK (revision >= 1),
  pause_request_id     TEXT NOT NULL,
  resume_request_id    TEXT UNIQUE,
  expected_fence       INTEGER NOT NULL CHECK (expected_fence >= 1),
  checkpoint_json      TEXT CHECK (
    checkpoint_json IS NULL OR json_valid(checkpoint_json)
  ),
  requested_at         INTEGER NOT NULL CHECK (requested_at >= 0),
  paused_at            INTEGER CHECK (paused_at >= 0),
  resumed_at           INTEGER CHECK (resumed_at >= 0),
  terminal_at          INTEGER CHECK (terminal_at >= 0),
  updated_at           INTEGER NOT NULL CHECK (updated_at >= 0),
  CHECK (
    (state = 'pause_requested' AND paused_at IS NULL
      AND resumed_at IS NULL AND terminal_at IS NULL)
    OR
    (state = 'paused' AND paused_at IS NOT NULL
      AND resumed_at IS NULL AND terminal_at IS NULL)
    OR
    (state = 'resumed' AND paused_at IS NOT NULL
      AND resumed_at IS NOT NULL AND terminal_at IS NULL)
    OR
    (state = 'terminal' AND terminal_at IS NOT NULL)
  )
);

CREATE UNIQUE INDEX scheduler_occurrence_controls_pause_request
  ON scheduler_occurrence_controls(pause_request_id);
CREATE INDEX scheduler_occurrence_controls_state
  ON scheduler_occurrence_controls(state, updated_at, occurrence_id);

CREATE TABLE scheduler_occurrence_retries (
  occurrence_id       TEXT NOT NULL
                      REFERENCES occurrences(occurrence_id) ON DELETE RESTRICT,
  request_id           TEXT NOT NULL UNIQUE,
  expected_fence       INTEGER NOT NULL CHECK (expected_fence >= 1),
  expected_error_code  TEXT NOT NULL,
  created_at           INTEGER NOT NULL CHECK (created_at >= 0),
  claimed_at           INTEGER CHECK (claimed_at >= 0),
  PRIMARY KEY (occurrence_id, request_id)
);

CREATE INDEX scheduler_occurrence_retries_pending
  ON scheduler_occurrence_retries(occurrence_id, claimed_at, expected_fence);
"""


def _checksum(sql: str, suffix: str = "") -> str:
    digest = hashlib.sha256(sql.strip().replace("\r\n", "\n").encode("utf-8"))
    digest.update(suffix.encode("utf-8"))
    return digest.hexdigest()


# v2 binds its authority backfill into the checksum, as the original does.
V2_BACKFILL_CHECKSUM_SUFFIX: Final = "\0scheduler-authority-v2-backfill-v1"

MIGRATION_V1_CHECKSUM: Final = _checksum(MIGRATION_V1_SQL)
MIGRATION_V2_CHECKSUM: Final = _checksum(MIGRATION_V2_SQL, V2_BACKFILL_CHECKSUM_SUFFIX)
MIGRATION_V3_CHECKSUM: Final = _checksum(MIGRATION_V3_SQL)
MIGRATION_V4_CHECKSUM: Final = _checksum(MIGRATION_V4_SQL)
MIGRATION_V5_CHECKSUM: Final = _checksum(MIGRATION_V5_SQL)
MIGRATION_V6_CHECKSUM: Final = _checksum(MIGRATION_V6_SQL)

SCHEMA_V1_FINGERPRINT: Final = "cf244f675ac7430683f67046b57524eb6c14baa45d6463ed3f704be898fec887"
SCHEMA_V2_FINGERPRINT: Final = "402c58d4b3b217699591528f9be6c1c7fe341650b843eb2d8d9d907779ff27b0"
SCHEMA_V3_FINGERPRINT: Final = "aac3733641bebb5a86aea3f9c421818201f5dde051da6b95b880d503a420047b"
SCHEMA_V4_FINGERPRINT: Final = "59762b9d5da862b857edb76021ed51d05a256133dce543a3fd7d7b0403c9c081"
SCHEMA_V5_FINGERPRINT: Final = "9619647628488fc4fdc79ad36b4b6632d8257f40c23245822a18941870c187ac"
SCHEMA_V6_FINGERPRINT: Final = "6abe5595ba3f772c9643440b27d18d5d40057c85523ecb3b4986b195d67787c2"

# PostgreSQL (API §8): sha256 of the pg_catalog description of a schema created by this project at
# version N (scheduler/schema/pg_catalog.py), computed on PostgreSQL 15.
SCHEMA_V1_PG_FINGERPRINT: Final = "22329f1759f17ce7067704c7fef5765bc0241705ef7eb5792e25699206bfe1c9"
SCHEMA_V2_PG_FINGERPRINT: Final = "93ce8b68eb69c863d838f2d5192e6f7d2aa783873991c2c24c4b10250afcc3b0"
SCHEMA_V3_PG_FINGERPRINT: Final = "67aba3d8700db85d81220e9e664bf2c7310a44c2efb0140a677530e839483a61"
SCHEMA_V4_PG_FINGERPRINT: Final = "3e95398efa4c2221596020c54bc0f723fe15e3769bb5437d4ffae884acb5ec18"
SCHEMA_V5_PG_FINGERPRINT: Final = "2f21af8ace0bffcdd62d27bf1ff275c83852310ded8019bab3703ffe3a73db88"
SCHEMA_V6_PG_FINGERPRINT: Final = "8b5bd792b68370d926fa478370500f012ab94cda21dc5ad4bd128870e7dac208"

MIGRATION_SQL: Final = {
    1: MIGRATION_V1_SQL,
    2: MIGRATION_V2_SQL,
    3: MIGRATION_V3_SQL,
    4: MIGRATION_V4_SQL,
    5: MIGRATION_V5_SQL,
    6: MIGRATION_V6_SQL,
}
MIGRATION_NAMES: Final = {
    1: MIGRATION_V1_NAME,
    2: MIGRATION_V2_NAME,
    3: MIGRATION_V3_NAME,
    4: MIGRATION_V4_NAME,
    5: MIGRATION_V5_NAME,
    6: MIGRATION_V6_NAME,
}
MIGRATION_CHECKSUMS: Final = {
    1: MIGRATION_V1_CHECKSUM,
    2: MIGRATION_V2_CHECKSUM,
    3: MIGRATION_V3_CHECKSUM,
    4: MIGRATION_V4_CHECKSUM,
    5: MIGRATION_V5_CHECKSUM,
    6: MIGRATION_V6_CHECKSUM,
}
SCHEMA_FINGERPRINTS: Final = {
    1: SCHEMA_V1_FINGERPRINT,
    2: SCHEMA_V2_FINGERPRINT,
    3: SCHEMA_V3_FINGERPRINT,
    4: SCHEMA_V4_FINGERPRINT,
    5: SCHEMA_V5_FINGERPRINT,
    6: SCHEMA_V6_FINGERPRINT,
}
PG_SCHEMA_FINGERPRINTS: Final = {
    1: SCHEMA_V1_PG_FINGERPRINT,
    2: SCHEMA_V2_PG_FINGERPRINT,
    3: SCHEMA_V3_PG_FINGERPRINT,
    4: SCHEMA_V4_PG_FINGERPRINT,
    5: SCHEMA_V5_PG_FINGERPRINT,
    6: SCHEMA_V6_PG_FINGERPRINT,
}
