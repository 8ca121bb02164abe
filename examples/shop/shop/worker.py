"""The shop's worker: sends the receipt of each order (``python -m shop.worker``).

It opens the scheduler's tables where the layout keeps them (``Settings.store_options``) and runs
``scheduler.worker.Worker``; ``--until-idle`` runs what is due now and exits (tests, cron).
"""

from __future__ import annotations

import sys
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

import scheduler
from scheduler.worker import PermanentError, Worker
from shop.models import Order, ShopEvent
from shop.settings import Settings


def make_send_receipt(settings: Settings) -> Any:
    engine = settings.engine()

    def send_receipt(occurrence: Any, ctx: Any) -> dict[str, Any]:
        order_id = occurrence.payload["orderId"]
        with Session(engine) as session, session.begin():
            scheduler.mark_writer(session)
            order = session.scalar(select(Order).where(Order.id == order_id))
            if order is None:  # only possible in the dedicated layout's two-commit window
                raise PermanentError(f"order {order_id} does not exist", code="ORDER_MISSING")
            session.add(ShopEvent(order_id=order_id, kind="receipt_sent"))
            total_cents = order.total_cents
        return {"sentTo": f"customer-of-{order_id}", "totalCents": total_cents}

    return send_receipt


def main(argv: list[str]) -> int:
    settings = Settings.from_environment()
    options = settings.store_options()
    with scheduler.open_store(options.pop("target"), **options) as store:
        worker = Worker(store, {"email": make_send_receipt(settings)}, periodic=False)
        if "--until-idle" in argv:
            print(worker.run_until_idle())
        else:
            worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
