"""Scheduler schema v6: runtime control: occurrence controls and retries.

Revision ID: v6
Revises: v5

One call to ``scheduler.revisions.upgrade_to``: step 6 of ``scheduler.schema.upgrade`` (one
copy of the SQL, shared with ``open_store``), skipped when the ``migrations`` table already
records it, printed as a guarded script in ``--sql`` mode.
"""

from __future__ import annotations

from typing import Any

from scheduler.revisions import refuse_downgrade, upgrade_to

revision = "v6"
down_revision = 'v5'
branch_labels = None
depends_on = None


def upgrade(**arguments: Any) -> None:
    """Take the scheduler's tables to v6 (see ``scheduler.revisions`` for schema and clock)."""
    upgrade_to(6, **arguments)


def downgrade(**_: Any) -> None:
    """Refused: the scheduler schema is forward-only."""
    refuse_downgrade(6)
