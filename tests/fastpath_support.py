"""The fast path's workload: every lifecycle path of the store (each hot statement, batches, the
sweep, requeue, runtime controls, adjudication) with a settable clock and uuids, run by the fast
path's tests on SQLite (``tests/backends/sqlite/test_fastpath.py``) and on PostgreSQL
(``tests/backends/postgresql/test_fastpath_postgresql.py``).
"""

from __future__ import annotations

from typing import Any

from scheduler import (
    SchedulerStore,
    scheduler_adjudication_operator_digest,
    scheduler_adjudication_reason_digest,
)

T0 = 1767225600000
AUTHORITY = {
    "principal": {"type": "user", "id": "user-alice"},
    "workspaceId": "ws-main",
    "requestedCapabilities": ["calendar.read"],
}
CAPABILITY = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint"]}
UNKNOWN = {"code": "AGENDA_OUTCOME_UNKNOWN", "message": "transport reset"}


class Clock:
    def __init__(self) -> None:
        self.now = T0
        self.uuids = 0

    def __call__(self) -> int:
        return self.now

    def uuid(self) -> str:
        self.uuids += 1
        return f"00000000-0000-4000-8000-{self.uuids:012d}"


def workload(store: SchedulerStore, clock: Clock) -> list[Any]:
    """Every lifecycle path: each hot statement, batches, sweep, requeue, controls, adjudication."""
    out: list[Any] = []
    keep = out.append
    keep(store.create_job(id="a", kind="agenda", authority=AUTHORITY, payload={"p": 1}, max_attempts=2))
    keep(store.create_job(id="b", kind="mail", authority=AUTHORITY, max_attempts=1))
    keep(store.update_job("a", 1, payload={"p": 2}))
    keep(store.get_job("a"))
    policy = store.ensure_authority_policy(AUTHORITY)
    for key in ("k1", "k2", "k3", "k4"):
        keep(store.enqueue_occurrence(job_id="a", scheduled_for=T0, trigger_key=key))
    keep(store.enqueue_occurrence(job_id="a", scheduled_for=T0, trigger_key="k1"))
    keep(store.enqueue_occurrence_once_per_trigger(job_id="a", scheduled_for=T0, trigger_key="k2"))
    requests = [{"job_id": "b", "scheduled_for": T0, "trigger_key": f"m{n}"} for n in range(6)]
    keep(
        store.enqueue_many(
            [*requests, requests[0], {"job_id": "a", "scheduled_for": T0, "trigger_key": "k3"}]
        )
    )
    keep(store.list_occurrences_by_trigger(job_id="a", trigger_key="k1"))
    clock.now += 10
    first = store.claim_next(owner_id="w1", lease_ms=1000, job_kind="agenda", workspace_id="ws-main")
    assert first is not None
    keep(first)
    keep(store.renew(occurrence_id=first.id, owner_id="w1", fence=first.fence, lease_ms=5000))
    keep(store.reserve_authority(occurrence_id=first.id, policy_revision=policy.revision))
    keep(
        store.settle(
            occurrence_id=first.id, owner_id="w1", fence=first.fence, outcome="succeeded", result=[1]
        )
    )
    batch = store.claim_batch(owner_id="w2", lease_ms=1000, limit=5)
    keep(batch)
    keep(
        store.settle_many(
            [
                {
                    "occurrence_id": o.id,
                    "owner_id": "w2",
                    "fence": o.fence,
                    "outcome": "failed",
                    "retry_at": T0,
                }
                for o in batch[:3]
            ]
        )
    )
    keep(
        store.settle(
            occurrence_id=batch[3].id, owner_id="w2", fence=batch[3].fence, outcome="failed", error=UNKNOWN
        )
    )
    clock.now += 2000  # batch[4] (max_attempts 1) expires: swept on the next claim
    keep(store.claim_batch(owner_id="w3", lease_ms=60_000, limit=10))
    keep(store.history(limit=200))
    keep(store.list_dead_letters(limit=50))
    dead = store.get_occurrence(batch[3].id)
    assert dead is not None and dead.status == "dead_letter"
    keep(
        store.requeue_dead_letter(
            occurrence_id=dead.id,
            expected_fence=dead.fence,
            expected_error_code=UNKNOWN["code"],
            request_id="rq-1",
        )
    )
    again = store.claim_occurrence(occurrence_id=dead.id, owner_id="w4", lease_ms=60_000)
    assert again is not None
    keep(again)
    control = store.request_occurrence_pause(
        occurrence_id=again.id, expected_fence=again.fence, request_id="pause-1", capability=CAPABILITY
    )
    paused = store.ack_occurrence_pause(
        occurrence_id=again.id,
        owner_id="w4",
        fence=again.fence,
        request_id="pause-1",
        expected_revision=control.revision,
        safe_point="adapter_checkpoint",
    )
    keep(paused)
    keep(
        store.resume_occurrence(
            occurrence_id=again.id, expected_revision=paused.control.revision, request_id="r1"
        )
    )
    resumed = store.claim_occurrence(occurrence_id=again.id, owner_id="w5", lease_ms=60_000)
    assert resumed is not None
    keep(resumed)
    keep(store.get_occurrence_runtime(resumed.id))  # a read of one statement (no transaction of its own)
    keep(store.get_occurrence_runtime("occ-missing"))
    keep(
        store.settle(
            occurrence_id=resumed.id,
            owner_id="w5",
            fence=resumed.fence,
            outcome="failed",
            error=UNKNOWN,
            retryable=False,
        )
    )
    case = store.get_adjudication_case(resumed.id)
    assert case is not None
    adjudicated = store.adjudicate_occurrence(
        occurrence_id=resumed.id,
        decision="confirmed_not_applied",
        expected_evidence_digest=case.evidence_digest,
        expected_attempt=case.attempt,
        expected_fence=case.fence,
        reason_digest=scheduler_adjudication_reason_digest("checked"),
        operator_digest=scheduler_adjudication_operator_digest({"user": "ops"}),
    )
    keep(adjudicated)
    retried = store.claim_occurrence(occurrence_id=resumed.id, owner_id="w6", lease_ms=60_000)
    assert retried is not None
    keep(retried)
    keep(store.settle(occurrence_id=retried.id, owner_id="w6", fence=retried.fence, outcome="succeeded"))
    keep(store.history(occurrence_id=retried.id))
    keep(store.history(job_id="b", limit=3))
    keep(store.history(occurrence_id=retried.id, job_id="a"))
    keep(store.list_dead_letters(job_id="b"))
    return [_plain(value) for value in out]


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value.to_dict() if hasattr(value, "to_dict") else value
