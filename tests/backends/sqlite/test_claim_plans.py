"""SQLite's query plans of the claim path: no claim, renewal or settlement statement sorts
(``EXPLAIN QUERY PLAN`` shows no temporary B-tree) and none scans ``occurrences``.

The state is the claim-equivalence harness's (``claim_seed.py``), with every status, control and
requeue combination; the plans are read after ``ANALYZE``. (The same calls' results on every
backend: ``tests/conformance/test_claim_equivalence.py``.)
"""

from __future__ import annotations

from pathlib import Path

from claim_seed import LEASE, NOW, TIMES, JobSpec, OccurrenceSpec, build_state, captured_plans, raw
from lifecycle_support import T0

from scheduler import open_store


def test_no_claim_path_query_uses_a_temporary_b_tree(tmp_path: Path) -> None:
    path = tmp_path / "plans.sqlite"
    store = open_store(path, clock=lambda: NOW)
    db = raw(path)
    try:
        jobs = [JobSpec("", "agenda", True, "ws-a"), JobSpec("", "routine", True, None)]
        occurrences = [
            OccurrenceSpec(
                occurrence_id=f"occ_{i:03d}",
                job=i % 2,
                status=status,
                available_at=TIMES[i % 4],
                scheduled_for=T0 + i % 3,
                lease_expires_at=TIMES[(i + 1) % 4],
                max_attempts=2,
                attempt=1,
                fence=1,
                control=control,
                control_fence_offset=0,
                retry=retry,
                retry_fence_offset=0,
                adjudication=i % 5 == 0,
                reservation=i % 3 == 0,
            )
            for i, (status, control, retry) in enumerate(
                (s, c, r)
                for s in ("queued", "retry_wait", "running")
                for c in (None, "pause_requested", "resumed")
                for r in (None, "unclaimed")
            )
        ]
        build_state(db, jobs, occurrences)
        db.execute("ANALYZE")
        calls = [
            lambda: store.claim_next(owner_id="w", lease_ms=LEASE),
            lambda: store.claim_next(owner_id="w", lease_ms=LEASE, job_kind="agenda"),
            lambda: store.claim_next(owner_id="w", lease_ms=LEASE, workspace_id="ws-a"),
            lambda: store.claim_next(owner_id="w", lease_ms=LEASE, job_kind="routine", workspace_id="ws-a"),
            lambda: store.claim_batch(owner_id="w", lease_ms=LEASE, limit=50),
            lambda: store.claim_occurrence(occurrence_id="occ_000", owner_id="w", lease_ms=LEASE),
        ]
        plans = captured_plans(store, calls)
        claimed = store.claim_occurrence(
            occurrence_id="occ_001", owner_id="w2", lease_ms=LEASE
        ) or store.claim_next(owner_id="w3", lease_ms=LEASE)
        if claimed is not None:
            plans += captured_plans(
                store,
                [
                    lambda: store.renew(
                        occurrence_id=claimed.id,
                        owner_id=claimed.lease_owner,
                        fence=claimed.fence,
                        lease_ms=LEASE,
                    ),
                    lambda: store.settle(
                        occurrence_id=claimed.id,
                        owner_id=claimed.lease_owner,
                        fence=claimed.fence,
                        outcome="failed",
                    ),
                ],
            )
        assert plans
        for statement, plan in plans:
            assert not any("TEMP B-TREE" in step for step in plan), (statement, plan)
        due_arms = [step for _, plan in plans for step in plan if "scheduler_occurrences_claim" in step]
        assert any("(status=? AND available_at<?)" in step for step in due_arms)
        assert not any(
            step.startswith("SCAN o") or step.startswith("SCAN occurrences") for _, p in plans for step in p
        )
    finally:
        db.close()
        store.close()
