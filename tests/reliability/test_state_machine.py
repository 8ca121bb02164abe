"""State-machine fuzzing of the public API against a small in-memory model of the seed's rules.

A hypothesis ``RuleBasedStateMachine`` drives jobs, enqueue, claims, renewals, settlements,
authority reservations, pause/ack/resume and requeue with valid, stale and invalid arguments and
a controlled clock. ``Model`` mirrors the store's methods (same names and keywords). Every call
goes to both: the store must fail exactly when the model predicts a failure, with the predicted
(documented) code, and then leave a full table dump (``tests/dump.py``) unchanged.
After every step the store's rows equal the model's and the invariants of ``invariants.py`` hold.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dump import dump as file_dump
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduler import SchedulerKernelError, derive_occurrence_identity, open_store

from .conftest import T0, current_scale
from .invariants import assert_invariants, dump_database

pytestmark = pytest.mark.reliability


PRINCIPAL = {"type": "service", "id": "fuzz"}
AUTHORITY = {"principal": PRINCIPAL, "requestedCapabilities": ["run"]}
CAPABILITY = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint"]}
JOBS, TRIGGERS, OWNERS = ["ja", "jb"], ["t1", "t2", "t3"], ["w1", "w2"]
LEASE_LOST, CONFLICT = "SCHEDULER_LEASE_LOST", "SCHEDULER_OCCURRENCE_CONTROL_CONFLICT"
NOT_FOUND, INVALID = "SCHEDULER_NOT_FOUND", "SCHEDULER_INVALID_ARGUMENT"
NAN, OCC = float("nan"), "$occ"  # OCC: replaced by an occurrence id
STATS = {"examples": 0, "steps": 0, "errors_checked": 0, "invalid_calls": 0}
OUTCOMES: Counter[str] = Counter()


class Predicted(Exception):
    """The model's prediction that a call fails with ``code`` (and changes nothing)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class Occ:
    id: str
    job_id: str
    scheduled_for: int
    available_at: int
    max_attempts: int
    payload: Any
    status: str = "queued"
    attempt: int = 0
    fence: int = 0
    owner: str | None = None
    lease: int | None = None
    settled_at: int | None = None
    error_code: str | None = None


@dataclass
class Control:
    state: str
    revision: int
    expected_fence: int
    pause_request: str
    resume_request: str | None = None


@dataclass
class Model:
    """The expected state; each public method mirrors the store method of the same name."""

    now: int = T0
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    occs: dict[str, Occ] = field(default_factory=dict)
    controls: dict[str, Control] = field(default_factory=dict)
    # requeue request -> (occurrence, fence, error code, consumed by a claim)
    retries: dict[str, tuple[str, int, str, bool]] = field(default_factory=dict)
    policy: dict[str, int] | None = None
    # occurrence -> (policy revision, units, window start, status)
    reservations: dict[str, tuple[int, int, int, str]] = field(default_factory=dict)

    # -- jobs and enqueue
    def set_authority_policy(self, principal: Any, *, max_runs: int, window_ms: int, **_: Any) -> None:
        revision = 1 if self.policy is None else self.policy["revision"] + 1
        self.policy = {"revision": revision, "max_runs": max_runs, "window_ms": window_ms}

    def create_job(self, *, id: str, enabled: bool, max_attempts: int, **_: Any) -> None:
        if id in self.jobs:
            raise Predicted("SCHEDULER_CONFLICT")
        self.jobs[id] = {"revision": 1, "enabled": enabled, "max_attempts": max_attempts}

    def update_job(self, job_id: str, expected_revision: int, *, enabled: bool, max_attempts: int) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            raise Predicted(NOT_FOUND)
        if job["revision"] != expected_revision:
            raise Predicted("SCHEDULER_REVISION_CONFLICT")
        job.update(revision=job["revision"] + 1, enabled=enabled, max_attempts=max_attempts)

    def enqueue_occurrence(self, *, job_id: str, scheduled_for: int, trigger_key: str, payload: Any,
                           available_at: int | None = None) -> None:  # fmt: skip
        job = self.jobs.get(job_id)
        if job is None:
            raise Predicted(NOT_FOUND)
        if not job["enabled"]:
            raise Predicted("SCHEDULER_JOB_DISABLED")
        oid = derive_occurrence_identity(
            job_id=job_id, job_revision=job["revision"], scheduled_for=scheduled_for, trigger_key=trigger_key
        ).occurrence_id
        if oid in self.occs:
            if self.occs[oid].payload != payload:
                raise Predicted("SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH")
            return
        available = scheduled_for if available_at is None else available_at
        self.occs[oid] = Occ(oid, job_id, scheduled_for, available, job["max_attempts"], payload)

    # -- claims
    def _retry(self, o: Occ) -> str | None:
        pending = (o.id, o.fence, False)
        return next((r for r, (occ, f, _, used) in self.retries.items() if (occ, f, used) == pending), None)

    def _state(self, oid: str) -> str | None:
        control = self.controls.get(oid)
        return None if control is None else control.state

    def _sweep(self) -> None:
        for o in self.occs.values():
            expired = o.status == "running" and (o.lease or 0) <= self.now and o.attempt >= o.max_attempts
            if expired and self._state(o.id) not in ("pause_requested", "resumed"):
                o.status, o.owner, o.lease, o.settled_at = "dead_letter", None, None, self.now
                o.error_code = "lease_expired"

    def _eligible(self, o: Occ) -> bool:
        state = self._state(o.id)
        if not self.jobs[o.job_id]["enabled"] or state == "paused":
            return False
        if not (o.attempt < o.max_attempts or state in ("pause_requested", "resumed") or self._retry(o)):
            return False
        if state == "pause_requested" and o.status != "running":
            return False
        if o.status in ("queued", "retry_wait"):
            return o.available_at <= self.now
        return o.status == "running" and (o.lease or 0) <= self.now

    def _claim(self, o: Occ, owner: str, lease_ms: int) -> str:
        control, retry = self.controls.get(o.id), self._retry(o)
        rebind = control is not None and control.state in ("pause_requested", "resumed")
        resumed = control is not None and control.state == "resumed" and control.expected_fence == o.fence
        free = retry is not None or resumed or (control is not None and control.state == "pause_requested")
        o.attempt, o.fence = o.attempt + (0 if free else 1), o.fence + 1
        o.status, o.owner, o.lease, o.settled_at = "running", owner, self.now + lease_ms, None
        if control is not None and rebind:
            control.expected_fence, control.revision = o.fence, control.revision + 1
        if retry is not None:
            self.retries[retry] = (*self.retries[retry][:3], True)
        return o.id

    def claim_next(self, *, owner_id: str, lease_ms: int) -> str | None:
        self._sweep()
        ready = [o for o in self.occs.values() if self._eligible(o)]
        order = lambda o: ((o.lease if o.status == "running" else o.available_at) or 0, o.scheduled_for, o.id)  # noqa: E731
        chosen = min(ready, key=order, default=None)
        return None if chosen is None else self._claim(chosen, owner_id, lease_ms)

    def claim_occurrence(self, *, occurrence_id: str, owner_id: str, lease_ms: int) -> str | None:
        self._sweep()
        o = self.occs.get(occurrence_id)
        if o is None:
            raise Predicted(NOT_FOUND)
        return self._claim(o, owner_id, lease_ms) if self._eligible(o) else None

    def _holder(self, occ: str, owner: str, fence: int) -> Occ:
        o = self.occs.get(occ)
        if (
            o is None
            or (o.status, o.owner, o.fence) != ("running", owner, fence)
            or (o.lease or 0) <= self.now
        ):
            raise Predicted(LEASE_LOST)
        return o

    def renew(self, *, occurrence_id: str, owner_id: str, fence: int, lease_ms: int) -> None:
        o = self._holder(occurrence_id, owner_id, fence)
        o.lease = max(o.lease or 0, self.now + lease_ms)

    def settle(self, *, occurrence_id: str, owner_id: str, fence: int, outcome: str, retryable: bool,
               error: dict[str, Any], retry_at: int | None = None, **_: Any) -> None:  # fmt: skip
        o = self._holder(occurrence_id, owner_id, fence)
        if outcome == "succeeded":
            o.status, o.settled_at, o.error_code = "succeeded", self.now, None
        elif retryable and o.attempt < o.max_attempts:
            o.status, o.error_code = "retry_wait", error["code"]
            o.available_at = max(self.now, self.now if retry_at is None else retry_at)
        else:
            o.status, o.settled_at, o.error_code = "dead_letter", self.now, error["code"]
        o.owner = o.lease = None
        control = self.controls.get(o.id)
        if control is not None:
            if o.status == "retry_wait" and control.state == "resumed" and control.expected_fence == fence:
                control.expected_fence, control.revision = fence + 1, control.revision + 1
            if control.state == "pause_requested" or (
                control.state == "resumed" and o.status != "retry_wait"
            ):
                control.state, control.revision = "terminal", control.revision + 1
        reservation = self.reservations.get(o.id)
        if reservation and reservation[3] == "reserved" and o.status != "retry_wait":
            self.reservations[o.id] = (*reservation[:3], "succeeded" if o.status == "succeeded" else "failed")

    # -- authority
    def reserve_authority(self, *, occurrence_id: str, policy_revision: int, units: int) -> None:
        o = self.occs.get(occurrence_id)
        if o is None:
            raise Predicted(NOT_FOUND)
        if o.status != "running":
            raise Predicted("SCHEDULER_AUTHORITY_OCCURRENCE_NOT_RUNNING")
        if occurrence_id in self.reservations:
            if self.reservations[occurrence_id][:2] != (policy_revision, units):
                raise Predicted("SCHEDULER_AUTHORITY_RESERVATION_MISMATCH")
            return
        if self.policy is None:
            raise Predicted("SCHEDULER_AUTHORITY_POLICY_REQUIRED")
        if self.policy["revision"] != policy_revision:
            raise Predicted("SCHEDULER_AUTHORITY_POLICY_STALE")
        window = self.now // self.policy["window_ms"] * self.policy["window_ms"]
        used = sum(1 for r in self.reservations.values() if r[0] == policy_revision and r[2] == window)
        if used + 1 > self.policy["max_runs"]:
            raise Predicted("SCHEDULER_AUTHORITY_BUDGET_EXHAUSTED")
        self.reservations[occurrence_id] = (policy_revision, units, window, "reserved")

    # -- runtime control
    def request_occurrence_pause(
        self, *, occurrence_id: str, expected_fence: int, request_id: str, **_: Any
    ) -> None:
        o = self.occs.get(occurrence_id)
        if o is None:
            raise Predicted(NOT_FOUND)
        bound = next((k for k, c in self.controls.items() if c.pause_request == request_id), None)
        if bound is not None and bound != occurrence_id:
            raise Predicted(CONFLICT)
        current = self.controls.get(occurrence_id)
        if current is not None and current.pause_request == request_id:
            if current.expected_fence != expected_fence:
                raise Predicted(CONFLICT)
            return
        if current is not None and current.state != "terminal":
            raise Predicted(CONFLICT)
        if o.status != "running":
            raise Predicted("SCHEDULER_OCCURRENCE_NOT_RUNNING")
        if o.fence != expected_fence:
            raise Predicted("SCHEDULER_FENCE_CONFLICT")
        if (o.lease or 0) <= self.now:
            raise Predicted(LEASE_LOST)
        revision = 1 if current is None else current.revision + 1
        self.controls[occurrence_id] = Control("pause_requested", revision, expected_fence, request_id)

    def ack_occurrence_pause(self, *, occurrence_id: str, owner_id: str, fence: int, request_id: str,
                             expected_revision: int, **_: Any) -> None:  # fmt: skip
        control = self.controls.get(occurrence_id)
        if occurrence_id not in self.occs or control is None:
            raise Predicted(NOT_FOUND)
        if control.state != "pause_requested" or control.pause_request != request_id:
            raise Predicted(CONFLICT)
        if control.revision != expected_revision:
            raise Predicted("SCHEDULER_REVISION_CONFLICT")
        if control.expected_fence != fence:
            raise Predicted(LEASE_LOST)
        o = self._holder(occurrence_id, owner_id, fence)
        o.status, o.available_at, o.owner, o.lease = "retry_wait", self.now, None, None
        control.state, control.revision = "paused", control.revision + 1

    def resume_occurrence(self, *, occurrence_id: str, expected_revision: int, request_id: str) -> None:
        control = self.controls.get(occurrence_id)
        if occurrence_id not in self.occs or control is None:
            raise Predicted(NOT_FOUND)
        bound = next((k for k, c in self.controls.items() if c.resume_request == request_id), None)
        if bound is not None and bound != occurrence_id:
            raise Predicted(CONFLICT)
        if control.resume_request == request_id:
            return
        if control.state != "paused":
            raise Predicted(CONFLICT)
        if control.revision != expected_revision:
            raise Predicted("SCHEDULER_REVISION_CONFLICT")
        control.state, control.revision, control.resume_request = "resumed", control.revision + 1, request_id
        self.occs[occurrence_id].available_at = self.now

    def requeue_dead_letter(self, *, occurrence_id: str, expected_fence: int, expected_error_code: str,
                            request_id: str) -> None:  # fmt: skip
        if request_id in self.retries:
            if self.retries[request_id][:3] != (occurrence_id, expected_fence, expected_error_code):
                raise Predicted("SCHEDULER_REQUEUE_CONFLICT")
            return
        o = self.occs.get(occurrence_id)
        if o is None:
            raise Predicted(NOT_FOUND)
        if (o.status, o.fence, o.error_code) != ("dead_letter", expected_fence, expected_error_code):
            raise Predicted("SCHEDULER_REQUEUE_EVIDENCE_CONFLICT")
        self.retries[request_id] = (occurrence_id, expected_fence, expected_error_code, False)
        o.status, o.available_at, o.settled_at = "retry_wait", self.now, None


# The model predicts these from argument validation alone (nothing reaches the database).
# fmt: off
INVALID_CALLS: list[tuple[str, str, dict[str, Any]]] = [
    (INVALID, "create_job", {"id": " ", "kind": "a", "authority": AUTHORITY}),
    (INVALID, "create_job", {"id": "jx", "kind": "a", "authority": AUTHORITY, "max_attempts": True}),
    (INVALID, "create_job", {"id": "jx", "kind": "a", "authority": AUTHORITY, "max_attempts": 33}),
    (INVALID, "create_job", {"id": "jx", "kind": "a\x00", "authority": AUTHORITY}),
    (INVALID, "enqueue_occurrence", {"job_id": "ja", "scheduled_for": float(T0), "trigger_key": "t1"}),
    (INVALID, "enqueue_occurrence", {"job_id": "ja", "scheduled_for": 2**53, "trigger_key": "t1"}),
    # the seed validates the payload after the job lookup: the missing job is reported first
    (NOT_FOUND, "enqueue_occurrence",
     {"job_id": "j", "scheduled_for": T0, "trigger_key": "t", "payload": NAN}),
    (INVALID, "claim_next", {"owner_id": "w1", "lease_ms": 0}),
    (INVALID, "claim_next", {"owner_id": "w1", "lease_ms": 86_400_001}),
    (INVALID, "claim_next", {"owner_id": "w\x001", "lease_ms": 10}),
    (INVALID, "renew", {"occurrence_id": OCC, "owner_id": "w1", "fence": "1", "lease_ms": 1000}),
    (INVALID, "settle", {"occurrence_id": OCC, "owner_id": "w1", "fence": 1, "outcome": "maybe"}),
    (INVALID, "settle", {"occurrence_id": OCC, "owner_id": "w", "fence": 1, "outcome": "failed",
                         "retryable": 1}),
    (INVALID, "update_job", {"job_id": "ja", "expected_revision": 1}),
    (INVALID, "reserve_authority", {"occurrence_id": OCC, "policy_revision": 1, "units": 0}),
    (INVALID, "requeue_dead_letter",
     {"occurrence_id": OCC, "expected_fence": 0, "expected_error_code": "x", "request_id": "r"}),
    ("SCHEDULER_PAUSE_UNSUPPORTED", "request_occurrence_pause",
     {"occurrence_id": OCC, "expected_fence": 1, "request_id": "p", "capability": None}),
]
# fmt: on
CODES = st.sampled_from(["boom", "X_OUTCOME_UNKNOWN"])
INDEX, WRONG, LEASE = st.integers(0, 20), st.sampled_from([False, False, True]), st.sampled_from([1000, 5000])
OUTCOME = st.sampled_from(["succeeded", "failed"])


class SchedulerMachine(RuleBasedStateMachine):
    """Drives one real store file and the model side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="fuzz-"))
        self.path = self.dir / "store" / "kernel.sqlite"
        self.model = Model()
        self.store = open_store(self.path, clock=lambda: self.model.now)
        self.serial = 0
        STATS["examples"] += 1

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def dump(self) -> Any:
        return file_dump(self.path)

    def check(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on a copy of the model and on the store; outcomes must agree."""
        STATS["steps"] += 1
        before, saved = self.dump(), copy.deepcopy(self.model)
        try:
            expected = getattr(self.model, method)(*args, **kwargs)
        except Predicted as prediction:
            self.model = saved
            with pytest.raises(SchedulerKernelError) as caught:
                getattr(self.store, method)(*args, **kwargs)
            got = caught.value
            assert got.code == prediction.code, f"{method}: {got.code} ({got}), model {prediction.code}"
            assert self.dump() == before, f"{method} failed with {got.code} but changed the database"
            STATS["errors_checked"] += 1
            OUTCOMES[f"{method}:{got.code.removeprefix('SCHEDULER_')}"] += 1
            return None
        try:
            result = getattr(self.store, method)(*args, **kwargs)
        except SchedulerKernelError as error:
            raise AssertionError(
                f"{method}: store raised {error.code} ({error}), model expected success"
            ) from error
        if method in ("claim_next", "claim_occurrence"):
            assert (None if result is None else result.id) == expected, f"{method} chose differently"
        OUTCOMES[f"{method}:ok"] += 1
        return result

    # ------------------------------------------------------------------ choosing arguments
    def pick(self, index: int, wanted: Any = None) -> str:
        """An occurrence id: mostly one ``wanted(occ)`` accepts, sometimes any, sometimes a missing one."""
        ids = sorted(self.model.occs)
        fitting = [i for i in ids if wanted is None or wanted(self.model.occs[i])]
        if fitting and index < 14:
            return fitting[index % len(fitting)]
        return ids[index % len(ids)] if ids and index < 19 else "occ_missing"

    def fence(self, occ: str, stale: int) -> int:
        o = self.model.occs.get(occ)
        return max(1, (o.fence if o else 1) + stale)

    def owner(self, occ: str, wrong: bool = False) -> str:
        o = self.model.occs.get(occ)
        holder = (o.owner if o else None) or OWNERS[0]
        return OWNERS[1 - OWNERS.index(holder)] if wrong else holder

    def serial_id(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}-{self.serial}"

    def running(self) -> bool:
        return any(o.status == "running" for o in self.model.occs.values())

    def controlled(self, *states: str) -> bool:
        return any(c.state in states for c in self.model.controls.values())

    def held_by(self, owner: str) -> Occ | None:
        held = [o for o in self.model.occs.values() if o.status == "running" and o.owner == owner]
        return max(held, key=lambda o: (o.lease or 0, o.id), default=None)

    # ------------------------------------------------------------------ rules
    @initialize()
    def setup(self) -> None:
        """Two jobs, a policy and three queued occurrences, through the same checked path."""
        self.create_job("ja", 2, True)
        self.create_job("jb", 3, True)
        self.set_policy()
        for trigger in TRIGGERS:
            self.enqueue("ja", trigger, 0, None, None)

    @rule(runs=st.sampled_from([1, 2, 5]))
    def set_policy(self, runs: int = 1) -> None:
        principal = PRINCIPAL
        self.check("set_authority_policy", principal, capabilities=["run"], window_ms=60_000, max_runs=runs,
                   max_units=10)  # fmt: skip

    @rule(job=st.sampled_from(JOBS), attempts=st.integers(1, 3), enabled=st.booleans())
    def create_job(self, job: str, attempts: int, enabled: bool) -> None:
        self.check(
            "create_job", id=job, kind="agenda", authority=AUTHORITY, enabled=enabled, max_attempts=attempts
        )

    @rule(
        job=st.sampled_from(JOBS),
        delta=st.sampled_from([0, 0, 0, -1, 1]),
        on=st.booleans(),
        n=st.integers(1, 3),
    )
    def update_job(self, job: str, delta: int, on: bool, n: int) -> None:
        revision = max(1, self.model.jobs.get(job, {"revision": 1})["revision"] + delta)
        self.check("update_job", job, revision, enabled=on, max_attempts=n)

    @rule(job=st.sampled_from(JOBS), trigger=st.sampled_from(TRIGGERS), offset=st.sampled_from([0, 2000]),
          payload=st.sampled_from([None, 1, "two"]), delay=st.sampled_from([None, 0, 3000]))  # fmt: skip
    def enqueue(self, job: str, trigger: str, offset: int, payload: Any, delay: int | None) -> None:
        extra = {} if delay is None else {"available_at": T0 + offset + delay}
        self.check("enqueue_occurrence", job_id=job, scheduled_for=T0 + offset, trigger_key=trigger,
                   payload=payload, **extra)  # fmt: skip

    @rule(ms=st.sampled_from([0, 0, 500, 1000, 1000, 4000, 10_000, 70_000]))
    def advance_clock(self, ms: int) -> None:
        self.model.now += ms

    @rule(owner=st.sampled_from(OWNERS), lease=LEASE)
    def claim_next(self, owner: str, lease: int) -> None:
        self.check("claim_next", owner_id=owner, lease_ms=lease)

    @rule(index=INDEX, owner=st.sampled_from(OWNERS), lease=LEASE)
    def claim_occurrence(self, index: int, owner: str, lease: int) -> None:
        self.check("claim_occurrence", occurrence_id=self.pick(index), owner_id=owner, lease_ms=lease)

    @precondition(running)
    @rule(index=INDEX, wrong=WRONG, stale=st.sampled_from([0, 0, -1, 1]), lease=LEASE)
    def renew(self, index: int, wrong: bool, stale: int, lease: int) -> None:
        occ = self.pick(index, lambda o: o.status == "running")
        owner, fence = self.owner(occ, wrong), self.fence(occ, stale)
        self.check("renew", occurrence_id=occ, owner_id=owner, fence=fence, lease_ms=lease)

    @precondition(running)
    @rule(index=INDEX, wrong=WRONG, stale=st.sampled_from([0, 0, 0, 1]), outcome=OUTCOME,
          retryable=st.booleans(), retry_at=st.sampled_from([None, T0, T0 + 90_000]), code=CODES)  # fmt: skip
    def settle(self, index: int, wrong: bool, stale: int, outcome: str, retryable: bool, retry_at: int | None,
               code: str) -> None:  # fmt: skip
        occ = self.pick(index, lambda o: o.status == "running")
        self._settle(occ, self.owner(occ, wrong), self.fence(occ, stale), outcome, retryable, code, retry_at)

    def _settle(self, occ: str, owner: str, fence: int, outcome: str, retryable: bool, code: str,
                retry_at: int | None = None) -> None:  # fmt: skip
        extra = {} if retry_at is None else {"retry_at": retry_at}
        error = {"code": code, "message": "m"}
        self.check("settle", occurrence_id=occ, owner_id=owner, fence=fence, outcome=outcome,
                   retryable=retryable, error=error, result={"ok": True}, **extra)  # fmt: skip

    @precondition(running)
    @rule(index=INDEX, stale=st.sampled_from([0, 0, 1]), units=st.sampled_from([1, 1, 2]))
    def reserve(self, index: int, stale: int, units: int) -> None:
        occ = self.pick(index, lambda o: o.status == "running")
        revision = max(1, (self.model.policy or {"revision": 1})["revision"] + stale)
        self.check("reserve_authority", occurrence_id=occ, policy_revision=revision, units=units)

    @precondition(running)
    @rule(index=INDEX, stale=st.sampled_from([0, 0, 0, 0, 1]), reuse=st.booleans())
    def request_pause(self, index: int, stale: int, reuse: bool) -> None:
        occ = self.pick(index, lambda o: o.status == "running")
        request = "pause-0" if reuse else self.serial_id("pause")
        self.check("request_occurrence_pause", occurrence_id=occ, expected_fence=self.fence(occ, stale),
                   request_id=request, capability=CAPABILITY)  # fmt: skip

    @precondition(lambda self: self.controlled("pause_requested"))
    @rule(
        index=INDEX,
        stale=st.sampled_from([0, 0, 0, 1]),
        wrong=st.sampled_from([False, False, True]),
    )
    def ack_pause(self, index: int, stale: int, wrong: bool) -> None:
        occ = self.pick(index, lambda o: self.model._state(o.id) == "pause_requested")
        control = self.model.controls.get(occ)
        request, revision = (control.pause_request, control.revision) if control else ("pause-x", 1)
        self.check("ack_occurrence_pause", occurrence_id=occ, owner_id=self.owner(occ, wrong),
                   fence=self.fence(occ, stale), request_id=request, expected_revision=revision,
                   safe_point="adapter_checkpoint", checkpoint={"at": self.model.now})  # fmt: skip

    @precondition(lambda self: self.controlled("paused", "resumed"))
    @rule(index=INDEX, stale=st.sampled_from([0, 0, -1]), reuse=st.booleans())
    def resume(self, index: int, stale: int, reuse: bool) -> None:
        occ = self.pick(index, lambda o: self.model._state(o.id) in ("paused", "resumed"))
        control = self.model.controls.get(occ)
        revision = max(1, (control.revision if control else 1) + stale)
        earlier = control.resume_request if control else None
        request = (earlier or "resume-x") if reuse else self.serial_id("resume")
        self.check("resume_occurrence", occurrence_id=occ, expected_revision=revision, request_id=request)

    @precondition(lambda self: any(o.status == "dead_letter" for o in self.model.occs.values()))
    @rule(
        index=INDEX,
        stale=st.sampled_from([0, 0, 1]),
        wrong_code=st.booleans(),
        reuse=st.booleans(),
    )
    def requeue(self, index: int, stale: int, wrong_code: bool, reuse: bool) -> None:
        occ = self.pick(index, lambda o: o.status == "dead_letter")
        o = self.model.occs.get(occ)
        code = "other" if wrong_code or o is None or o.error_code is None else o.error_code
        request = "requeue-0" if reuse else self.serial_id("requeue")
        self.check("requeue_dead_letter", occurrence_id=occ, expected_fence=self.fence(occ, stale),
                   expected_error_code=code, request_id=request)  # fmt: skip

    @rule(case=st.integers(0, 40))
    def invalid_call(self, case: int) -> None:
        code, method, kwargs = INVALID_CALLS[case % len(INVALID_CALLS)]
        STATS["invalid_calls"] += 1
        arguments = {k: self.pick(case) if v is OCC else v for k, v in kwargs.items()}
        before = self.dump()
        with pytest.raises(SchedulerKernelError) as caught:
            getattr(self.store, method)(**arguments)
        assert caught.value.code == code, f"{method}({arguments}): {caught.value.code}"
        assert self.dump() == before
        OUTCOMES[f"invalid:{code.removeprefix('SCHEDULER_')}"] += 1

    # -- compound cycles (each call still checked on its own) so deep states are reached often
    @rule(
        owner=st.sampled_from(OWNERS),
        outcome=OUTCOME,
        retryable=st.booleans(),
        code=CODES,
        renew=st.booleans(),
    )
    def claim_and_settle(self, owner: str, outcome: str, retryable: bool, code: str, renew: bool) -> None:
        self.claim_next(owner, 5000)
        held = self.held_by(owner)
        if held is not None:
            self.model.now += 1000
            if renew:
                self.check("renew", occurrence_id=held.id, owner_id=owner, fence=held.fence, lease_ms=5000)
            revision = (self.model.policy or {"revision": 1})["revision"]
            self.check("reserve_authority", occurrence_id=held.id, policy_revision=revision, units=1)
            self._settle(held.id, owner, held.fence, outcome, retryable, code)

    @rule(owner=st.sampled_from(OWNERS), expire=st.booleans(), resume=st.booleans(), finish=st.booleans())
    def pause_cycle(self, owner: str, expire: bool, resume: bool, finish: bool) -> None:
        """Claim, request a pause (maybe let the lease expire and rebind it), ack, resume, reclaim."""
        self.claim_next(owner, 5000)
        held = self.held_by(owner)
        if held is None:
            return
        index = lambda: sorted(self.model.occs).index(held.id)  # noqa: E731
        self.request_pause(index(), 0, False)
        if expire:
            self.model.now += 6000
            self.claim_occurrence(index(), owner, 5000)
        self.ack_pause(index(), 0, False)
        if resume:
            self.resume(index(), 0, False)
            self.claim_occurrence(index(), owner, 5000)
            if finish and held.status == "running":
                self._settle(held.id, owner, held.fence, "succeeded", True, "boom")

    @rule(owner=st.sampled_from(OWNERS), code=CODES, again=st.booleans())
    def requeue_cycle(self, owner: str, code: str, again: bool) -> None:
        """Claim, dead-letter, requeue, reclaim without an attempt, settle (maybe dead-letter again)."""
        self.claim_next(owner, 5000)
        held = self.held_by(owner)
        if held is None:
            return
        self._settle(held.id, owner, held.fence, "failed", False, code)
        index = sorted(self.model.occs).index(held.id)
        self.requeue(index, 0, False, False)
        self.claim_occurrence(index, owner, 5000)
        if held.status == "running":
            self._settle(held.id, owner, held.fence, "failed" if again else "succeeded", True, code)

    # ------------------------------------------------------------------ agreement after every step
    @invariant()
    def store_agrees_with_model(self) -> None:
        m = self.model
        for job_id, state in m.jobs.items():
            job = self.store.get_job(job_id)
            assert job is not None
            assert (job.revision, job.enabled, job.max_attempts) == tuple(state.values())
        for o in m.occs.values():
            got = self.store.get_occurrence(o.id)
            assert got is not None, o.id
            code = got.last_error.get("code") if isinstance(got.last_error, dict) else None
            have = (got.status, got.attempt, got.fence, got.lease_owner, got.lease_expires_at,
                    got.available_at, got.settled_at, got.max_attempts, code)  # fmt: skip
            want = (o.status, o.attempt, o.fence, o.owner, o.lease,
                    o.available_at, o.settled_at, o.max_attempts, o.error_code)  # fmt: skip
            assert have == want, f"{o.id}: store {have}, model {want}"
            control, expected = self.store.get_occurrence_control(o.id), m.controls.get(o.id)
            have_control = (
                None if control is None else (control.state, control.revision, control.expected_fence)
            )
            want_control = (
                None if expected is None else (expected.state, expected.revision, expected.expected_fence)
            )
            assert have_control == want_control, f"{o.id}: control {have_control}, model {want_control}"
            res = self.store.get_authority_reservation(o.id)
            have_res = (
                None if res is None else (res.policy_revision, res.units, res.window_started_at, res.status)
            )
            assert have_res == m.reservations.get(o.id), f"{o.id}: reservation {have_res}"
        dump = dump_database(self.path)
        assert len(dump["occurrences"]) == len(m.occs)
        assert_invariants(dump, "fuzz step")


SchedulerMachine.TestCase.settings = settings(
    max_examples=current_scale().fuzz_examples,
    stateful_step_count=current_scale().fuzz_steps,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class TestSchedulerStateMachine(SchedulerMachine.TestCase):
    """Runs the machine (sizes: ``fuzz_examples`` × ``fuzz_steps`` from the scale)."""


def test_fuzz_figures(figures: dict[str, Any]) -> None:
    """Records how much the state machine ran (runs after the machine's test, in file order)."""
    figures["state_machine_fuzz"] = {**STATS, "outcomes": dict(sorted(OUTCOMES.items()))}
    assert STATS["steps"] > 0 or STATS["examples"] == 0
