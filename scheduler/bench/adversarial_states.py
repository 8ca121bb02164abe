"""The adversarial queues' states, built through the public API only (as a user reaches them).

Each state holds ``rows`` occurrences a claim or listing is not asked for, and a little work it is
(``plain`` holds only the work: the same calls on it are the reference for the others):

* ``plain``: an enabled job's due work and nothing else;
* ``disabled``: ``rows`` due occurrences of a disabled job, all with one ``available_at`` (a
  paused backlog's shape), ahead of an enabled job's work;
* ``kinds``: ``rows`` due occurrences of kind ``a`` in workspace ``ws-a``, all with one
  ``available_at``, ahead of kind ``b``'s work in workspace ``ws-b``;
* ``dead``: ``rows`` dead letters (their final attempts failed with an outcome-unknown error),
  after a few of another job's;
* ``fleet``: ``rows`` occurrences claimed by a fleet that died: every lease has expired (and
  :data:`FLEET_SPARE` per unit of work more, which the cases reclaim).

Enqueues go through ``enqueue_many`` in batches of :data:`BATCH`; the job is disabled with
``update_job``; dead letters and leases come from ``claim_batch`` and ``settle_many``. A state
ends with the job :data:`BUILT_JOB`, whose payload records what was built and how long it took,
so a kept database is reused only once complete (:func:`built`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from scheduler.bench.context import BENCH_AUTHORITY
from scheduler.bench.stores import PAST_MS, wall_ms

BATCH: Final = 1000
BUILT_JOB: Final = "adv-built"
LEASE_MS: Final = 60_000
DISABLED_JOB, ENABLED_JOB = "adv-off", "adv-on"
KIND_A_JOB, KIND_B_JOB = "adv-kind-a", "adv-kind-b"
DEAD_JOB, FEW_DEAD_JOB, FEW_DEAD = "adv-dead", "adv-few", 60
FLEET_JOB, FLEET_OWNER = "adv-fleet", "adv-dead-fleet"
WS_A, WS_B = "ws-a", "ws-b"
UNKNOWN_OUTCOME: Final = {"code": "HANDLER_OUTCOME_UNKNOWN", "message": "the worker died mid-call"}


def enqueue(store: Any, job_id: str, count: int, first: int, *, prefix: str, at: int | None = None) -> None:
    """``count`` due occurrences of ``job_id`` scheduled from ``first`` on (1 ms apart), each
    available at ``at`` (one ``available_at`` for all) or when scheduled."""
    for start in range(0, count, BATCH):
        requests = []
        for index in range(start, min(count, start + BATCH)):
            request: dict[str, Any] = {
                "job_id": job_id,
                "scheduled_for": first + index,
                "trigger_key": f"{prefix}-{index:08d}",
            }
            if at is not None:
                request["available_at"] = at
            requests.append(request)
        store.enqueue_many(requests)


def add_work(store: Any, job_id: str, count: int) -> None:
    """``count`` more due occurrences of ``job_id``, after every backlog row in the claim order."""
    enqueue(store, job_id, count, wall_ms() - PAST_MS // 2, prefix=f"work-{time.time_ns()}")


def _plain(store: Any, rows: int, work: int) -> None:
    store.create_job(id=ENABLED_JOB, kind="bench", authority=BENCH_AUTHORITY)
    add_work(store, ENABLED_JOB, work)


def _disabled(store: Any, rows: int, work: int) -> None:
    store.create_job(id=DISABLED_JOB, kind="bench", authority=BENCH_AUTHORITY)
    at = wall_ms() - PAST_MS
    enqueue(store, DISABLED_JOB, rows, at, prefix="backlog", at=at)
    store.update_job(DISABLED_JOB, 1, enabled=False)
    store.create_job(id=ENABLED_JOB, kind="bench", authority=BENCH_AUTHORITY)
    add_work(store, ENABLED_JOB, work)


def _kinds(store: Any, rows: int, work: int) -> None:
    store.create_job(id=KIND_A_JOB, kind="a", authority={**BENCH_AUTHORITY, "workspaceId": WS_A})
    store.create_job(id=KIND_B_JOB, kind="b", authority={**BENCH_AUTHORITY, "workspaceId": WS_B})
    at = wall_ms() - PAST_MS
    enqueue(store, KIND_A_JOB, rows, at, prefix="backlog", at=at)
    add_work(store, KIND_B_JOB, work)


def fail_finally(store: Any, job_id: str, count: int, first: int, prefix: str) -> None:
    """``count`` dead letters of ``job_id`` (max_attempts 1): claimed, then failed, in batches."""
    enqueue(store, job_id, count, first, prefix=prefix)
    done = 0
    while done < count:
        batch = store.claim_batch(owner_id="adv-builder", lease_ms=LEASE_MS, limit=min(BATCH, count - done))
        store.settle_many(
            [
                {
                    "occurrence_id": occurrence.id,
                    "owner_id": "adv-builder",
                    "fence": occurrence.fence,
                    "outcome": "failed",
                    "error": UNKNOWN_OUTCOME,
                }
                for occurrence in batch
            ]
        )
        done += len(batch)


def _dead(store: Any, rows: int, work: int) -> None:
    for job_id in (FEW_DEAD_JOB, DEAD_JOB):
        store.create_job(id=job_id, kind="bench", authority=BENCH_AUTHORITY, max_attempts=1)
    first = wall_ms() - PAST_MS
    fail_finally(store, FEW_DEAD_JOB, FEW_DEAD, first, "few")
    fail_finally(store, DEAD_JOB, rows, first + FEW_DEAD, "dead")


FLEET_SPARE: Final = 12
"""Expired leases the fleet holds beyond ``rows`` per unit of ``work``: the cases reclaim and
settle one per claim and ten per batch."""


def _fleet(store: Any, rows: int, work: int) -> None:
    store.create_job(id=FLEET_JOB, kind="bench", authority=BENCH_AUTHORITY)
    leases = rows + FLEET_SPARE * work
    enqueue(store, FLEET_JOB, leases, wall_ms() - PAST_MS, prefix="fleet")
    done = 0
    while done < leases:  # 1 ms leases: every one has expired once the fleet stops
        batch = store.claim_batch(owner_id=FLEET_OWNER, lease_ms=1, limit=min(BATCH, leases - done))
        done += len(batch)


FIRST_JOBS: Final = {
    "plain": ENABLED_JOB,
    "disabled": DISABLED_JOB,
    "kinds": KIND_A_JOB,
    "dead": FEW_DEAD_JOB,
    "fleet": FLEET_JOB,
}
"""The job each state's build creates first: present without :data:`BUILT_JOB`, an unfinished build."""
BUILDERS: Final[dict[str, Callable[[Any, int, int], None]]] = {
    "plain": _plain,
    "disabled": _disabled,
    "kinds": _kinds,
    "dead": _dead,
    "fleet": _fleet,
}


def built(store: Any) -> dict[str, Any] | None:
    """What a complete state records (``rows``, ``build_s``), or ``None``."""
    job = store.get_job(BUILT_JOB)
    return None if job is None else dict(job.payload)


def build(store: Any, state: str, rows: int, work: int) -> dict[str, Any]:
    """Build ``state`` on an empty store (``work``: due occurrences the claims may take); the
    record :func:`built` returns afterwards."""
    started = time.perf_counter()
    BUILDERS[state](store, rows, work)
    record = {"state": state, "rows": rows, "build_s": round(time.perf_counter() - started, 1)}
    store.create_job(
        id=BUILT_JOB, kind="bench-meta", authority=BENCH_AUTHORITY, payload=record, enabled=False
    )
    return record
