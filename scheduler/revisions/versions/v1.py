"""Scheduler schema v1: migrations, jobs, occurrences and events.

Revision ID: v1
Revises: (none)

One call to ``scheduler.revisions.upgrade_to``: step 1 of ``scheduler.schema.upgrade`` (one
copy of the SQL, shared with ``open_store``), skipped when the ``migrations`` table already
records it, printed as a guarded script in ``--sql`` mode.
"""

from __future__ import annotations

from typing import Any

from scheduler.revisions import refuse_downgrade, upgrade_to

revision = "v1"
down_revision = None
branch_labels = ("scheduler",)
depends_on = None


def upgrade(**arguments: Any) -> None:
    """Take the scheduler's tables to v1 (see ``scheduler.revisions`` for schema and clock)."""
    upgrade_to(1, **arguments)


def downgrade(**_: Any) -> None:
    """Refused: the scheduler schema is forward-only."""
    refuse_downgrade(1)
