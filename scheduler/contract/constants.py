"""Constants shared by every layer (CONTRACT.md, seed 000)."""

from __future__ import annotations

from typing import Final

QUEUED: Final = "queued"
RUNNING: Final = "running"
RETRY_WAIT: Final = "retry_wait"
SUCCEEDED: Final = "succeeded"
DEAD_LETTER: Final = "dead_letter"
OCCURRENCE_STATUSES: Final = (QUEUED, RUNNING, RETRY_WAIT, SUCCEEDED, DEAD_LETTER)
TERMINAL_STATUSES: Final = frozenset({SUCCEEDED, DEAD_LETTER})
CANCELLED_ERROR_CODE: Final = "CANCELLED"
"""``lastError.code`` of an occurrence dead-lettered by ``cancel_occurrence`` (API §12)."""
MAX_CANCEL_REASON_CHARS: Final = 2_000
"""The longest ``reason`` ``cancel_occurrence`` accepts (characters, as a worker's error message)."""

CONTRACT_VERSION: Final = 1
AUTHORITY_ENVELOPE_VERSION: Final = 1
RUNTIME_CONTROL_SCHEMA_VERSION: Final = 1

MAX_SAFE_INTEGER: Final = 2**53 - 1
DEFAULT_MAX_ATTEMPTS: Final = 3
MAX_JOB_ATTEMPTS: Final = 32
DEFAULT_HISTORY_LIMIT: Final = 50
MAX_HISTORY_LIMIT: Final = 200
MAX_JSON_BYTES: Final = 1_048_576
MAX_JSON_DEPTH: Final = 64

PAUSE_RESUME_NONE: Final = "none"
PAUSE_RESUME_CHECKPOINT_V1: Final = "checkpoint_v1"
RUNTIME_PAUSE_RESUME_MODES: Final = (PAUSE_RESUME_NONE, PAUSE_RESUME_CHECKPOINT_V1)
SAFE_POINT_BEFORE_EXECUTE: Final = "before_execute"
SAFE_POINT_ADAPTER_CHECKPOINT: Final = "adapter_checkpoint"
RUNTIME_CONTROL_SAFE_POINTS: Final = (SAFE_POINT_BEFORE_EXECUTE, SAFE_POINT_ADAPTER_CHECKPOINT)

# Store-level limits (seed 000).
DEFAULT_BUSY_TIMEOUT_MS: Final = 5_000
MAX_BUSY_TIMEOUT_MS: Final = 60_000
MAX_LEASE_MS: Final = 24 * 60 * 60 * 1_000
MIN_AUTHORITY_WINDOW_MS: Final = 60_000
MAX_AUTHORITY_WINDOW_MS: Final = 31 * 24 * 60 * 60 * 1_000
MAX_AUTHORITY_BUDGET: Final = 1_000_000
DEFAULT_AUTHORITY_WINDOW_MS: Final = 24 * 60 * 60 * 1_000
DEFAULT_AUTHORITY_MAX_RUNS: Final = 100_000
DEFAULT_AUTHORITY_MAX_UNITS: Final = 100_000
MAX_RUNTIME_CHECKPOINT_BYTES: Final = 64 * 1024
MAX_RUNTIME_CONTROL_OCCURRENCES: Final = 200
RUNTIME_CONTROL_OCCURRENCE_STATUSES: Final = ("running", "pause_requested", "paused")
RUNTIME_CONTROL_JOB_KINDS: Final = (
    "agenda",
    "automation",
    "automation-event",
    "cowork-cron",
    "loop-iteration",
    "routine",
)
SCHEDULER_ADJUDICATION_AUTHORITY: Final = "local-operator"
CONFIRMED_APPLIED: Final = "confirmed_applied"
CONFIRMED_NOT_APPLIED: Final = "confirmed_not_applied"
SCHEDULER_ADJUDICATION_DECISIONS: Final = (CONFIRMED_APPLIED, CONFIRMED_NOT_APPLIED)
SCHEDULER_MIGRATION_DOMAINS: Final = ("agenda", "cowork-cron", "routine", "automation", "loop-iteration")
SCHEDULER_MIGRATION_STATES: Final = (
    "prepared",
    "applied",
    "verified",
    "retiring",
    "retired",
    "rolling_back",
    "rolled_back",
)
