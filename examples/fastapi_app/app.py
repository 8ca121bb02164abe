"""A FastAPI shop: placing an order writes its row and defers its receipt in ONE transaction.

Run it (from this directory; SQLite by default, or a PostgreSQL URL):

    export SHOP_DATABASE_URL=sqlite+aiosqlite:///shop.sqlite     # postgresql+asyncpg://app@db/shop
    uvicorn app:app                                               # the web app (dashboard: /scheduler/)
    scheduler worker app:tasks                                    # a worker (as many as you like)

    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"id": "o-1", "total_cents": 1250}'
    curl localhost:8000/runs/<receipt_run from the answer>
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import Integer, String, event, select
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from scheduler import Tasks
from scheduler.dashboard import create_app

DATABASE_URL = os.environ.get("SHOP_DATABASE_URL", "sqlite+aiosqlite:///shop.sqlite")

engine = create_async_engine(DATABASE_URL)
Session = async_sessionmaker(engine, expire_on_commit=False)

# The scheduler's tables live in the same database: beside ours in the SQLite file (a shared
# file: exclusive=False), in their own schema "scheduler" on PostgreSQL.
if engine.dialect.name == "sqlite":

    @event.listens_for(engine.sync_engine, "connect")
    def _foreign_keys_on(connection: Any, _record: Any) -> None:
        # SQLite checks foreign keys only when asked; the scheduler's tables need it (and yours).
        cursor = connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()


tasks = Tasks(
    engine,
    exclusive=engine.dialect.name != "sqlite",
    principal={"type": "service", "id": "shop"},
)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    total_cents: Mapped[int] = mapped_column(Integer)


@tasks.task(name="shop.send_receipt", queue="emails", max_attempts=5)
def send_receipt(order_id: str) -> dict[str, str]:
    # Your code: render and send the mail. An exception is retried with backoff (5 attempts).
    return {"sent": f"receipt for {order_id}"}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with engine.begin() as connection:  # your migrations would do this
        await connection.run_sync(Base.metadata.create_all)
    # Creates the scheduler's tables if needed and registers the tasks, before any request defers
    # inside its transaction (on SQLite that transaction holds the one write lock).
    await asyncio.to_thread(tasks.register)
    yield
    await tasks.aclose()
    await engine.dispose()


app = FastAPI(title="shop", lifespan=lifespan)

# The operators' dashboard (pip install "scheduler-kernel[dashboard]"), at /scheduler/.
app.mount("/scheduler", create_app(tasks))


class NewOrder(BaseModel):
    id: str
    total_cents: int


@app.post("/orders")
async def place_order(order: NewOrder) -> dict[str, Any]:
    async with Session() as session, session.begin():  # ONE transaction: the order and its receipt
        session.add(Order(id=order.id, total_cents=order.total_cents))
        await session.flush()
        run = await send_receipt.defer_async(order_id=order.id, connection=await session.connection())
        if order.total_cents <= 0:  # a step after the defer fails: nothing of this request remains
            raise HTTPException(status_code=402, detail="payment declined")
    return {"order": order.id, "receipt_run": run.id}


@app.get("/orders")
async def list_orders() -> list[str]:
    async with Session() as session:
        return list(await session.scalars(select(Order.id).order_by(Order.id)))


@app.get("/runs/{run_id}")
async def show_run(run_id: str) -> dict[str, Any]:
    run = await tasks.get_async(run_id)
    if run is None:
        raise HTTPException(status_code=404, detail="no such run")
    return {"id": run.id, "task": run.task, "status": run.status, "value": run.value, "error": run.error}
