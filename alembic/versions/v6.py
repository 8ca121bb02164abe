"""Scheduler schema v6: runtime control: occurrence controls and retries.

Revision ID: v6
Revises: v5

The SQL and the data steps live in ``scheduler.schema.upgrade`` (one copy, shared with
``open_store``); this revision only runs step 6. Afterwards ``PRAGMA user_version`` is 6.
"""

from __future__ import annotations

from alembic import op
from alembic.util import CommandError

from scheduler.schema.upgrade import apply_step, wall_clock_ms

revision = "v6"
down_revision = "v5"
branch_labels = None
depends_on = None


def upgrade(now: int | None = None, **_: object) -> None:
    """Take the v5 database to v6 (``now``: epoch ms from ``-x now=``, else the wall clock)."""
    apply_step(op.get_bind(), 6, wall_clock_ms() if now is None else now)


def downgrade(**_: object) -> None:
    """Refused: the scheduler schema is forward-only."""
    raise CommandError("The scheduler schema is forward-only: v6 cannot be downgraded (restore a backup)")
