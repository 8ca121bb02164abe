"""The web outbox under load: request threads enqueue inside their own ORM transactions while
worker processes claim and settle (tests/test_outbox.py).

``run_outbox_load`` drives ``threads`` request threads over ``requests`` orders in total; every
tenth order raises after the enqueue, so its transaction rolls back. ``workers`` processes run
:func:`worker_main` on the same store until told to stop and the queue is empty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from scheduler import SchedulerStore, open_store

JOB_ID = "send-receipt"
AUTHORITY = {"principal": {"type": "service", "id": "shop"}, "requestedCapabilities": ["email.send"]}
ROLLBACK_EVERY = 10
MAX_WORKER_FAILURES = 20


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    total_cents: Mapped[int] = mapped_column(Integer)


class Rollback(Exception):
    """Raised inside a request after its enqueue: the whole transaction must roll back."""


@dataclass
class LoadResult:
    committed: set[str] = field(default_factory=set)
    rolled_back: set[str] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)


Request = Callable[[], AbstractContextManager[tuple[Session, SchedulerStore]]]


def place_order(request: Request, order_id: str, result: LoadResult, lock: threading.Lock) -> None:
    try:
        with request() as (session, store):
            session.get(Order, order_id)  # a read first, as a real request does
            session.add(Order(id=order_id, total_cents=100))
            session.flush()
            store.enqueue_occurrence(
                job_id=JOB_ID, scheduled_for=0, trigger_key=f"order:{order_id}", payload={"orderId": order_id}
            )
            if int(order_id.rsplit("-", 1)[1]) % ROLLBACK_EVERY == 0:
                raise Rollback(order_id)
        with lock:
            result.committed.add(order_id)
    except Rollback:
        with lock:
            result.rolled_back.add(order_id)
    except Exception as error:
        with lock:
            result.failures.append(f"{order_id}: {type(error).__name__}: {error}")


def run_outbox_load(request: Request, *, threads: int, requests: int) -> LoadResult:
    result = LoadResult()
    lock = threading.Lock()

    def serve(thread_index: int) -> None:
        for number in range(thread_index, requests, threads):
            place_order(request, f"order-{number}", result, lock)

    pool = [threading.Thread(target=serve, args=(index,)) for index in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return result


def start_workers(
    count: int, store_arguments: dict[str, Any], stop_file: Path
) -> list[subprocess.Popen[str]]:
    """``count`` processes draining the queue (see :func:`worker_main`)."""
    spec = json.dumps({"store": store_arguments, "stop": str(stop_file)})
    code = "import sys, outbox_support; outbox_support.worker_main(sys.argv[1])"
    tests = str(Path(__file__).resolve().parent)
    return [
        subprocess.Popen(
            [sys.executable, "-c", code, spec],
            cwd=tests,
            env={**os.environ, "PYTHONPATH": tests},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]


def stop_workers(
    workers: list[subprocess.Popen[str]], stop_file: Path, timeout: float = 120
) -> list[dict[str, Any]]:
    stop_file.write_text("stop")
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=timeout)
        assert worker.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def worker_main(spec_json: str) -> None:
    """Claim and settle until the stop file exists and nothing is left; print a JSON report."""
    spec = json.loads(spec_json)
    arguments = dict(spec["store"])
    target = arguments.pop("target")
    stop = Path(spec["stop"])
    settled, failures = 0, []
    with open_store(target, busy_timeout_ms=60_000, **arguments) as store:
        while True:
            try:
                occurrence = store.claim_next(owner_id="worker", lease_ms=60_000)
            except Exception as error:
                failures.append(f"claim: {error}")
                if len(failures) >= MAX_WORKER_FAILURES:
                    break  # report instead of spinning on a persistent failure
                continue
            if occurrence is None:
                if stop.exists():
                    break
                time.sleep(0.005)
                continue
            try:
                store.settle(
                    occurrence_id=occurrence.id,
                    owner_id="worker",
                    fence=occurrence.fence,
                    outcome="succeeded",
                )
                settled += 1
            except Exception as error:
                failures.append(f"settle: {error}")
    print(json.dumps({"settled": settled, "failures": failures}))


def occurrences_by_order(store: SchedulerStore, order_ids: Iterator[str] | set[str]) -> dict[str, int]:
    """How many occurrences each order has (trigger key ``order:<id>``)."""
    return {
        order_id: len(
            store.list_occurrences_by_trigger(job_id=JOB_ID, trigger_key=f"order:{order_id}", limit=5)
        )
        for order_id in order_ids
    }


def committed_orders(session: Session) -> set[str]:
    return set(session.scalars(select(Order.id)))
