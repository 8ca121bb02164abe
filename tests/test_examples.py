"""examples/shop end to end, as an application runs it: from the installed wheel, its own Alembic
chain with the scheduler branch mounted, ORM sessions placing orders through the outbox, and its
worker sending receipts, in each of the four layouts of docs/embedding.md (the PostgreSQL one in
a fresh database of the test server).

Per layout: ``alembic upgrade heads``; the receipt job created; two orders placed (one ORM
transaction each: order, shop event, occurrence); one order whose transaction fails after the
enqueue (nothing of it remains); the worker runs until idle and sends exactly the two receipts;
the shop's own tables hold exactly the shop's rows.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import URL
from wheel_support import InstalledWheel, copy_example

SCRIPT = """
import json
from sqlalchemy import func, select
from sqlalchemy.orm import Session
import scheduler
from shop.models import Order, ShopEvent
from shop.orders import RECEIPT_JOB, ensure_receipt_job, outbox, place_order
from shop.settings import Settings

settings = Settings.from_environment()
engine = settings.engine()
ensure_receipt_job(settings)
place_order(engine, settings, "o-1", 1250)
place_order(engine, settings, "o-2", 990)
failed = None
if settings.layout != "dedicated":
    try:
        with Session(engine) as session, session.begin():
            scheduler.mark_writer(session)
            session.add(Order(id="o-3", total_cents=5))
            session.flush()
            outbox(session, settings).enqueue_occurrence(
                job_id=RECEIPT_JOB, scheduled_for=0, trigger_key="order:o-3", payload={"orderId": "o-3"})
            raise RuntimeError("payment declined")
    except RuntimeError as error:
        failed = str(error)
with Session(engine) as session:
    orders = sorted(session.scalars(select(Order.id)))
    events = sorted((e.order_id, e.kind) for e in session.scalars(select(ShopEvent)))
print(json.dumps({"orders": orders, "events": events, "failed": failed}))
"""

CHECK = """
import json
import scheduler
from sqlalchemy import select
from sqlalchemy.orm import Session
from shop.models import ShopEvent
from shop.orders import RECEIPT_JOB
from shop.settings import Settings

settings = Settings.from_environment()
options = settings.store_options()
with scheduler.open_store(options.pop("target"), **options) as store:
    occurrences = {}
    for key in ("order:o-1", "order:o-2", "order:o-3"):
        found = store.list_occurrences_by_trigger(job_id=RECEIPT_JOB, trigger_key=key, limit=5)
        occurrences[key] = [o.status for o in found]
with Session(settings.engine()) as session:
    receipts = select(ShopEvent).where(ShopEvent.kind == "receipt_sent")
    sent = sorted(e.order_id for e in session.scalars(receipts))
print(json.dumps({"occurrences": occurrences, "sent": sent}))
"""


def run_ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def exercise(wheel_env: InstalledWheel, shop: Path, env: dict[str, str]) -> None:
    # The dedicated layout keeps the scheduler out of the shop's database: only the shop's branch.
    heads = "shop@head" if env["SHOP_LAYOUT"] == "dedicated" else "heads"
    run_ok(wheel_env.alembic(shop, "upgrade", heads, env=env))
    placed = json.loads(run_ok(wheel_env.run("-c", SCRIPT, cwd=shop, env=env)).splitlines()[-1])
    assert placed["orders"] == ["o-1", "o-2"]
    assert placed["events"] == [("o-1", "placed"), ("o-2", "placed")] or placed["events"] == [
        ["o-1", "placed"],
        ["o-2", "placed"],
    ]
    if env["SHOP_LAYOUT"] != "dedicated":
        assert placed["failed"] == "payment declined"
    ran = run_ok(wheel_env.run("-m", "shop.worker", "--until-idle", cwd=shop, env=env))
    assert ran.strip().splitlines()[-1] == "2"
    checked = json.loads(run_ok(wheel_env.run("-c", CHECK, cwd=shop, env=env)).splitlines()[-1])
    assert checked["occurrences"] == {"order:o-1": ["succeeded"], "order:o-2": ["succeeded"], "order:o-3": []}
    assert checked["sent"] == ["o-1", "o-2"]


@pytest.mark.parametrize("layout", ["dedicated", "shared", "attached"])
def test_shop_on_sqlite(wheel_env: InstalledWheel, tmp_path: Path, layout: str) -> None:
    shop = copy_example("shop", tmp_path)
    env = {"SHOP_LAYOUT": layout, "SHOP_DATABASE": str(tmp_path / "shop.sqlite")}
    if layout in ("dedicated", "attached"):
        env["SHOP_KERNEL"] = str(tmp_path / "kernel.sqlite")
    if layout == "dedicated":
        run_ok(wheel_env.run("-m", "scheduler", "init", "--db", env["SHOP_KERNEL"], cwd=shop, env=env))
    exercise(wheel_env, shop, env)



def test_shop_on_postgresql(wheel_env: InstalledWheel, tmp_path: Path, pg_database: URL) -> None:
    """The shop's tables in ``public``, the scheduler's in the schema ``scheduler`` of one database."""
    shop = copy_example("shop", tmp_path)
    url = pg_database.render_as_string(hide_password=False)
    env = {"SHOP_LAYOUT": "postgresql", "SHOP_DATABASE": url}
    exercise(wheel_env, shop, env)
