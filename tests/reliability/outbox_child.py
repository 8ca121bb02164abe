"""A shop process for the outbox kill test: orders + their receipt occurrences, one transaction each.

Run as ``python -m tests.reliability.outbox_child SPEC_JSON`` (``SPEC``: layout, database paths or
URL, first order number). It prints ``{"ready": true}`` once set up, then for each order
``{"committing": n}`` right before COMMIT and ``{"committed": n}`` after it, until killed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from sqlalchemy import Engine, Integer, String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from scheduler import SchedulerStore, mark_writer, sqlite_engine

JOB_ID = "send-receipt"
AUTHORITY = {"principal": {"type": "service", "id": "shop"}, "requestedCapabilities": ["email.send"]}


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    note: Mapped[str] = mapped_column(String(64))


def engine_for(spec: dict[str, Any]) -> Engine:
    layout = spec["layout"]
    if layout == "postgresql":
        return create_engine(spec["url"])
    attach = {spec["schema"]: spec["kernel"]} if layout.startswith("attached") else None
    journal = "delete" if layout == "attached-rollback" else "wal"
    return sqlite_engine(spec["app"], attach=attach, journal_mode=journal, busy_timeout_ms=10_000)


def outbox(session: Session, spec: dict[str, Any]) -> SchedulerStore:
    return SchedulerStore.on_connection(session.connection(), schema=spec.get("schema") or "main")


def say(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    engine = engine_for(spec)
    number = int(spec["first"])
    say({"ready": True})
    while True:
        with Session(engine) as session:
            with session.begin():
                mark_writer(session)
                session.add(Order(id=number, note="placed"))
                session.flush()
                outbox(session, spec).enqueue_occurrence(
                    job_id=JOB_ID, scheduled_for=0, trigger_key=f"order:{number}", payload={"order": number}
                )
                say({"committing": number})
            say({"committed": number})
        number += 1


if __name__ == "__main__":
    main(sys.argv[1])
