"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

Scheduler revisions are named vN (`alembic revision -m "..." --rev-id vN`) and only run step N of
``scheduler.schema.upgrade.UPGRADE_STEPS`` (add the step there first: one copy of the SQL, shared
with ``open_store``). Afterwards ``PRAGMA user_version`` is N.
"""

from __future__ import annotations

from alembic import op
from alembic.util import CommandError

from scheduler.schema.upgrade import apply_step, wall_clock_ms
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade(now: int | None = None, **_: object) -> None:
    """Run this revision's schema step (``now``: epoch ms from ``-x now=``, else the wall clock)."""
    apply_step(op.get_bind(), int(revision.removeprefix("v")), wall_clock_ms() if now is None else now)


def downgrade(**_: object) -> None:
    """Refused: the scheduler schema is forward-only."""
    raise CommandError(f"The scheduler schema is forward-only: {revision} cannot be downgraded (restore a backup)")
