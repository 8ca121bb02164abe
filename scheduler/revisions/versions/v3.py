"""Scheduler schema v3: occurrence adjudications.

Revision ID: v3
Revises: v2

One call to ``scheduler.revisions.upgrade_to``: step 3 of ``scheduler.schema.upgrade`` (one
copy of the SQL, shared with ``open_store``), skipped when the ``migrations`` table already
records it, printed as a guarded script in ``--sql`` mode.
"""

from __future__ import annotations

from typing import Any

from scheduler.revisions import refuse_downgrade, upgrade_to

revision = "v3"
down_revision = 'v2'
branch_labels = None
depends_on = None


def upgrade(**arguments: Any) -> None:
    """Take the scheduler's tables to v3 (see ``scheduler.revisions`` for schema and clock)."""
    upgrade_to(3, **arguments)


def downgrade(**_: Any) -> None:
    """Refused: the scheduler schema is forward-only."""
    refuse_downgrade(3)
