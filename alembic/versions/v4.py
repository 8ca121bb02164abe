"""Scheduler schema v4: the domain-migration journal.

Revision ID: v4
Revises: v3

The SQL and the data steps live in ``scheduler.schema.upgrade`` (one copy, shared with
``open_store``); this revision only runs step 4. Afterwards ``PRAGMA user_version`` is 4.
"""

from __future__ import annotations

from alembic import op
from alembic.util import CommandError

from scheduler.schema.upgrade import apply_step, wall_clock_ms

revision = "v4"
down_revision = "v3"
branch_labels = None
depends_on = None


def upgrade(now: int | None = None, **_: object) -> None:
    """Take the v3 database to v4 (``now``: epoch ms from ``-x now=``, else the wall clock)."""
    apply_step(op.get_bind(), 4, wall_clock_ms() if now is None else now)


def downgrade(**_: object) -> None:
    """Refused: the scheduler schema is forward-only."""
    raise CommandError("The scheduler schema is forward-only: v4 cannot be downgraded (restore a backup)")
