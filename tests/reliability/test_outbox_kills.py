"""What is atomic in each embedding layout, measured: a shop process is SIGKILLed while it commits an
order row and that order's enqueued occurrence in ONE transaction (tests/reliability/outbox_child.py).

After each kill the database is reopened the way the application would reopen it, and every
order is compared with the occurrences: an order without its occurrence, or an occurrence without
its order, is a *split* outcome. Every order the child reported committed must be there.

* shared SQLite file (WAL): one file, one commit: zero splits required;
* attached SQLite database in rollback-journal mode: SQLite commits both files through a
  super-journal: zero splits required;
* attached SQLite database in WAL mode: SQLite does not make a transaction atomic across attached
  WAL files; the splits are measured and reported (docs/embedding.md), not required to be zero;
* PostgreSQL schema (the shop's ``orders`` in ``public``): one transaction: zero splits required.

Sizes: ``SCHEDULER_RELIABILITY_OUTBOX_KILLS`` kills per layout (scale ``ci``: 20, ``full``: 150).
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from backends import PostgresServer
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from scheduler import SchedulerStore, mark_writer, open_store, sqlite_engine

from .outbox_child import AUTHORITY, JOB_ID

pytestmark = pytest.mark.reliability

T0 = 1_767_225_600_000
REPO = Path(__file__).resolve().parents[2]
LAYOUTS = ("shared", "attached-rollback", "attached-wal")
MUST_NOT_SPLIT = {"shared", "attached-rollback"}
PG_SCHEMA = "kernel_kills"


class ShopProcess:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.outbox_child", json.dumps(spec)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.committing: list[int] = []
        self.committed: list[int] = []
        self.ready = threading.Event()
        self.progress = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if not raw.endswith(b"\n"):
                break
            record = json.loads(raw)
            with self.progress:
                if "ready" in record:
                    self.ready.set()
                self.committing.extend([record["committing"]] if "committing" in record else [])
                self.committed.extend([record["committed"]] if "committed" in record else [])
                self.progress.notify_all()
        with self.progress:
            self.progress.notify_all()

    def wait_committing(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        with self.progress:
            while len(self.committing) < count and self.proc.poll() is None:
                if not self.progress.wait(timeout=max(0.0, deadline - time.monotonic())):
                    break
        if len(self.committing) < count:
            stderr = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            raise AssertionError(f"the shop process made no progress: {stderr}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.reader.join(timeout=30)


def prepare(layout: str, directory: Path) -> dict[str, Any]:
    app, kernel = directory / "app.sqlite", directory / "kernel.sqlite"
    spec: dict[str, Any] = {"layout": layout, "app": str(app), "first": 1}
    con = sqlite3.connect(app, isolation_level=None)
    con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, note VARCHAR(64) NOT NULL)")
    con.close()
    if layout == "shared":
        spec["schema"] = "main"
        with open_store(app, exclusive=False, clock=lambda: T0) as store:
            store.create_job(id=JOB_ID, kind="email", authority=AUTHORITY)
        return spec
    spec.update(schema="kernel", kernel=str(kernel))
    with open_store(kernel, clock=lambda: T0) as store:
        store.create_job(id=JOB_ID, kind="email", authority=AUTHORITY)
    return spec


def app_engine(spec: dict[str, Any], journal: bool = True) -> tuple[Engine, str]:
    """The application's engine as it reopens after a restart, and the occurrences table's name."""
    layout = spec["layout"]
    if layout == "postgresql":
        return create_engine(spec["url"], poolclass=NullPool), f'"{spec["schema"]}".occurrences'
    attach = {"kernel": spec["kernel"]} if layout.startswith("attached") else None
    mode = ("delete" if layout == "attached-rollback" else "wal") if journal else None
    return sqlite_engine(spec["app"], attach=attach, journal_mode=mode), (
        "kernel.occurrences" if attach else "occurrences"
    )


def wait_for_killed_sessions(engine: Engine, timeout: float = 30) -> None:
    """Wait until the killed client's server session is gone: a COMMIT it had sent may still be
    completing on the server, and the outcome must be read after it."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as connection:
            others = connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        if others == 0 or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def outcome(spec: dict[str, Any]) -> tuple[set[int], set[int]]:
    """(orders, orders that have an occurrence), read as the application would after a restart."""
    engine, occurrences = app_engine(spec)
    try:
        if spec["layout"] == "postgresql":
            wait_for_killed_sessions(engine)
        with engine.begin() as connection:
            orders = {int(row[0]) for row in connection.execute(text("SELECT id FROM orders"))}
            keys = connection.execute(
                text(f"SELECT trigger_key FROM {occurrences} WHERE job_id = :job"), {"job": JOB_ID}
            )
            enqueued = {int(str(row[0]).removeprefix("order:")) for row in keys}
    finally:
        engine.dispose()
    return orders, enqueued


def run_kills(spec: dict[str, Any], kills: int, rng: random.Random) -> dict[str, Any]:
    """SIGKILL the shop ``kills`` times while it commits; count the split outcomes."""
    splits: list[dict[str, Any]] = []
    reported: set[int] = set()
    killed_in_commit = 0
    started = time.monotonic()
    for _ in range(kills):
        shop = ShopProcess(spec)
        shop.wait_committing(rng.randint(1, 3))
        time.sleep(rng.uniform(0, 0.002))
        shop.kill()
        reported.update(shop.committed)
        if shop.committing and shop.committing[-1] not in shop.committed:
            killed_in_commit += 1
        orders, enqueued = outcome(spec)
        assert reported <= orders and reported <= enqueued, "a reported commit was lost"
        if orders ^ enqueued:
            splits.append(
                {"orders_only": sorted(orders - enqueued), "occurrences_only": sorted(enqueued - orders)}
            )
            repair(spec, orders, enqueued)  # so that each kill is counted on its own
        spec["first"] = max(orders | enqueued | {0}) + 1
    return {
        "kills": kills,
        "killed_between_committing_and_committed": killed_in_commit,
        "orders": spec["first"] - 1,
        "split_outcomes": len(splits),
        "splits": splits[:5],
        "seconds": round(time.monotonic() - started, 1),
    }


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sigkill_while_committing_order_and_occurrence(
    tmp_path: Path, layout: str, scale: Any, seed: int, figures: dict[str, Any]
) -> None:
    spec = prepare(layout, tmp_path)
    result = run_kills(spec, scale.outbox_kills, random.Random(f"{seed}:{layout}"))
    figures[f"outbox_kills_{layout}"] = result
    if layout in MUST_NOT_SPLIT:
        assert result["split_outcomes"] == 0, result["splits"]


def test_sigkill_while_committing_order_and_occurrence_postgresql(
    postgres_server: PostgresServer, scale: Any, seed: int, figures: dict[str, Any]
) -> None:
    url = postgres_server.create_database()
    try:
        text_url = url.render_as_string(hide_password=False)
        engine = create_engine(url, poolclass=NullPool)
        with engine.begin() as connection:
            connection.execute(
                text("CREATE TABLE orders (id INTEGER PRIMARY KEY, note VARCHAR(64) NOT NULL)")
            )
        engine.dispose()
        with open_store(text_url, schema=PG_SCHEMA, clock=lambda: T0) as store:
            store.create_job(id=JOB_ID, kind="email", authority=AUTHORITY)
        spec = {"layout": "postgresql", "url": text_url, "schema": PG_SCHEMA, "first": 1}
        result = run_kills(spec, scale.outbox_kills, random.Random(f"{seed}:postgresql"))
    finally:
        postgres_server.drop_database(url)
    figures["outbox_kills_postgresql"] = result
    assert result["split_outcomes"] == 0, result["splits"]


def repair(spec: dict[str, Any], orders: set[int], enqueued: set[int]) -> None:
    """Give every order an occurrence and every occurrence an order (idempotent re-run)."""
    engine, _ = app_engine(spec, journal=False)
    try:
        with engine.begin() as connection:
            mark_writer(connection)
            for number in sorted(enqueued - orders):
                connection.execute(
                    text("INSERT INTO orders (id, note) VALUES (:id, 'repaired')"), {"id": number}
                )
            schema = spec.get("schema") or "main"
            store = SchedulerStore.on_connection(connection, schema=schema)
            for number in sorted(orders - enqueued):
                store.enqueue_occurrence(
                    job_id=JOB_ID, scheduled_for=0, trigger_key=f"order:{number}", payload={"order": number}
                )
    finally:
        engine.dispose()
