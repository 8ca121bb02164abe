"""Shared helpers of the governance tests (authority, adjudication, runtime control, requeue).

Every helper drives the public API of a real store in a ``place`` (a SQLite file or a fresh
PostgreSQL schema, ``store_places.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from recorded import REFERENCE_DBS as REFERENCE_DBS
from recorded import T0 as T0
from recorded import UPGRADE_NOW as UPGRADE_NOW
from recorded import copy_reference as copy_reference
from store_places import SqliteFilePlace, StorePlace

from scheduler import SchedulerKernelError, SchedulerStore
from scheduler.contract.canonical import canonical_json
from scheduler.store.records import Occurrence

ALICE = {"type": "user", "id": "user-alice"}
ALICE_AUTHORITY: dict[str, Any] = {
    "principal": ALICE,
    "tenantId": "tenant-acme",
    "workspaceId": "ws-main",
    "requestedCapabilities": ["notify.desktop", "calendar.read"],
}
CHECKPOINT_CAPABILITY: dict[str, Any] = {
    "pauseResume": "checkpoint_v1",
    "safePoints": ["adapter_checkpoint", "before_execute"],
}
OUTCOME_UNKNOWN = {"code": "AGENDA_OUTCOME_UNKNOWN", "message": "transport reset"}


class Env:
    """A store in ``place`` with a controllable clock (``env.now``, ``env.tick()``)."""

    def __init__(self, place: Path | StorePlace, now: int = T0) -> None:
        place = SqliteFilePlace(place) if isinstance(place, Path) else place
        self.place = place
        self.clock = {"now": now}
        self.store: SchedulerStore = place.open(clock=lambda: self.clock["now"])

    @property
    def now(self) -> int:
        return self.clock["now"]

    def tick(self, ms: int = 1000) -> int:
        self.clock["now"] += ms
        return self.clock["now"]

    def at(self, now: int) -> SchedulerStore:
        self.clock["now"] = now
        return self.store

    def reopen(self) -> SchedulerStore:
        self.store.close()
        self.store = self.place.open(clock=lambda: self.clock["now"])
        return self.store

    @property
    def path(self) -> Path:
        """The SQLite file (tests that read the file itself are SQLite-only)."""
        assert isinstance(self.place, SqliteFilePlace), "a SQLite-only test"
        return self.place.path

    def dump(self) -> dict[str, Any]:
        return self.place.dump()

    def sql(self, statement: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run raw SQL on a second connection (test setup of states the API refuses to create)."""
        return self.place.sql(statement, parameters)

    def events(self, occurrence_id: str) -> list[dict[str, Any]]:
        return [event.to_dict() for event in reversed(self.store.history(occurrence_id=occurrence_id))]


@contextmanager
def env_at(where: Path | StorePlace, name: str = "kernel.sqlite", now: int = T0) -> Iterator[Env]:
    """An ``Env`` in a place, or in the SQLite file ``name`` of the directory ``where``."""
    env = Env(SqliteFilePlace(where / name) if isinstance(where, Path) else where, now)
    try:
        yield env
    finally:
        env.store.close()


def expect_error(code: str, call: Callable[[], Any]) -> SchedulerKernelError:
    with pytest.raises(SchedulerKernelError) as caught:
        call()
    assert caught.value.code == code, f"{caught.value.code}: {caught.value.message}"
    return caught.value


def create_job(
    env: Env,
    job_id: str = "agenda-gov",
    *,
    kind: str = "agenda",
    authority: dict[str, Any] | None = None,
    max_attempts: int = 3,
) -> None:
    env.tick()
    env.store.create_job(
        id=job_id,
        kind=kind,
        authority=ALICE_AUTHORITY if authority is None else authority,
        trigger={"type": "cron", "expression": "0 * * * *"},
        payload={"job": job_id},
        max_attempts=max_attempts,
    )


def enqueue(env: Env, job_id: str, trigger_key: str) -> Occurrence:
    env.tick()
    return env.store.enqueue_occurrence(job_id=job_id, scheduled_for=T0, trigger_key=trigger_key)


def claim(env: Env, occurrence_id: str, owner: str = "w1", lease_ms: int = 600_000) -> Occurrence:
    env.tick()
    claimed = env.store.claim_occurrence(occurrence_id=occurrence_id, owner_id=owner, lease_ms=lease_ms)
    assert claimed is not None, f"{occurrence_id} was not claimable"
    return claimed


def running(
    env: Env, job_id: str, trigger_key: str, owner: str = "w1", lease_ms: int = 600_000
) -> Occurrence:
    """Enqueue and claim one occurrence of ``job_id``."""
    return claim(env, enqueue(env, job_id, trigger_key).id, owner, lease_ms)


def settle_failed(
    env: Env, occurrence: Occurrence, error: Any, *, retryable: bool = True, owner: str | None = None
) -> Occurrence:
    env.tick()
    return env.store.settle(
        occurrence_id=occurrence.id,
        owner_id=owner or occurrence.lease_owner or "w1",
        fence=occurrence.fence,
        outcome="failed",
        error=error,
        retryable=retryable,
    )


def settle_succeeded(env: Env, occurrence: Occurrence, result: Any = None, **extra: Any) -> Occurrence:
    env.tick()
    return env.store.settle(
        occurrence_id=occurrence.id,
        owner_id=occurrence.lease_owner or "w1",
        fence=occurrence.fence,
        outcome="succeeded",
        result=result,
        **extra,
    )


def set_policy(env: Env, principal: dict[str, str] = ALICE, **overrides: Any) -> Any:
    env.tick()
    arguments: dict[str, Any] = {
        "capabilities": ["calendar.read", "notify.desktop"],
        "window_ms": 3_600_000,
        "max_runs": 10,
        "max_units": 100,
    }
    arguments.update(overrides)
    return env.store.set_authority_policy(principal, **arguments)


def outcome_unknown_dead_letter(
    env: Env, job_id: str, trigger_key: str, *, reserve: bool = True
) -> Occurrence:
    """A dead letter whose error code is ``*_OUTCOME_UNKNOWN`` (optionally with a failed reservation)."""
    occurrence = running(env, job_id, trigger_key)
    if reserve:
        policy = env.store.get_authority_policy(ALICE)
        assert policy is not None
        env.tick()
        env.store.reserve_authority(occurrence_id=occurrence.id, policy_revision=policy.revision)
    dead = settle_failed(env, occurrence, OUTCOME_UNKNOWN, retryable=False)
    assert dead.status == "dead_letter"
    return dead


def adjudicate(
    env: Env, occurrence_id: str, decision: str = "confirmed_not_applied", /, **overrides: Any
) -> Any:
    """``adjudicate_occurrence`` of the occurrence's current case (its evidence, attempt and fence)."""
    case = env.store.get_adjudication_case(occurrence_id)
    assert case is not None
    arguments = {
        "occurrence_id": occurrence_id,
        "decision": decision,
        "expected_evidence_digest": case.evidence_digest,
        "expected_attempt": case.attempt,
        "expected_fence": case.fence,
        "reason_digest": "sha256:" + "0" * 64,
        "operator_digest": "sha256:" + "1" * 64,
    }
    arguments.update(overrides)
    env.tick()
    return env.store.adjudicate_occurrence(**arguments)


# --------------------------------------------------------------------------- runtime control


def request_pause(env: Env, occurrence: Occurrence, request_id: str = "pause-1", **extra: Any) -> Any:
    env.tick()
    arguments: dict[str, Any] = {
        "occurrence_id": occurrence.id,
        "expected_fence": occurrence.fence,
        "request_id": request_id,
        "capability": CHECKPOINT_CAPABILITY,
    }
    arguments.update(extra)
    return env.store.request_occurrence_pause(**arguments)


def ack(env: Env, occurrence: Occurrence, request_id: str = "pause-1", **extra: Any) -> Any:
    env.tick()
    control = env.store.get_occurrence_control(occurrence.id)
    arguments: dict[str, Any] = {
        "occurrence_id": occurrence.id,
        "owner_id": occurrence.lease_owner,
        "fence": occurrence.fence,
        "request_id": request_id,
        "expected_revision": control.revision if control else 1,
        "safe_point": "adapter_checkpoint",
    }
    arguments.update(extra)
    return env.store.ack_occurrence_pause(**arguments)


def resume(env: Env, occurrence_id: str, request_id: str = "resume-1", revision: int | None = None) -> Any:
    env.tick()
    control = env.store.get_occurrence_control(occurrence_id)
    expected = revision if revision is not None else (control.revision if control else 1)
    return env.store.resume_occurrence(
        occurrence_id=occurrence_id, expected_revision=expected, request_id=request_id
    )


def paused(env: Env, trigger: str = "p1", checkpoint: Any = None) -> Occurrence:
    occurrence = running(env, "agenda-pause", trigger)
    request_pause(env, occurrence, f"pause-{trigger}")
    ack(env, occurrence, f"pause-{trigger}", checkpoint=checkpoint)
    return occurrence


# --------------------------------------------------------------------------- adjudication evidence


def digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def expected_evidence(env: Env, occurrence_id: str) -> dict[str, Any]:
    """The seed's evidence document, built independently from the public records."""
    occurrence = env.store.get_occurrence(occurrence_id)
    reservation = env.store.get_authority_reservation(occurrence_id)
    assert occurrence is not None
    return {
        "schemaVersion": 1,
        "occurrence": {
            "id": occurrence.id,
            "jobId": occurrence.job_id,
            "jobRevision": occurrence.job_revision,
            "idempotencyKey": occurrence.idempotency_key,
            "triggerKey": occurrence.trigger_key,
            "scheduledFor": occurrence.scheduled_for,
            "status": occurrence.status,
            "attempt": occurrence.attempt,
            "maxAttempts": occurrence.max_attempts,
            "fence": occurrence.fence,
            "authorityDigest": digest(occurrence.authority),
            "payloadDigest": digest(occurrence.payload),
            "lastError": occurrence.last_error,
            "settledAt": occurrence.settled_at,
        },
        "reservation": None
        if reservation is None
        else {
            "jobId": reservation.job_id,
            "principal": reservation.principal,
            "policyRevision": reservation.policy_revision,
            "windowStartedAt": reservation.window_started_at,
            "units": reservation.units,
            "status": reservation.status,
            "outcomeDigest": None if reservation.outcome is None else digest(reservation.outcome),
            "createdAt": reservation.created_at,
            "settledAt": reservation.settled_at,
        },
    }
