"""Helpers of the occurrence-lifecycle tests (enqueue, claims, leases, settle, history, batches).

Everything drives the public API of a real store in a ``place`` (a SQLite file or a fresh
PostgreSQL schema, ``store_places.py``). Rows the lifecycle does not create itself (runtime
controls, requeue requests, reservations, adjudications) are inserted
with SQLAlchemy Core on a second connection, as another engineer's module would write them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from backends import SQLITE
from recorded import T0 as T0
from store_places import SqliteFilePlace, StorePlace

from scheduler import SchedulerKernelError, SchedulerStore
from scheduler.schema import tables as t
from scheduler.store.records import Occurrence

INVALID = "SCHEDULER_INVALID_ARGUMENT"

AUTHORITY: dict[str, Any] = {
    "principal": {"type": "user", "id": "user-alice"},
    "tenantId": "tenant-acme",
    "workspaceId": "ws-main",
    "requestedCapabilities": ["calendar.read"],
}
CAPABILITY_JSON = '{"pauseResume":"checkpoint_v1","safePoints":["adapter_checkpoint"],"schemaVersion":1}'
CAPABILITY_DIGEST = "sha256:" + "ab" * 32
DIGEST = "sha256:" + "cd" * 32


class Env:
    """A store in ``place`` (a SQLite file or a PostgreSQL schema) with a controllable clock
    that counts its reads."""

    def __init__(self, place: Path | StorePlace, now: int = T0, **options: Any) -> None:
        place = SqliteFilePlace(place) if isinstance(place, Path) else place
        self.place = place
        self.clock = {"now": now}
        self.clock_reads = 0
        self.store: SchedulerStore = place.open(clock=self._read_clock, **options)

    def _read_clock(self) -> int:
        self.clock_reads += 1
        return self.clock["now"]

    @property
    def now(self) -> int:
        return self.clock["now"]

    def tick(self, ms: int = 1000) -> int:
        self.clock["now"] += ms
        return self.clock["now"]

    def set(self, now: int) -> int:
        self.clock["now"] = now
        return now

    def reopen(self) -> SchedulerStore:
        self.store.close()
        self.store = self.place.open(clock=self._read_clock)
        return self.store

    @property
    def path(self) -> Path:
        """The SQLite file (tests that read the file itself are SQLite-only)."""
        assert isinstance(self.place, SqliteFilePlace), "a SQLite-only test"
        return self.place.path

    def dump(self) -> dict[str, Any]:
        return self.place.dump()

    def rows(self, table: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.dump()["tables"][table]
        return rows

    def sql(self, statement: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Raw SQL on a second connection (inspection and states the API cannot reach)."""
        return self.place.sql(statement, parameters)

    def insert(self, table: Any, **values: Any) -> None:
        """A Core insert on a second connection (rows owned by other modules)."""
        self.place.insert(table, **values)

    def events(self, occurrence_id: str) -> list[dict[str, Any]]:
        """The occurrence's events, oldest first, as dicts."""
        return [event.to_dict() for event in reversed(self.store.history(occurrence_id=occurrence_id))]

    # ------------------------------------------------------------------ API shortcuts

    def job(self, job_id: str = "agenda-a", **overrides: Any) -> Any:
        arguments: dict[str, Any] = {
            "id": job_id,
            "kind": "agenda",
            "authority": AUTHORITY,
            "trigger": {"type": "cron", "expression": "0 * * * *"},
            "payload": {"job": job_id},
        }
        arguments.update(overrides)
        self.tick()
        return self.store.create_job(**arguments)

    def enqueue(self, job_id: str = "agenda-a", trigger_key: str = "t1", **overrides: Any) -> Occurrence:
        arguments: dict[str, Any] = {"job_id": job_id, "scheduled_for": T0, "trigger_key": trigger_key}
        arguments.update(overrides)
        self.tick()
        return self.store.enqueue_occurrence(**arguments)

    def claim(self, occurrence_id: str, owner: str = "w1", lease_ms: int = 60_000) -> Occurrence:
        self.tick()
        claimed = self.store.claim_occurrence(occurrence_id=occurrence_id, owner_id=owner, lease_ms=lease_ms)
        assert claimed is not None, f"{occurrence_id} was not claimable"
        return claimed

    def running(self, job_id: str = "agenda-a", trigger_key: str = "t1", **claim: Any) -> Occurrence:
        return self.claim(self.enqueue(job_id, trigger_key).id, **claim)

    def fail(self, occurrence: Occurrence, **overrides: Any) -> Occurrence:
        arguments: dict[str, Any] = {
            "occurrence_id": occurrence.id,
            "owner_id": occurrence.lease_owner,
            "fence": occurrence.fence,
            "outcome": "failed",
        }
        arguments.update(overrides)
        self.tick()
        return self.store.settle(**arguments)

    def succeed(self, occurrence: Occurrence, **overrides: Any) -> Occurrence:
        arguments: dict[str, Any] = {
            "occurrence_id": occurrence.id,
            "owner_id": occurrence.lease_owner,
            "fence": occurrence.fence,
            "outcome": "succeeded",
        }
        arguments.update(overrides)
        self.tick()
        return self.store.settle(**arguments)

    # ------------------------------------------------------------------ foreign rows

    def control(self, occurrence_id: str, state: str, expected_fence: int, revision: int = 1) -> None:
        """A runtime-control row in ``state`` (as runtime_control.py would leave it)."""
        self.insert(
            t.occurrence_controls,
            occurrence_id=occurrence_id,
            capability_json=CAPABILITY_JSON,
            capability_digest=CAPABILITY_DIGEST,
            state=state,
            revision=revision,
            pause_request_id=f"pause-{occurrence_id[:12]}",
            resume_request_id=f"resume-{occurrence_id[:12]}" if state == "resumed" else None,
            expected_fence=expected_fence,
            checkpoint_json='{"data":null,"safePoint":"adapter_checkpoint","schemaVersion":1}'
            if state in ("paused", "resumed")
            else None,
            requested_at=T0,
            paused_at=T0 if state in ("paused", "resumed") else None,
            resumed_at=T0 if state == "resumed" else None,
            terminal_at=T0 if state == "terminal" else None,
            updated_at=T0,
        )

    def retry_request(self, occurrence_id: str, request_id: str, expected_fence: int, **extra: Any) -> None:
        """An unclaimed requeue request (as requeue_dead_letter would record it)."""
        self.insert(
            t.occurrence_retries,
            occurrence_id=occurrence_id,
            request_id=request_id,
            expected_fence=expected_fence,
            expected_error_code=extra.get("expected_error_code", "execution_failed"),
            created_at=extra.get("created_at", T0),
            claimed_at=extra.get("claimed_at"),
        )

    def reservation(self, occurrence: Occurrence, *, policy_revision: int = 2, units: int = 3) -> None:
        """A ``reserved`` authority reservation for a running occurrence."""
        self.insert(
            t.authority_reservations,
            occurrence_id=occurrence.id,
            job_id=occurrence.job_id,
            principal_type="user",
            principal_id="user-alice",
            policy_revision=policy_revision,
            window_started_at=T0,
            units=units,
            status="reserved",
            outcome_json=None,
            created_at=T0,
            settled_at=None,
        )

    def adjudication(self, occurrence: Occurrence, request_id: str = "adj-1") -> None:
        """A ``pending`` adjudication of an occurrence."""
        self.insert(
            t.adjudications,
            occurrence_id=occurrence.id,
            job_id=occurrence.job_id,
            request_id=request_id,
            decision="confirmed_not_applied",
            authority="local-operator",
            evidence_digest=DIGEST,
            expected_attempt=max(occurrence.attempt, 1),
            expected_fence=max(occurrence.fence, 1),
            reason_digest=DIGEST,
            operator_digest=DIGEST,
            status="pending",
            created_at=T0,
            applied_at=None,
            retry_settled_at=None,
            retry_outcome_json=None,
        )


@contextmanager
def env_at(
    where: Path | StorePlace, name: str = "kernel.sqlite", now: int = T0, **options: Any
) -> Iterator[Env]:
    """An ``Env`` in a place, or in the SQLite file ``name`` of the directory ``where``."""
    place = SqliteFilePlace(where / name) if isinstance(where, Path) else where
    env = Env(place, now, **options)
    try:
        yield env
    finally:
        env.store.close()


def settlement(occurrence: Any, outcome: str = "succeeded", **extra: Any) -> dict[str, Any]:
    """``settle``'s keyword arguments for the holder of ``occurrence`` (a ``settle_many`` item)."""
    return {
        "occurrence_id": occurrence.id,
        "owner_id": occurrence.lease_owner,
        "fence": occurrence.fence,
        "outcome": outcome,
        **extra,
    }


def expect_error(code: str, call: Callable[[], Any]) -> SchedulerKernelError:
    with pytest.raises(SchedulerKernelError) as caught:
        call()
    assert caught.value.code == code, f"{caught.value.code}: {caught.value.message}"
    return caught.value


@contextmanager
def refused_claims(env: Env) -> Iterator[None]:
    """A trigger that makes every claim UPDATE fail ('claim refused') while the block runs.

    SQLite: a TEMP trigger on the store's own connection (not part of the stored catalog).
    PostgreSQL: a trigger and its function in the store's schema, dropped afterwards.
    """
    if env.place.backend == SQLITE:
        dbapi: Any = env.store.connection.connection.dbapi_connection
        dbapi.execute(
            "CREATE TEMP TRIGGER refuse_claim BEFORE UPDATE OF lease_owner ON main.occurrences "
            "WHEN NEW.lease_owner IS NOT NULL BEGIN SELECT RAISE(ABORT, 'claim refused'); END"
        )
        try:
            yield
        finally:
            dbapi.execute("DROP TRIGGER refuse_claim")
        return
    env.sql(
        "CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql "
        "AS $$ BEGIN RAISE EXCEPTION 'claim refused'; END $$"
    )
    env.sql(
        "CREATE TRIGGER refuse_claim BEFORE UPDATE OF lease_owner ON occurrences FOR EACH ROW "
        "WHEN (NEW.lease_owner IS NOT NULL) EXECUTE FUNCTION refuse_claim()"
    )
    try:
        yield
    finally:
        env.sql("DROP TRIGGER refuse_claim ON occurrences")
        env.sql("DROP FUNCTION refuse_claim()")
