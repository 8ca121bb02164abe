"""``scheduler tasks list|show|cancel|retry`` on both backends (``place``), on runs a real ``Tasks``
object deferred and a task worker ran: filters, newest-first keyset pages, short ids in tables and
whole ids in ``--json``, prefixes, one run or ``--all`` (with its guard and ``--dry-run``), replays
that exit 0, conflicts that exit 1 and write nothing. Also: the single-file SQLite layout, and the
listing's per-task walk is an index scan on both backends. (Bad option values exit 2 and a missing
database is never created: ``test_cli_truthfulness.py``, with every command.)"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_support import invoke, run_json
from cli_support import isolated_environment as isolated_environment
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool
from store_places import PostgresSchemaPlace, SqliteFilePlace, StorePlace
from tasks_support import tasks_on

from scheduler import Tasks
from scheduler.cli.runs import RunFilter, job_walk, listing_query
from scheduler.testing import T0, SchedulerClock
from scheduler.worker import PermanentError


@dataclass
class Shop:
    tasks: Tasks
    db: tuple[str, ...]
    ids: dict[str, str]
    """Run ids by label, in the order they were deferred (each 1 ms after the one before)."""
    place: StorePlace
    clock: SchedulerClock

    def dump(self) -> Any:
        return self.place.dump()


def _db(place: StorePlace) -> tuple[str, ...]:
    if isinstance(place, SqliteFilePlace):
        return ("--db", str(place.path))
    return ("--db", place.server.url.render_as_string(hide_password=False), "--schema", place.schema)


def define(tasks: Tasks) -> dict[str, Any]:
    @tasks.task(name="shop.mail", queue="emails", max_attempts=1)
    def mail(to: str) -> dict[str, str]:
        if to.startswith("bad"):
            raise PermanentError("smtp down", code="SMTP_DOWN")
        if to == "flaky":
            raise RuntimeError("connection reset")
        return {"sent": to}

    @tasks.task(name="shop.receipt", queue="emails")
    def receipt(order: str) -> str:
        return order.upper()

    @tasks.task(name="shop.report", queue="reports")
    def report(month: str) -> None:
        return None

    return {"mail": mail, "receipt": receipt, "report": report}


@pytest.fixture
def shop(place: StorePlace) -> Iterator[Shop]:
    """u1, u2, bad1, flaky (mail), o1 (receipt) run by a worker of ``emails``; then two reports
    left queued. Mail bad1 is a dead letter with code SMTP_DOWN, flaky one with the exception's."""
    clock = SchedulerClock(T0)
    tasks = tasks_on(place, clock=clock)
    made = define(tasks)
    ids: dict[str, str] = {}
    for label, task, arguments in (
        ("u1", "mail", {"to": "u1"}),
        ("u2", "mail", {"to": "u2"}),
        ("bad1", "mail", {"to": "bad1"}),
        ("flaky", "mail", {"to": "flaky"}),
        ("o1", "receipt", {"order": "o1"}),
    ):
        ids[label] = made[task].defer(**arguments).id
        clock.advance(1)
    assert tasks.worker(["emails"]).run_until_idle() == 5
    for month in ("2026-01", "2026-02"):
        ids[month] = made["report"].defer(month=month).id
        clock.advance(1)
    yield Shop(tasks, _db(place), ids, place, clock)
    tasks.close()


def listed(shop: Shop, *options: str) -> list[str]:
    return [run["id"] for run in run_json("tasks", "list", *options, *shop.db)["runs"]]


def newest_first(shop: Shop, *labels: str) -> list[str]:
    return [shop.ids[label] for label in reversed(labels)]


ALL = ("u1", "u2", "bad1", "flaky", "o1", "2026-01", "2026-02")


def test_list_filters_newest_first(shop: Shop) -> None:
    assert listed(shop) == newest_first(shop, *ALL)
    assert listed(shop, "--queue", "reports") == newest_first(shop, "2026-01", "2026-02")
    assert listed(shop, "--queue", "emails") == newest_first(shop, "u1", "u2", "bad1", "flaky", "o1")
    assert listed(shop, "--task", "shop.mail") == newest_first(shop, "u1", "u2", "bad1", "flaky")
    assert listed(shop, "--task", "shop.rec") == [shop.ids["o1"]]  # a unique prefix of a task name
    assert listed(shop, "--status", "dead_letter") == newest_first(shop, "bad1", "flaky")
    assert listed(shop, "--status", "queued", "--status", "succeeded") == newest_first(
        shop, "u1", "u2", "o1", "2026-01", "2026-02"
    )
    assert listed(shop, "--code", "SMTP_DOWN") == [shop.ids["bad1"]]
    assert listed(shop, "--queue", "emails", "--status", "succeeded", "--task", "shop.mail") == newest_first(
        shop, "u1", "u2"
    )
    assert listed(shop, "--queue", "nothing") == [] and listed(shop, "--task", "shop.none") == []


def test_list_json_holds_the_run_in_task_terms(shop: Shop) -> None:
    body = run_json("tasks", "list", "--task", "shop.mail", "--limit", "2", *shop.db)
    flaky, bad = body["runs"]
    assert (body["count"], body["limit"], body["next"]) == (2, 2, bad["id"])
    assert body["filter"] == {"queue": None, "task": "shop.mail", "statuses": [], "code": None}
    assert bad["id"] == shop.ids["bad1"] and len(bad["id"]) == 68
    assert (bad["task"], bad["queue"], bad["status"], bad["attempt"], bad["maxAttempts"]) == (
        "shop.mail",
        "emails",
        "dead_letter",
        1,
        1,
    )
    assert bad["args"] == {"to": "bad1"} and bad["value"] is None
    assert bad["error"] == {"code": "SMTP_DOWN", "message": "smtp down"}
    assert bad["triggerKey"].startswith("run:") and bad["scheduledFor"] == T0 + 2
    assert flaky["error"]["code"] == "RuntimeError"
    succeeded = run_json("tasks", "list", "--task", "shop.receipt", *shop.db)["runs"][0]
    assert (succeeded["value"], succeeded["error"], succeeded["settledAt"] is not None) == ("O1", None, True)


@pytest.mark.parametrize(
    "options", [(), ("--queue", "emails"), ("--status", "queued", "--status", "succeeded")]
)
def test_pages_continue_after_the_last_run_and_cover_every_run_once(
    shop: Shop, options: tuple[str, ...]
) -> None:
    everything = listed(shop, *options)
    pages: list[list[str]] = []
    after: tuple[str, ...] = ()
    while True:
        body = run_json("tasks", "list", *options, "--limit", "2", *after, *shop.db)
        pages.append([run["id"] for run in body["runs"]])
        if body["next"] is None:
            break
        assert body["next"] == pages[-1][-1]
        after = ("--after", body["next"][:16])  # a unique prefix continues too
    assert [run for page in pages for run in page] == everything
    assert all(len(page) == 2 for page in pages[:-1])


def test_list_table_shows_short_ids_and_how_to_continue(shop: Shop) -> None:
    result = invoke("tasks", "list", "--limit", "3", *shop.db)
    assert result.exit_code == 0, result.output
    newest = newest_first(shop, *ALL)
    for run in newest[:3]:
        assert run[:12] in result.stdout and run not in result.stdout
    assert newest[3][:12] not in result.stdout
    assert f"more: add --after {newest[2][:12]}" in result.stdout
    assert "SMTP_DOWN" not in result.stdout and "shop.report" in result.stdout
    missing = run_json("tasks", "list", "--after", "occ_zzzz", *shop.db, exit_code=1)
    assert missing["error"]["code"] == "SCHEDULER_NOT_FOUND"


def test_show_gives_fields_arguments_error_and_events(shop: Shop) -> None:
    bad = shop.ids["bad1"]
    body = run_json("tasks", "show", bad[:14], *shop.db)
    assert body["run"]["id"] == bad and body["run"]["args"] == {"to": "bad1"}
    assert body["occurrence"]["id"] == bad and body["control"] is None
    assert [event["type"] for event in body["events"]] == [
        "occurrence_enqueued",
        "occurrence_claimed",
        "occurrence_dead_lettered",
    ]
    text = invoke("tasks", "show", bad[:14], *shop.db)
    assert text.exit_code == 0, text.output
    for shown in (bad, 'args: {"to":"bad1"}', "smtp down", "occurrence_dead_lettered", "shop.mail"):
        assert shown in text.stdout, shown
    receipt = run_json("tasks", "show", shop.ids["o1"], *shop.db)["run"]
    assert (receipt["value"], receipt["queue"]) == ("O1", "emails")
    assert (
        run_json("tasks", "show", "occ_zzzz", *shop.db, exit_code=1)["error"]["code"] == "SCHEDULER_NOT_FOUND"
    )
    ambiguous = run_json("tasks", "show", "occ_", *shop.db, exit_code=2)["error"]
    assert ambiguous["code"] == "CLI_AMBIGUOUS_ID"


def test_cancel_one_run_then_again_says_already_and_a_settled_one_is_a_conflict(shop: Shop) -> None:
    queued = shop.ids["2026-01"]
    text = invoke("tasks", "cancel", queued[:12], "--reason", "month closed", *shop.db)
    assert text.exit_code == 0 and "cancelled" in text.stdout and "(already)" not in text.stdout, text.output
    run = shop.tasks.get(queued)
    assert run is not None and run.cancelled
    assert run.error == {"code": "CANCELLED", "message": "month closed"}
    before = shop.dump()
    again = run_json("tasks", "cancel", queued, *shop.db)
    assert (again["deduplicated"], again["previousStatus"], again["run"]["status"]) == (
        True,
        "dead_letter",
        "dead_letter",
    )
    assert "cancelled (already)" in invoke("tasks", "cancel", queued, *shop.db).stdout
    conflict = run_json("tasks", "cancel", shop.ids["u1"], *shop.db, exit_code=1)["error"]
    assert conflict["code"] == "SCHEDULER_CONFLICT"
    assert (
        run_json("tasks", "cancel", "occ_zzzz", *shop.db, exit_code=1)["error"]["code"]
        == "SCHEDULER_NOT_FOUND"
    )
    assert shop.dump() == before


def test_cancel_all_needs_a_scope_or_yes_and_counts(shop: Shop) -> None:
    before = shop.dump()
    refused = run_json("tasks", "cancel", "--all", *shop.db, exit_code=2)["error"]
    assert refused["code"] == "CLI_USAGE" and "--yes" in refused["message"]
    dry = run_json("tasks", "cancel", "--all", "--queue", "reports", "--dry-run", *shop.db)
    assert (dry["action"], dry["count"], dry["dryRun"]) == ("cancel", 2, True)
    assert run_json("tasks", "cancel", "--all", "--queue", "emails", *shop.db)["count"] == 0  # none queued
    assert shop.dump() == before
    done = run_json("tasks", "cancel", "--all", "--task", "shop.report", "--reason", "closed", *shop.db)
    assert (done["count"], done["dryRun"], done["filter"]["statuses"]) == (2, False, ["queued"])
    for month in ("2026-01", "2026-02"):
        run = shop.tasks.get(shop.ids[month])
        assert run is not None and run.error == {"code": "CANCELLED", "message": "closed"}
    assert invoke("tasks", "cancel", "--all", "--yes", *shop.db).stdout.strip() == "cancelled 0 runs"


def test_retry_one_run_then_again_says_already_and_a_live_one_is_a_conflict(shop: Shop) -> None:
    bad = shop.ids["bad1"]
    body = run_json("tasks", "retry", bad[:12], *shop.db)
    assert (body["deduplicated"], body["run"]["status"], body["run"]["id"]) == (False, "retry_wait", bad)
    assert body["requestId"].startswith("retry:")
    again = run_json("tasks", "retry", bad, *shop.db)
    assert (again["deduplicated"], again["requestId"]) == (True, body["requestId"])
    assert "retried (already)" in invoke("tasks", "retry", bad, *shop.db).stdout
    before = shop.dump()
    conflict = run_json("tasks", "retry", shop.ids["2026-01"], *shop.db, exit_code=1)["error"]
    assert conflict["code"] == "SCHEDULER_CONFLICT"
    assert shop.dump() == before


def test_retry_all_by_task_and_code_then_the_worker_runs_them(shop: Shop) -> None:
    assert run_json("tasks", "retry", "--all", "--code", "SMTP_DOWN", "--dry-run", *shop.db)["count"] == 1
    done = run_json("tasks", "retry", "--all", "--task", "shop.mail", "--code", "RuntimeError", *shop.db)
    assert (done["action"], done["count"]) == ("retry", 1)
    assert [run.status for run in map(shop.tasks.get, (shop.ids["flaky"], shop.ids["bad1"])) if run] == [
        "retry_wait",
        "dead_letter",
    ]
    assert invoke("tasks", "retry", "--all", "--queue", "emails", *shop.db).stdout.strip() == "retried 1 run"
    assert run_json("tasks", "retry", "--all", "--queue", "emails", *shop.db)["count"] == 0
    shop.clock.set(int(time.time() * 1000) + 1_000)  # the command requeued them at the real time
    assert shop.tasks.worker(["emails"]).run_until_idle() == 2  # both retried runs ran again
    for label in ("flaky", "bad1"):
        events = run_json("tasks", "show", shop.ids[label], *shop.db)["events"]
        assert [event["type"] for event in events].count("occurrence_claimed") == 2


def test_the_commands_on_the_single_file_layout(tmp_path: Path) -> None:
    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        connection.execute("INSERT INTO orders VALUES ('o-1')")
    tasks = Tasks(path, exclusive=False)
    made = define(tasks)
    first = made["report"].defer(month="2026-03")
    made["report"].defer(month="2026-04")
    tasks.close()
    db = ("--db", str(path))
    assert [run["id"] for run in run_json("tasks", "list", "--queue", "reports", *db)["runs"]][-1] == first.id
    assert run_json("tasks", "show", first.id[:12], *db)["run"]["args"] == {"month": "2026-03"}
    assert run_json("tasks", "cancel", "--all", "--queue", "reports", *db)["count"] == 2
    assert run_json("tasks", "retry", first.id, *db)["run"]["status"] == "retry_wait"
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT id FROM orders").fetchall() == [("o-1",)]


def test_a_tasks_listing_walks_the_job_index(shop: Shop) -> None:
    place = shop.place
    if isinstance(place, PostgresSchemaPlace):
        engine = create_engine(place.server.url, poolclass=NullPool)
    else:
        engine = create_engine(f"sqlite:///{place.path}", poolclass=NullPool)
    walk = job_walk(listing_query(RunFilter(statuses=("queued",)), (T0 + 9, "occ_z")), "shop.mail", 51)
    compiled = walk.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True})
    with engine.connect() as connection, connection.begin():
        if isinstance(place, PostgresSchemaPlace):
            connection.exec_driver_sql(f'SET LOCAL search_path TO "{place.schema}"')
            # A tiny table whose statistics vary with autovacuum: take the cheaper scans and the
            # sort off the menu, so the plan shows whether the index can serve the walk's order
            # (a sort, if one were needed, would still appear, only priced high).
            for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
                connection.exec_driver_sql(f"SET LOCAL {setting} = off")
            plan = "\n".join(str(row[0]) for row in connection.exec_driver_sql(f"EXPLAIN {compiled}"))
            assert "Index Scan Backward using scheduler_occurrences_job" in plan, plan
            assert "Sort" not in plan, plan
        else:
            rows = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}").fetchall()
            plan = "\n".join(str(row[-1]) for row in rows)
            assert "USING INDEX scheduler_occurrences_job (job_id=?" in plan, plan
            assert "TEMP B-TREE" not in plan, plan
    engine.dispose()
