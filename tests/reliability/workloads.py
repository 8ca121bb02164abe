"""Code that runs in child processes (``python -c`` bootstrap, see ``command``).

* ``crash`` — random writes through the public API forever; after every call returns it
  reports what was committed as one JSON line on stdout (the parent SIGKILLs it at random).
* ``race`` — one worker of the lease race: claim, renew after random delays, sometimes let
  the lease expire on purpose, settle; logs every call with its wall-clock interval.
* ``open`` — open (create or upgrade) a store and report; killed during the upgrade.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduler import SchedulerKernelError, derive_occurrence_identity, open_store
from scheduler.store import SchedulerStore

Emit = Callable[[dict[str, Any]], None]

AUTHORITY = {
    "principal": {"type": "service", "id": "reliability"},
    "workspaceId": "ws-reliability",
    "requestedCapabilities": ["run"],
}
PRINCIPAL = AUTHORITY["principal"]
CAPABILITY = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint", "before_execute"]}
SETTLE_EVENT = {
    "succeeded": "occurrence_succeeded",
    "retry_wait": "occurrence_retry_scheduled",
    "dead_letter": "occurrence_dead_lettered",
}
# Codes a random workload legitimately meets (time passes, other actors, stale knowledge).
EXPECTED_CODES = frozenset(
    {
        "SCHEDULER_LEASE_LOST",
        "SCHEDULER_CLAIM_CONFLICT",
        "SCHEDULER_REVISION_CONFLICT",
        "SCHEDULER_OCCURRENCE_CONTROL_CONFLICT",
        "SCHEDULER_OCCURRENCE_NOT_RUNNING",
        "SCHEDULER_FENCE_CONFLICT",
        "SCHEDULER_REQUEUE_CONFLICT",
        "SCHEDULER_REQUEUE_EVIDENCE_CONFLICT",
        "SCHEDULER_AUTHORITY_POLICY_STALE",
        "SCHEDULER_AUTHORITY_BUDGET_EXHAUSTED",
        "SCHEDULER_AUTHORITY_OCCURRENCE_NOT_RUNNING",
        "SCHEDULER_AUTHORITY_RESERVATION_MISMATCH",
        "SCHEDULER_JOB_DISABLED",
    }
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def command(kind: str, *args: object) -> list[str]:
    """argv that runs ``main([kind, *args])`` of this module in a fresh interpreter."""
    here = Path(__file__).resolve()
    package_root = here.parents[__name__.count(".")]
    repo = here.parents[2]
    bootstrap = (
        "import sys, importlib; "
        f"sys.path[:0] = [{str(package_root)!r}, {str(repo)!r}]; "
        f"importlib.import_module({__name__!r}).main(sys.argv[1:])"
    )
    return [sys.executable, "-c", bootstrap, kind, *map(str, args)]


def line_emitter(stream: Any) -> Emit:
    def emit(record: dict[str, Any]) -> None:
        stream.write(json.dumps(record, separators=(",", ":")) + "\n")
        stream.flush()

    return emit


# ----------------------------------------------------------------------------- crash workload


class CrashActor:
    """Random valid operations; ``emit`` is called only after a write call returned."""

    def __init__(self, store: SchedulerStore, rng: random.Random, emit: Emit) -> None:
        self.store, self.rng, self.emit = store, rng, emit
        self.owner = f"crash-{os.getpid()}"
        self.held: dict[str, int] = {}
        self.pending: dict[str, tuple[str, int, int]] = {}  # occ -> (request, control revision, fence)
        self.paused: dict[str, int] = {}
        self.jobs: list[str] = [f"job-{n}" for n in range(6) if store.get_job(f"job-{n}") is not None]
        self.serial = 0

    def unique(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}-{os.getpid()}-{self.serial}"

    def bootstrap(self) -> None:
        if self.store.get_authority_policy(PRINCIPAL) is None:
            policy = self.store.ensure_authority_policy(AUTHORITY)
            self.emit({"op": "policy", "revision": policy.revision})
        if not self.jobs:
            self.create_job()
        for item in self.store.list_runtime_control_occurrences(statuses=["paused"], limit=200):
            if item.control is not None:
                self.paused[item.id] = item.control.revision

    def step(self) -> None:
        ops: list[tuple[Callable[[], None], int]] = [
            (self.create_job, 2 if len(self.jobs) < 6 else 0),
            (self.update_job, 3),
            (self.enqueue, 18),
            (self.enqueue_many, 5),
            (self.claim, 18),
            (self.claim_batch, 5),
            (self.renew, 10),
            (self.settle, 20),
            (self.settle_many, 4),
            (self.reserve, 6),
            (self.request_pause, 4),
            (self.ack_pause, 4),
            (self.resume, 3),
            (self.requeue, 3),
            (self.set_policy, 1),
        ]
        operation = self.rng.choices([op for op, _ in ops], weights=[w for _, w in ops])[0]
        try:
            operation()
        except SchedulerKernelError as error:
            if error.code not in EXPECTED_CODES:
                raise
            self.emit({"expected_error": error.code, "in": operation.__name__})

    # -- jobs and enqueue
    def create_job(self) -> None:
        job_id = f"job-{len(self.jobs)}"
        if self.store.get_job(job_id) is None:
            self.store.create_job(
                id=job_id, kind="agenda", authority=AUTHORITY, max_attempts=self.rng.randint(1, 4)
            )
            self.emit({"op": "create_job", "job": job_id})
        self.jobs.append(job_id)

    def update_job(self) -> None:
        job = self.store.get_job(self.rng.choice(self.jobs))
        assert job is not None
        updated = self.store.update_job(
            job.id,
            job.revision,
            max_attempts=self.rng.randint(1, 4),
            payload={"v": self.rng.randrange(10**6)},
        )
        self.emit({"op": "update_job", "job": job.id, "revision": updated.revision})

    def _request(self) -> dict[str, Any]:
        now = now_ms()
        return {
            "job_id": self.rng.choice(self.jobs),
            "scheduled_for": now - self.rng.randrange(10**6),
            "trigger_key": f"t-{self.rng.randrange(400)}",
            "available_at": now,
            "payload": {"n": self.rng.randrange(3)},
        }

    def _report_enqueued(self, occurrence: Any) -> None:
        self.emit({"op": "enqueue", "occ": occurrence.id, "new": not occurrence.deduplicated})

    def enqueue(self) -> None:
        try:
            self._report_enqueued(self.store.enqueue_occurrence(**self._request()))
        except SchedulerKernelError as error:
            if error.code != "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH":
                raise

    def enqueue_many(self) -> None:
        requests = [self._request() for _ in range(self.rng.randint(2, 4))]
        occurrences = []
        for request in requests:
            request["trigger_key"] = self.unique("batch")
            job = self.store.get_job(request["job_id"])
            assert job is not None
            identity = derive_occurrence_identity(
                job_id=job.id,
                job_revision=job.revision,
                scheduled_for=request["scheduled_for"],
                trigger_key=request["trigger_key"],
            )
            occurrences.append(identity.occurrence_id)
        self.emit({"intent": "enqueue_many", "occs": occurrences})  # all or none must exist after a kill
        for occurrence in self.store.enqueue_many(requests):
            self._report_enqueued(occurrence)

    # -- leases
    def _lease(self) -> int:
        return self.rng.choice([150, 400, 1500, 4000])

    def _report_claim(self, occurrence: Any) -> None:
        self.held[occurrence.id] = occurrence.fence
        self.emit({"op": "claim", "occ": occurrence.id, "fence": occurrence.fence, "owner": self.owner})

    def claim(self) -> None:
        occurrence = self.store.claim_next(owner_id=self.owner, lease_ms=self._lease())
        if occurrence is not None:
            self._report_claim(occurrence)

    def claim_batch(self) -> None:
        for occurrence in self.store.claim_batch(owner_id=self.owner, lease_ms=self._lease(), limit=3):
            self._report_claim(occurrence)

    def _held(self) -> tuple[str, int] | None:
        if not self.held:
            return None
        occ = self.rng.choice(sorted(self.held))
        return occ, self.held[occ]

    def renew(self) -> None:
        held = self._held()
        if held is None:
            return
        try:
            renewed = self.store.renew(
                occurrence_id=held[0], owner_id=self.owner, fence=held[1], lease_ms=self._lease()
            )
        except SchedulerKernelError:
            self.held.pop(held[0], None)
            raise
        self.emit(
            {
                "op": "renew",
                "occ": held[0],
                "fence": held[1],
                "owner": self.owner,
                "until": renewed.lease_expires_at,
            }
        )

    def _settlement(self, occ: str, fence: int) -> dict[str, Any]:
        outcome = self.rng.choice(["succeeded", "failed"])
        settlement: dict[str, Any] = {
            "occurrence_id": occ,
            "owner_id": self.owner,
            "fence": fence,
            "outcome": outcome,
        }
        if outcome == "succeeded":
            settlement["result"] = {"ok": self.rng.randrange(100)}
        else:
            unknown = self.rng.random() < 0.3
            settlement["error"] = {"code": "RUN_OUTCOME_UNKNOWN" if unknown else "boom", "message": "x"}
            settlement["retryable"] = not unknown and self.rng.random() < 0.8
        return settlement

    def _report_settled(self, occurrence: Any, fence: int) -> None:
        self.held.pop(occurrence.id, None)
        self.pending.pop(occurrence.id, None)
        event = SETTLE_EVENT[occurrence.status]
        self.emit({"op": "settle", "occ": occurrence.id, "fence": fence, "event": event, "owner": self.owner})

    def settle(self) -> None:
        held = self._held()
        if held is None:
            return
        try:
            settled = self.store.settle(**self._settlement(*held))
        except SchedulerKernelError:
            self.held.pop(held[0], None)
            raise
        self._report_settled(settled, held[1])

    def settle_many(self) -> None:
        chosen = sorted(self.held)[:2]
        if not chosen:
            return
        fences = [self.held[occ] for occ in chosen]
        items = [[occ, fence, self.owner] for occ, fence in zip(chosen, fences, strict=True)]
        self.emit({"intent": "settle_many", "items": items})  # all or none must be settled after a kill
        try:
            settled = self.store.settle_many([self._settlement(occ, self.held[occ]) for occ in chosen])
        except SchedulerKernelError:
            for occ in chosen:
                self.held.pop(occ, None)
            raise
        for occurrence, fence in zip(settled, fences, strict=True):
            self._report_settled(occurrence, fence)

    # -- authority
    def reserve(self) -> None:
        held = self._held()
        policy = self.store.get_authority_policy(PRINCIPAL)
        if held is None or policy is None:
            return
        units = self.rng.randint(1, 3)
        reservation = self.store.reserve_authority(
            occurrence_id=held[0], policy_revision=policy.revision, units=units
        )
        if not reservation.deduplicated:
            self.emit({"op": "reserve", "occ": held[0], "units": units})

    def set_policy(self) -> None:
        current = self.store.get_authority_policy(PRINCIPAL)
        policy = self.store.set_authority_policy(
            PRINCIPAL,
            capabilities=["run"],
            window_ms=60_000 * self.rng.randint(1, 5),
            max_runs=100_000,
            max_units=100_000,
            expected_revision=None if current is None else current.revision,
        )
        self.emit({"op": "policy", "revision": policy.revision})

    # -- runtime control
    def request_pause(self) -> None:
        held = self._held()
        if held is None or held[0] in self.pending:
            return
        request = self.unique("pause")
        control = self.store.request_occurrence_pause(
            occurrence_id=held[0], expected_fence=held[1], request_id=request, capability=CAPABILITY
        )
        self.pending[held[0]] = (request, control.revision, held[1])
        self.emit({"op": "pause", "occ": held[0], "request": request})

    def ack_pause(self) -> None:
        if not self.pending:
            return
        occ = self.rng.choice(sorted(self.pending))
        request, revision, fence = self.pending.pop(occ)
        self.held.pop(occ, None)
        result = self.store.ack_occurrence_pause(
            occurrence_id=occ,
            owner_id=self.owner,
            fence=fence,
            request_id=request,
            expected_revision=revision,
            safe_point=self.rng.choice(["adapter_checkpoint", "before_execute"]),
            checkpoint={"step": self.rng.randrange(10)},
        )
        self.paused[occ] = result.control.revision
        self.emit({"op": "ack", "occ": occ, "request": request})

    def resume(self) -> None:
        if not self.paused:
            return
        occ = self.rng.choice(sorted(self.paused))
        revision = self.paused.pop(occ)
        request = self.unique("resume")
        self.store.resume_occurrence(occurrence_id=occ, expected_revision=revision, request_id=request)
        self.emit({"op": "resume", "occ": occ, "request": request})

    def requeue(self) -> None:
        letters = self.store.list_dead_letters(limit=20)
        if not letters:
            return
        letter = self.rng.choice(letters)
        code = letter.last_error.get("code") if isinstance(letter.last_error, dict) else None
        if not isinstance(code, str):
            return
        request = self.unique("requeue")
        self.store.requeue_dead_letter(
            occurrence_id=letter.id, expected_fence=letter.fence, expected_error_code=code, request_id=request
        )
        self.emit({"op": "requeue", "occ": letter.id, "request": request})


def crash_main(db: str, seed: int) -> None:
    emit = line_emitter(sys.stdout)
    store = open_store(db)
    emit({"ready": True, "pid": os.getpid()})
    actor = CrashActor(store, random.Random(seed), emit)
    actor.bootstrap()
    while True:
        actor.step()


# ----------------------------------------------------------------------------- lease race worker


def remaining(db: str) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        row = con.execute("SELECT COUNT(*) FROM occurrences WHERE status NOT IN ('succeeded', 'dead_letter')")
        return int(row.fetchone()[0])
    finally:
        con.close()


class RaceWorker:
    """Claims until nothing is left; every call is logged as one JSON line with its interval."""

    def __init__(
        self, store: SchedulerStore, index: int, rng: random.Random, emit: Emit, lease_ms: int
    ) -> None:
        self.store, self.rng, self.emit, self.lease_ms = store, rng, emit, lease_ms
        self.owner = f"worker-{index}"

    def call(self, kind: str, fn: Callable[[], Any], **fields: Any) -> Any:
        start = now_ms()
        try:
            result = fn()
        except SchedulerKernelError as error:
            self.emit(
                {
                    "t": kind,
                    "owner": self.owner,
                    "start": start,
                    "end": now_ms(),
                    "error": error.code,
                    **fields,
                }
            )
            return error
        record = {"t": kind, "owner": self.owner, "start": start, "end": now_ms(), **fields}
        if result is not None and hasattr(result, "fence"):
            record.update(
                occ=result.id, fence=result.fence, expires=result.lease_expires_at, status=result.status
            )
        self.emit(record)
        return result

    def work(self, db: str, expiry_rate: float, failure_rate: float) -> None:
        idle = 0
        while True:
            claimed = self.call(
                "claim", lambda: self.store.claim_next(owner_id=self.owner, lease_ms=self.lease_ms)
            )
            if claimed is None or isinstance(claimed, SchedulerKernelError):
                idle += 1
                if idle % 5 == 0 and remaining(db) == 0:
                    return
                time.sleep(0.01)
                continue
            idle = 0
            self.hold(claimed.id, claimed.fence, claimed.lease_expires_at, expiry_rate, failure_rate)

    def hold(self, occ: str, fence: int, expires: int, expiry_rate: float, failure_rate: float) -> None:
        ids = {"occ": occ, "fence": fence}
        if self.rng.random() < expiry_rate:  # deliberate expiry: come back after the lease ran out
            time.sleep(max(0, expires - now_ms()) / 1000 + self.rng.uniform(0.005, 0.3))
            self.call(
                "renew",
                lambda: self.store.renew(
                    lease_ms=self.lease_ms, owner_id=self.owner, occurrence_id=occ, fence=fence
                ),
                stale=True,
                **ids,
            )
            self.call(
                "settle",
                lambda: self.store.settle(
                    occurrence_id=occ, owner_id=self.owner, fence=fence, outcome="succeeded"
                ),
                stale=True,
                **ids,
            )
            return
        for _ in range(self.rng.randint(0, 2)):
            time.sleep(self.rng.uniform(0, self.lease_ms / 2000))
            renewed = self.call(
                "renew",
                lambda: self.store.renew(
                    occurrence_id=occ, owner_id=self.owner, fence=fence, lease_ms=self.lease_ms
                ),
                **ids,
            )
            if isinstance(renewed, SchedulerKernelError):
                return
        outcome = "failed" if self.rng.random() < failure_rate else "succeeded"
        self.call(
            "settle",
            lambda: self.store.settle(
                occurrence_id=occ, owner_id=self.owner, fence=fence, outcome=outcome, retryable=True
            ),
            outcome=outcome,
            **ids,
        )


def race_main(db: str, index: int, seed: int, log: str, go: str, lease_ms: int) -> None:
    with open(log, "w", encoding="utf-8") as stream:
        emit = line_emitter(stream)
        store = open_store(db, busy_timeout_ms=60_000)
        emit({"t": "ready"})
        while not os.path.exists(go):
            time.sleep(0.005)
        RaceWorker(store, index, random.Random(seed), emit, lease_ms).work(db, 0.05, 0.1)
        store.close()
        emit({"t": "done"})


# ----------------------------------------------------------------------------- open / upgrade


def open_main(db: str) -> None:
    emit = line_emitter(sys.stdout)
    emit({"imported": time.monotonic()})
    store = open_store(db, clock=lambda: 1767312000000)
    emit({"opened": store.schema_info().schema_version, "at": time.monotonic()})
    store.close()


def main(argv: list[str]) -> None:
    kind, *args = argv
    try:
        if kind == "crash":
            crash_main(args[0], int(args[1]))
        elif kind == "race":
            race_main(args[0], int(args[1]), int(args[2]), args[3], args[4], int(args[5]))
        elif kind == "open":
            open_main(args[0])
        else:
            raise SystemExit(f"unknown workload {kind}")
    except Exception:
        sys.stdout.write(json.dumps({"fatal": traceback.format_exc()}) + "\n")
        sys.stdout.flush()
        raise SystemExit(3) from None
