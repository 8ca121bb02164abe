"""Scheduler schema v5: the source locator column of domain-migration entries.

Revision ID: v5
Revises: v4

The SQL and the data steps live in ``scheduler.schema.upgrade`` (one copy, shared with
``open_store``); this revision only runs step 5. Afterwards ``PRAGMA user_version`` is 5.
"""

from __future__ import annotations

from alembic import op
from alembic.util import CommandError

from scheduler.schema.upgrade import apply_step, wall_clock_ms

revision = "v5"
down_revision = "v4"
branch_labels = None
depends_on = None


def upgrade(now: int | None = None, **_: object) -> None:
    """Take the v4 database to v5 (``now``: epoch ms from ``-x now=``, else the wall clock)."""
    apply_step(op.get_bind(), 5, wall_clock_ms() if now is None else now)


def downgrade(**_: object) -> None:
    """Refused: the scheduler schema is forward-only."""
    raise CommandError("The scheduler schema is forward-only: v5 cannot be downgraded (restore a backup)")
