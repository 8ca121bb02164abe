"""Results across backends (API §8 "Results", over the §5 methods and §12 cancellation): the same
calls with the same clock and ids return the same records on SQLite and on PostgreSQL, and leave
the same rows (``scheduler.testing.dump_tables``), with event ids renumbered densely in order
(PostgreSQL's may have gaps, API §8) and without SQLite's own ``sqlite_sequence``.

One script drives both stores side by side: jobs and their updates, enqueues (deduplicated and
once per trigger, one batch), claims (next, targeted, batched, filtered by kind and workspace),
renewals, settlements (success, retry, dead letter, a batch, the one-commit cycles), requeue of a
dead letter, cancellation, a ``transaction()`` block that rolls back, and the reads. Each call's
result (its record as a dict, or its error code and details) is compared as it is made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from backends import PostgresServer, unique_name
from fastpath_support import Clock
from recorded import T0

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.testing import dump_tables

AUTHORITY = {
    "principal": {"type": "user", "id": "user-alice"},
    "workspaceId": "ws-main",
    "requestedCapabilities": ["calendar.read"],
}
OTHER_WORKSPACE = {"principal": {"type": "service", "id": "billing"}, "workspaceId": "ws-billing"}


class Side:
    """One backend's store and its clock, which also gives it its uuids: the same instants, moved
    by the script, and the same uuid sequence on both backends."""

    def __init__(self, open_at: Callable[..., SchedulerStore]) -> None:
        self.clock = Clock()
        self.store = open_at(clock=self.clock, uuid_factory=self.clock.uuid)


def plain(value: Any) -> Any:
    """A result as data: records as dicts (lists and pairs of them too)."""
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value.to_dict() if hasattr(value, "to_dict") else value


def result_of(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", plain(call()))
    except SchedulerKernelError as error:
        return ("error", error.code, error.details)


def comparable(tables: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    rows = {name: table for name, table in tables.items() if name != "sqlite_sequence"}
    rows["events"] = [{**row, "event_id": index} for index, row in enumerate(rows["events"], 1)]
    return rows


class Twins:
    """The same call on both stores; the results must be equal."""

    def __init__(self, sqlite: Side, postgresql: Side) -> None:
        self.sides = (sqlite, postgresql)
        self.calls = 0

    def tick(self, ms: int) -> None:
        for side in self.sides:
            side.clock.now += ms

    def __call__(self, call: Callable[[SchedulerStore], Any]) -> Any:
        """Run ``call`` on both stores; returns the (equal) result."""
        self.calls += 1
        sqlite_result, pg_result = (result_of(lambda side=side: call(side.store)) for side in self.sides)
        assert pg_result == sqlite_result, f"call {self.calls}"
        return sqlite_result[1] if sqlite_result[0] == "ok" else None

    def tables(self) -> tuple[Any, Any]:
        return tuple(comparable(dump_tables(side.store)) for side in self.sides)  # type: ignore[return-value]


@pytest.fixture
def twins(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[Twins]:
    schema = unique_name("t_same")
    sqlite = Side(lambda **options: open_store(tmp_path / "kernel.sqlite", **options))
    postgresql = Side(lambda **options: open_store(postgres_server.engine, schema=schema, **options))
    try:
        yield Twins(sqlite, postgresql)
    finally:
        sqlite.store.close()
        postgresql.store.close()
        postgres_server.drop_schema(schema)


def test_the_same_calls_return_the_same_records_and_leave_the_same_rows(twins: Twins) -> None:
    twins(lambda s: s.create_job(id="mail", kind="email", authority=AUTHORITY, payload={"to": "a"}))
    twins(lambda s: s.create_job(id="bill", kind="invoice", authority=OTHER_WORKSPACE, max_attempts=1))
    twins(lambda s: s.create_job(id="mail", kind="email", authority=AUTHORITY))  # a conflict
    twins(lambda s: s.update_job("mail", 1, payload=None, max_attempts=2))
    twins(lambda s: s.update_job("mail", 1, enabled=False))  # a stale revision
    twins(lambda s: s.get_job("mail"))
    twins(lambda s: s.get_job("missing"))
    first = twins(lambda s: s.enqueue_occurrence(job_id="mail", scheduled_for=T0, trigger_key="t1"))
    twins(lambda s: s.enqueue_occurrence(job_id="mail", scheduled_for=T0, trigger_key="t1"))  # deduplicated
    twins(lambda s: s.enqueue_occurrence(job_id="mail", scheduled_for=T0, trigger_key="t1", payload=[1]))
    twins(
        lambda s: s.enqueue_occurrence_once_per_trigger(job_id="mail", scheduled_for=T0 + 1, trigger_key="t2")
    )
    twins(
        lambda s: s.enqueue_occurrence_once_per_trigger(job_id="mail", scheduled_for=T0 + 2, trigger_key="t2")
    )
    twins(
        lambda s: s.enqueue_many(
            [
                {"job_id": "bill", "scheduled_for": T0, "trigger_key": f"b{n}", "payload": {"n": n}}
                for n in range(4)
            ]
        )
    )
    twins(lambda s: s.list_occurrences_by_trigger(job_id="mail", trigger_key="t2"))
    twins.tick(10)

    claimed = twins(lambda s: s.claim_next(owner_id="w1", lease_ms=1000, job_kind="email"))
    assert claimed is not None and claimed["id"] == first["id"]
    twins(lambda s: s.claim_next(owner_id="w1", lease_ms=1000, workspace_id="ws-none"))
    twins(
        lambda s: s.renew(occurrence_id=claimed["id"], owner_id="w1", fence=claimed["fence"], lease_ms=5000)
    )
    twins(
        lambda s: s.renew(occurrence_id=claimed["id"], owner_id="w2", fence=claimed["fence"], lease_ms=5000)
    )
    twins.tick(5)
    twins(
        lambda s: s.settle(
            occurrence_id=claimed["id"],
            owner_id="w1",
            fence=claimed["fence"],
            outcome="failed",
            error={"code": "SMTP", "message": "busy"},
            retry_at=T0 + 100,
        )
    )
    batch = twins(lambda s: s.claim_batch(owner_id="w2", lease_ms=1000, limit=3, workspace_id="ws-billing"))
    assert batch is not None and len(batch) == 3
    settled = twins(
        lambda s: s.settle_many(
            [
                {"occurrence_id": batch[0]["id"], "owner_id": "w2", "fence": 1, "outcome": "succeeded"},
                {"occurrence_id": batch[1]["id"], "owner_id": "w2", "fence": 1, "outcome": "failed"},
            ]
        )
    )
    cycle = twins(
        lambda s: s.settle_and_claim(
            occurrence_id=batch[2]["id"],
            owner_id="w2",
            fence=1,
            outcome="succeeded",
            result={"ok": True},
            lease_ms=1000,
            job_kind=["invoice"],
        )
    )
    assert cycle is not None and cycle["claimed"] is not None
    group = [{"occurrence_id": cycle["claimed"]["id"], "owner_id": "w2", "fence": 1, "outcome": "failed"}]
    stale = [{**group[0], "fence": 2}]
    twins(lambda s: s.settle_many_and_claim(stale, owner_id="w2", lease_ms=1000, limit=2))  # index 0
    twins(
        lambda s: s.settle_many_and_claim(
            group, owner_id="w2", lease_ms=1000, limit=2, job_kind=["email", "invoice"]
        )
    )
    twins(lambda s: s.list_dead_letters(job_id="bill"))
    dead, code = settled[1]["id"], settled[1]["lastError"]["code"]
    assert settled[1]["status"] == "dead_letter"
    requeued = twins(
        lambda s: s.requeue_dead_letter(
            occurrence_id=dead, expected_fence=1, expected_error_code=code, request_id="rq-1"
        )
    )
    assert requeued is not None
    twins.tick(200)
    retried = twins(lambda s: s.claim_occurrence(occurrence_id=first["id"], owner_id="w3", lease_ms=1000))
    twins(lambda s: s.claim_occurrence(occurrence_id="occ_missing", owner_id="w3", lease_ms=1000))
    twins(lambda s: s.cancel_occurrence(occurrence_id=retried["id"], reason="operator"))
    twins(lambda s: s.cancel_occurrence(occurrence_id=retried["id"], reason="again"))  # unchanged
    twins(
        lambda s: s.settle(
            occurrence_id=retried["id"], owner_id="w3", fence=retried["fence"], outcome="succeeded"
        )
    )  # the former owner is fenced out

    def rolled_back(store: SchedulerStore) -> None:
        with store.transaction() as tx:
            tx.enqueue_occurrence(job_id="mail", scheduled_for=T0 + 9, trigger_key="t9")
            tx.create_job(id="mail", kind="email", authority=AUTHORITY)  # fails: nothing is kept

    twins(rolled_back)
    twins(lambda s: s.list_occurrences_by_trigger(job_id="mail", trigger_key="t9"))
    twins(lambda s: s.history(job_id="mail"))
    twins(lambda s: s.history(occurrence_id=dead, limit=3))
    twins(lambda s: s.list_dead_letters())
    twins(lambda s: s.get_occurrence(first["id"]))
    sqlite_tables, pg_tables = twins.tables()
    assert pg_tables == sqlite_tables
    assert len(sqlite_tables["events"]) > 20
