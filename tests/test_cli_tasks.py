"""``scheduler tasks list|show|cancel|retry`` (API §10) on a real SQLite file and on the real
PostgreSQL server: runs of tasks deferred and run through ``Tasks``, listed with their filters
(queue, task, status, error code), shown with their arguments, result and history, cancelled and
retried one at a time (by a unique id prefix) or ``--all`` matching, with ``--json``; tables show
short ids; bad usage exits 2 and writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cli_support import invoke, run_json
from cli_support import isolated_environment as isolated_environment
from store_places import PostgresSchemaPlace, StorePlace
from tasks_support import tasks_on

from scheduler import TaskRun, Tasks
from scheduler.testing import dump_tables
from scheduler.worker import PermanentError

LATER = 4_102_444_800_000  # 2100-01-01: runs deferred to then stay queued


@pytest.fixture
def db(place: StorePlace) -> list[str]:
    if isinstance(place, PostgresSchemaPlace):
        return ["--db", place.server.url.render_as_string(hide_password=False), "--schema", place.schema]
    return ["--db", str(place.path)]


@pytest.fixture
def shop(place: StorePlace) -> Iterator[dict[str, TaskRun]]:
    """Runs of two tasks in two queues: one succeeded, one failed for good, three waiting."""
    with tasks_on(place) as tasks:
        mail, report = _define(tasks)
        runs = {
            "sent": mail.defer("ada@example.com"),
            "bounced": mail.defer("nobody"),
            "later": mail.defer("bob@example.com", run_at=LATER),
            "later2": mail.defer("eve@example.com", run_at=LATER),
            "report": report.defer(month="2026-01", run_at=LATER),
        }
        assert tasks.worker().run_until_idle() == 2
        yield {name: tasks.get(run.id) or run for name, run in runs.items()}


def _define(tasks: Tasks) -> tuple[Any, Any]:
    @tasks.task(name="mail.send", queue="emails")
    def send(to: str) -> dict[str, str]:
        if "@" not in to:
            raise PermanentError("no such address", code="SMTP_REJECTED")
        return {"sent": to}

    @tasks.task(name="report.build", queue="reports")
    def build(month: str) -> None: ...

    return send, build


def _ids(body: dict[str, Any]) -> set[str]:
    return {run["id"] for run in body["runs"]}


def test_tasks_list_filters_runs_and_shows_short_ids(db: list[str], shop: dict[str, TaskRun]) -> None:
    everything = run_json("tasks", "list", *db)
    assert (everything["count"], _ids(everything)) == (5, {run.id for run in shop.values()})
    bounced = next(run for run in everything["runs"] if run["id"] == shop["bounced"].id)
    assert {key: bounced[key] for key in ("task", "queue", "status", "attempt", "args", "value")} == {
        "task": "mail.send",
        "queue": "emails",
        "status": "dead_letter",
        "attempt": 1,
        "args": {"to": "nobody"},
        "value": None,
    }
    assert bounced["error"] == {"code": "SMTP_REJECTED", "message": "no such address"}
    assert _ids(run_json("tasks", "list", "--queue", "reports", *db)) == {shop["report"].id}
    queued_mail = run_json("tasks", "list", "--task", "mail.send", "--status", "queued", *db)
    assert _ids(queued_mail) == {shop["later"].id, shop["later2"].id}
    assert _ids(run_json("tasks", "list", "--code", "SMTP_REJECTED", *db)) == {shop["bounced"].id}
    assert run_json("tasks", "list", "--limit", "2", *db)["count"] == 2
    table = invoke("tasks", "list", "--status", "succeeded", *db)
    assert table.exit_code == 0, table.output
    assert shop["sent"].id[:12] in table.stdout and shop["sent"].id not in table.stdout
    assert "mail.send" in table.stdout and "emails" in table.stdout


def test_tasks_show_a_run_by_prefix(db: list[str], shop: dict[str, TaskRun]) -> None:
    sent = shop["sent"]
    body = run_json("tasks", "show", sent.id[:12], *db)
    assert body["run"]["id"] == sent.id
    assert (body["run"]["status"], body["run"]["value"], body["run"]["args"]) == (
        "succeeded",
        {"sent": "ada@example.com"},
        {"to": "ada@example.com"},
    )
    assert [event["type"] for event in body["history"]][:1] == ["occurrence_succeeded"]
    shown = invoke("tasks", "show", sent.id[:12], *db)
    assert shown.exit_code == 0, shown.output
    assert "ada@example.com" in shown.stdout and "occurrence_succeeded" in shown.stdout
    missing = invoke("tasks", "show", "occ_" + "0" * 64, *db)
    assert missing.exit_code == 1 and "not found" in missing.output


def test_tasks_cancel_and_retry_one_run(db: list[str], shop: dict[str, TaskRun]) -> None:
    later = shop["later"]
    cancelled = run_json("tasks", "cancel", later.id[:12], "--reason", "customer left", *db)
    assert cancelled["run"]["id"] == later.id
    assert (cancelled["run"]["status"], cancelled["run"]["error"]) == (
        "dead_letter",
        {"code": "CANCELLED", "message": "customer left"},
    )
    assert (cancelled["previousStatus"], cancelled["deduplicated"]) == ("queued", False)
    assert run_json("tasks", "cancel", later.id, *db)["deduplicated"] is True
    retried = run_json("tasks", "retry", later.id[:12], *db)
    assert (retried["run"]["id"], retried["run"]["status"]) == (later.id, "retry_wait")
    refused = invoke("tasks", "retry", shop["sent"].id, *db)  # not a dead letter
    assert refused.exit_code == 1 and "SCHEDULER_CONFLICT" in refused.output
    table = invoke("tasks", "cancel", shop["report"].id, *db)
    assert table.exit_code == 0 and "cancelled" in table.stdout and "dead_letter" in table.stdout


def test_tasks_cancel_all_and_retry_all_act_on_the_matching_runs(
    place: StorePlace, db: list[str], shop: dict[str, TaskRun]
) -> None:
    assert run_json("tasks", "cancel", "--all", "--queue", "emails", *db) == {"cancelled": 2}
    assert run_json("tasks", "cancel", "--all", "--queue", "emails", *db) == {"cancelled": 0}
    assert run_json("tasks", "retry", "--all", "--task", "mail.send", "--code", "CANCELLED", *db) == {
        "retried": 2
    }
    assert run_json("tasks", "cancel", "--all", "--status", "retry_wait", "--status", "queued", *db) == {
        "cancelled": 3  # the two retried mails and the report
    }
    assert run_json("tasks", "retry", "--all", *db) == {"retried": 4}  # every dead letter
    with tasks_on(place) as tasks:
        statuses = {name: (tasks.get(run.id) or run).status for name, run in shop.items()}
    assert statuses == {
        "sent": "succeeded",
        "bounced": "retry_wait",
        "later": "retry_wait",
        "later2": "retry_wait",
        "report": "retry_wait",
    }
    table = invoke("tasks", "retry", "--all", "--queue", "nowhere", *db)
    assert table.exit_code == 0 and "0 runs retried" in table.stdout


@pytest.mark.parametrize(
    "arguments",
    [
        ["tasks", "cancel"],  # neither an id nor --all
        ["tasks", "retry"],
        ["tasks", "cancel", "occ_1234", "--all"],  # both
        ["tasks", "cancel", "occ_1234", "--queue", "emails"],  # a filter without --all
        ["tasks", "retry", "occ_1234", "--code", "X"],
        ["tasks", "cancel", "--all", "--status", "succeeded"],  # not a status that can be cancelled
        ["tasks", "list", "--status", "done"],
        ["tasks", "list", "--queue", ""],
        ["tasks", "retry", "--all", "--code", "a\x01b"],
    ],
)
def test_bad_usage_exits_2_and_writes_nothing(
    place: StorePlace, db: list[str], shop: dict[str, TaskRun], arguments: list[str]
) -> None:
    with place.open() as store:
        before = dump_tables(store)
    result = invoke(*arguments, *db)
    assert result.exit_code == 2, result.output
    with place.open() as store:
        assert dump_tables(store) == before
