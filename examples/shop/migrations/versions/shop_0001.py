"""The shop's tables: orders and its own event log.

Revision ID: shop_0001
Revises: (none)
"""

import sqlalchemy as sa
from alembic import op
from shop.models import events_table_name

revision = "shop_0001"
down_revision = None
branch_labels = ("shop",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("total_cents", sa.Integer, nullable=False),
    )
    op.create_table(
        events_table_name(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("order_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
    )


def downgrade() -> None:
    op.drop_table(events_table_name())
    op.drop_table("orders")
