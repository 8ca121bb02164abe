"""A Flask + Flask-SQLAlchemy shop: placing an order writes its row and defers its receipt in the
request's transaction.

Run it (from this directory; SQLite by default, or a PostgreSQL URL):

    export SHOP_DATABASE_URL=sqlite:///$PWD/shop.sqlite         # postgresql+psycopg://app@db/shop
    flask --app app run                                          # the web app
    scheduler worker app:tasks                                   # a worker (as many as you like)

    curl -X POST localhost:5000/orders -H 'content-type: application/json' \\
         -d '{"id": "o-1", "total_cents": 1250}'
    curl localhost:5000/runs/<receipt_run from the answer>
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, abort, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from scheduler import Tasks

DATABASE_URL = os.environ.get("SHOP_DATABASE_URL", f"sqlite:///{os.path.abspath('shop.sqlite')}")


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "orders"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    total_cents: Mapped[int] = mapped_column(Integer)


app = Flask(__name__)
app.config["SQLALCHEMY_DATABASE_URI"] = DATABASE_URL
db.init_app(app)

# The scheduler's tables live in the same database: beside ours in the SQLite file (a shared
# file: exclusive=False), in their own schema "scheduler" on PostgreSQL.
tasks = Tasks(
    DATABASE_URL,
    exclusive=not DATABASE_URL.startswith("sqlite"),
    principal={"type": "service", "id": "shop"},
)


@tasks.task(name="shop.send_receipt", queue="emails", max_attempts=5)
def send_receipt(order_id: str) -> dict[str, str]:
    # Your code: render and send the mail. An exception is retried with backoff (5 attempts).
    return {"sent": f"receipt for {order_id}"}


with app.app_context():
    db.create_all()  # your migrations would do this
# Creates the scheduler's tables if needed and registers the tasks, before any request defers
# inside its transaction (on SQLite that transaction holds the one write lock).
tasks.register()


@app.post("/orders")
def place_order() -> tuple[dict[str, Any], int]:
    data = request.get_json()
    db.session.add(Order(id=data["id"], total_cents=data["total_cents"]))
    db.session.flush()
    # In the request's transaction: the run exists if and only if the order is committed.
    run = send_receipt.defer(order_id=data["id"], connection=db.session.connection())
    if data["total_cents"] <= 0:  # a step after the defer fails: nothing of this request remains
        db.session.rollback()
        return {"error": "payment declined"}, 402
    db.session.commit()
    return {"order": data["id"], "receipt_run": run.id}, 200


@app.get("/orders")
def list_orders() -> list[str]:
    return list(db.session.scalars(select(Order.id).order_by(Order.id)))


@app.get("/runs/<run_id>")
def show_run(run_id: str) -> dict[str, Any]:
    run = tasks.get(run_id)
    if run is None:
        abort(404)
    return {"id": run.id, "task": run.task, "status": run.status, "value": run.value, "error": run.error}
