"""A cancelled ``claim_next`` may have committed its claim: what docs/async.md tells you to do.

The cancellation here arrives while the claim's ``COMMIT`` is in flight (aiosqlite runs it on its
own thread, which finishes it): the caller gets ``CancelledError`` and the occurrence is running
under the caller's ``owner_id``. Retrying ``claim_next`` claims the next occurrence, not this
one. The documented ways out both work: find the claim by owner in ``history()`` (the
``occurrence_claimed`` event) and settle it with the fence ``get_occurrence`` shows, or let the
lease expire, after which any worker claims it again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from lifecycle_support import AUTHORITY
from recorded import T0
from sqlalchemy import event

from scheduler.aio import AsyncSchedulerStore, open_async_store

LEASE = 30_000


async def claim_cancelled_at_commit(store: AsyncSchedulerStore, owner: str) -> None:
    """``claim_next`` whose task is cancelled as its COMMIT starts; CancelledError is expected."""
    caller: asyncio.Task[Any] | None = None

    def cancel_the_caller(*_args: Any) -> None:
        if caller is not None:
            caller.cancel()

    await store.run_sync(lambda sync: event.listen(sync.connection, "commit", cancel_the_caller))
    caller = asyncio.ensure_future(store.claim_next(owner_id=owner, lease_ms=LEASE))
    try:
        await caller
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("claim_next was not cancelled")
    finally:
        caller = None
        await store.run_sync(lambda sync: event.remove(sync.connection, "commit", cancel_the_caller))


def test_a_cancelled_claim_may_have_committed_and_is_recovered_by_owner(tmp_path: Path) -> None:
    now = [T0]

    async def body() -> None:
        async with await open_async_store(tmp_path / "kernel.sqlite", clock=lambda: now[0]) as store:
            await store.create_job(id="job", kind="mail", authority=AUTHORITY)
            first = (await store.enqueue_occurrence(job_id="job", scheduled_for=T0, trigger_key="a")).id
            await store.enqueue_occurrence(job_id="job", scheduled_for=T0 + 1, trigger_key="b")
            now[0] += 1000
            await claim_cancelled_at_commit(store, "worker-1")

            claimed = await store.get_occurrence(first)
            assert claimed is not None and (claimed.status, claimed.lease_owner) == ("running", "worker-1")
            retried = await store.claim_next(owner_id="worker-1", lease_ms=LEASE)
            assert retried is not None and retried.id != first  # a retry claims the next one

            # Recover the claim by owner: the newest occurrence_claimed event of this owner.
            mine = [
                event.occurrence_id
                for event in await store.history(job_id="job", limit=200)
                if event.type == "occurrence_claimed" and event.owner_id == "worker-1"
            ]
            assert first in mine
            held = await store.get_occurrence(first)
            assert held is not None
            settled = await store.settle(
                occurrence_id=first, owner_id="worker-1", fence=held.fence, outcome="succeeded"
            )
            assert settled.status == "succeeded"

            # Or leave it: once its lease expires another worker claims it again.
            await store.enqueue_occurrence(job_id="job", scheduled_for=T0 + 2, trigger_key="c")
            now[0] += 1000
            await claim_cancelled_at_commit(store, "worker-2")
            assert await store.claim_next(owner_id="worker-3", lease_ms=LEASE) is None
            now[0] += LEASE + 1
            again = await store.claim_next(owner_id="worker-3", lease_ms=LEASE)
            assert again is not None and again.lease_owner == "worker-3"

    asyncio.run(body())
