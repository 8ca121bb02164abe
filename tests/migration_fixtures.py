"""Shared helpers for the domain-migration tests (plans, a controllable store, DB inspection)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from recorded import T0 as T0
from store_places import SqliteFilePlace, StorePlace

from scheduler import SchedulerKernelError
from scheduler.store.facade import SchedulerStore

UUID_PREFIX = "00000000-0000-4000-8000-"

AGENDA_SCOPE = {"store": "agent-schedule", "directory": "/home/alice/.chainlesschain/agenda"}
AGENDA_LOCATOR = {
    "schemaVersion": 1,
    "type": "agenda-store",
    "directory": "/home/alice/.chainlesschain/agenda",
}
COWORK_SCOPE = {"store": "cowork-schedules", "workspace": "/srv/cowork/alpha"}
COWORK_LOCATOR = {"schemaVersion": 1, "type": "cowork-workspace", "workspace": "/srv/cowork/alpha"}
AGENDA_SOURCE = {"id": "legacy-agenda-42", "title": "Reminder 42", "cron": "0 8 * * *"}
COWORK_SOURCE = {"id": "cowork-7", "schedule": "0 */2 * * *", "prompt": "Task 7"}

ALICE = {
    "principal": {"type": "user", "id": "user-alice"},
    "workspaceId": "ws-main",
    "requestedCapabilities": ["notify.desktop"],
}
COWORK_DAEMON = {
    "principal": {"type": "service", "id": "cowork-daemon"},
    "workspaceId": "ws-cowork",
    "requestedCapabilities": ["cowork.sync"],
}


def uuid_for(k: int) -> str:
    return f"{UUID_PREFIX}{k:012x}"


class Harness:
    """A store in a ``place`` (a SQLite file or a PostgreSQL schema, ``store_places.py``) with a
    settable clock and a counting UUID source."""

    def __init__(self, place: Path | StorePlace) -> None:
        self.place = SqliteFilePlace(place) if isinstance(place, Path) else place
        self.now = T0
        self.issued: list[str] = []
        self.store = self.open()

    @property
    def path(self) -> Path:
        """The SQLite file (tests that read the file itself are SQLite-only)."""
        assert isinstance(self.place, SqliteFilePlace), "a SQLite-only test"
        return self.place.path

    def _uuid(self) -> str:
        value = uuid_for(len(self.issued) + 1)
        self.issued.append(value)
        return value

    def open(self) -> SchedulerStore:
        return self.place.open(clock=lambda: self.now, uuid_factory=self._uuid)

    def reopen(self) -> SchedulerStore:
        self.store.close()
        self.store = self.open()
        return self.store

    def tick(self, ms: int = 1000) -> int:
        self.now += ms
        return self.now

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Read the database directly (a second connection), bypassing the store."""
        return self.place.sql(sql, params)

    def snapshot(self) -> dict[str, Any]:
        """Every table's rows (``place.dump()``), to compare before and after a refused call."""
        return self.place.dump()

    def execute(self, sql: str, *params: Any) -> None:
        """Write the database directly (simulates damage or a foreign writer); the store is closed first."""
        self.store.close()
        self.place.sql(sql, params)
        self.store = self.open()


def harness_in(place: Path | StorePlace) -> Iterator[Harness]:
    """Body of each test module's ``h`` fixture."""
    h = Harness(place / "kernel.sqlite" if isinstance(place, Path) else place)
    try:
        yield h
    finally:
        h.store.close()


def target_job(job_id: str, kind: str = "agenda", **overrides: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "id": job_id,
        "kind": kind,
        "trigger": {"type": "cron", "expression": "0 8 * * *"},
        "payload": {"title": job_id},
        "authority": copy.deepcopy(COWORK_DAEMON if kind == "cowork-cron" else ALICE),
        "maxAttempts": 3,
    }
    job.update(overrides)
    return job


def agenda_entry(number: int = 42, **overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "domain": "agenda",
        "sourceId": f"legacy-agenda-{number}",
        "sourceScope": dict(AGENDA_SCOPE),
        "source": {"id": f"legacy-agenda-{number}", "title": f"Reminder {number}", "cron": "0 8 * * *"},
        "targetJob": target_job(f"agenda-migrated-{number}"),
        "rollbackStrategy": "restore",
    }
    entry.update(overrides)
    return entry


def cowork_entry(number: int = 7, **overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "domain": "cowork-cron",
        "sourceId": f"cowork-{number}",
        "sourceScope": dict(COWORK_SCOPE),
        "source": {"id": f"cowork-{number}", "schedule": "0 */2 * * *", "prompt": f"Task {number}"},
        "targetJob": target_job(f"cowork-cron-migrated-{number}", "cowork-cron"),
        "rollbackStrategy": "disable",
    }
    entry.update(overrides)
    return entry


def plan(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"entries": list(entries) or [agenda_entry()]}


def sources_of(migration_plan: dict[str, Any], migration: Any) -> list[dict[str, Any]]:
    """The ``verify`` argument: every plan source keyed by the journal's entry id."""
    by_source = {entry["sourceId"]: entry["source"] for entry in migration_plan["entries"]}
    return [{"entryId": e.entry_id, "source": by_source[e.source_id]} for e in migration.entries]


def raises(code: str, call: Callable[[], Any]) -> SchedulerKernelError:
    with pytest.raises(SchedulerKernelError) as caught:
        call()
    assert caught.value.code == code, (caught.value.code, caught.value.message)
    return caught.value


def run_to_retiring(h: Harness, migration_plan: dict[str, Any]) -> Any:
    """prepare → apply → verify → begin retirement; returns the retiring migration."""
    store = h.store
    h.tick()
    migration = store.prepare_domain_migration(migration_plan)
    h.tick()
    store.apply_domain_migration(migration.id)
    h.tick()
    store.verify_domain_migration(migration.id, sources=sources_of(migration_plan, migration))
    h.tick()
    return store.begin_domain_migration_retirement(migration.id)


def retire_all(h: Harness, migration_plan: dict[str, Any], migration: Any) -> Any:
    """Confirm every entry of a retiring migration; returns the migration afterwards."""
    for entry in migration.entries:
        h.tick()
        h.store.confirm_domain_migration_entry_retired(
            migration_id=migration.id,
            entry_id=entry.entry_id,
            retirement_token=entry.retirement_token,
            source={"retired": entry.source_id},
        )
    return h.store.get_domain_migration(migration.id)
