"""Scheduler schema v2: authority policies, usage and reservations, with the authority backfill.

Revision ID: v2
Revises: v1

The SQL and the data steps live in ``scheduler.schema.upgrade`` (one copy, shared with
``open_store``); this revision only runs step 2. Afterwards ``PRAGMA user_version`` is 2.
"""

from __future__ import annotations

from alembic import op
from alembic.util import CommandError

from scheduler.schema.upgrade import apply_step, wall_clock_ms

revision = "v2"
down_revision = "v1"
branch_labels = None
depends_on = None


def upgrade(now: int | None = None, **_: object) -> None:
    """Take the v1 database to v2 (``now``: epoch ms from ``-x now=``, else the wall clock)."""
    apply_step(op.get_bind(), 2, wall_clock_ms() if now is None else now)


def downgrade(**_: object) -> None:
    """Refused: the scheduler schema is forward-only."""
    raise CommandError("The scheduler schema is forward-only: v2 cannot be downgraded (restore a backup)")
