"""Scheduler schema v1: migrations, jobs, occurrences and events.

Revision ID: v1
Revises: (none)

The SQL and the data steps live in ``scheduler.schema.upgrade`` (one copy, shared with
``open_store``); this revision only runs step 1. Afterwards ``PRAGMA user_version`` is 1.
"""

from __future__ import annotations

from alembic import op
from alembic.util import CommandError

from scheduler.schema.upgrade import apply_step, wall_clock_ms

revision = "v1"
down_revision = None
branch_labels = ("scheduler",)
depends_on = None


def upgrade(now: int | None = None, **_: object) -> None:
    """Create schema v1 in an empty database (``now``: epoch ms from ``-x now=``, else the wall clock)."""
    apply_step(op.get_bind(), 1, wall_clock_ms() if now is None else now)


def downgrade(**_: object) -> None:
    """Refused: the scheduler schema is forward-only."""
    raise CommandError("The scheduler schema is forward-only: v1 cannot be downgraded (restore a backup)")
