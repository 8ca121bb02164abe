"""The shop's ORM models: orders and its own ``events`` log.

In the attached and PostgreSQL layouts the shop's ``events`` table sits in the same database as
the scheduler's ``events`` table, in another schema; the scheduler never reads or writes it. In
a shared SQLite file both would be ``main.events``, so there the shop calls it ``shop_events``.
"""

from __future__ import annotations

import os

from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def events_table_name() -> str:
    return "shop_events" if os.environ.get("SHOP_LAYOUT", "shared") == "shared" else "events"


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    total_cents: Mapped[int] = mapped_column(Integer)


class ShopEvent(Base):
    __tablename__ = events_table_name()
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    order_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
