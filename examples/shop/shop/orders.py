"""Placing an order: the order row, the shop's own event row and the receipt e-mail's occurrence,
in ONE transaction of the shop's (the transactional outbox); and the worker that sends receipts.
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.orm import Session

import scheduler
from scheduler import SchedulerStore
from shop.models import Order, ShopEvent
from shop.settings import Settings

RECEIPT_JOB = "send-receipt"
AUTHORITY = {"principal": {"type": "service", "id": "shop"}, "requestedCapabilities": ["email.send"]}


def outbox(session: Session, settings: Settings) -> SchedulerStore:
    """The scheduler bound to the session's transaction (its schema where the layout has one)."""
    connection = session.connection()
    if settings.layout in ("attached", "postgresql"):
        return SchedulerStore.on_connection(connection, schema=settings.schema)
    return SchedulerStore.on_connection(connection)


def ensure_receipt_job(settings: Settings) -> None:
    """Create the ``send-receipt`` job once (at deployment, after ``alembic upgrade heads``)."""
    options = settings.store_options()
    with scheduler.open_store(options.pop("target"), **options) as store:
        if store.get_job(RECEIPT_JOB) is None:
            store.create_job(id=RECEIPT_JOB, kind="email", authority=AUTHORITY)


def place_order(engine: Engine, settings: Settings, order_id: str, total_cents: int) -> None:
    """Insert the order and enqueue its receipt atomically (dedicated layout: see below)."""
    if settings.layout == "dedicated":
        place_order_then_enqueue(engine, settings, order_id, total_cents)
        return
    with Session(engine) as session, session.begin():
        scheduler.mark_writer(session)  # SQLite: BEGIN IMMEDIATE (a no-op on PostgreSQL)
        session.add(Order(id=order_id, total_cents=total_cents))
        session.add(ShopEvent(order_id=order_id, kind="placed"))
        session.flush()
        store = outbox(session, settings)
        store.enqueue_occurrence_once_per_trigger(  # one receipt per order, due now
            job_id=RECEIPT_JOB,
            scheduled_for=store.clock(),
            trigger_key=f"order:{order_id}",
            payload={"orderId": order_id},
        )


def place_order_then_enqueue(engine: Engine, settings: Settings, order_id: str, total_cents: int) -> None:
    """Dedicated file: two commits. The trigger key (once per trigger: whatever the time of the
    retry) makes a retry after a crash between them enqueue exactly once; a crash before the second
    leaves an order without one."""
    with Session(engine) as session, session.begin():
        scheduler.mark_writer(session)
        session.add(Order(id=order_id, total_cents=total_cents))
        session.add(ShopEvent(order_id=order_id, kind="placed"))
    options = settings.store_options()
    with scheduler.open_store(options.pop("target"), **options) as store:
        store.enqueue_occurrence_once_per_trigger(
            job_id=RECEIPT_JOB,
            scheduled_for=store.clock(),
            trigger_key=f"order:{order_id}",
            payload={"orderId": order_id},
        )
