"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

Scheduler revisions live in scheduler/revisions/versions, are named vN
(`alembic revision -m "..." --rev-id vN --version-path scheduler/revisions/versions`) and only run
step N of ``scheduler.schema.upgrade.UPGRADE_STEPS`` (add the step there first: one copy of the
SQL, shared with ``open_store`` and the offline scripts).
"""

from __future__ import annotations

from typing import Any

from scheduler.revisions import refuse_downgrade, upgrade_to
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade(**arguments: Any) -> None:
    """Run this revision's schema step (see ``scheduler.revisions`` for schema and clock)."""
    upgrade_to(int(revision.removeprefix("v")), **arguments)


def downgrade(**_: Any) -> None:
    """Refused: the scheduler schema is forward-only."""
    refuse_downgrade(int(revision.removeprefix("v")))
