"""Row locks for claims among concurrent writers (PostgreSQL; ``Tx.concurrent``).

SQLite runs one writer at a time, so what a claim reads stays true until it commits. On
PostgreSQL (READ COMMITTED) other workers claim, settle, renew and sweep at the same time: the
claim statement (:mod:`scheduler.store.claim_query`) is read without locks, and before rows are
claimed or swept this module locks them ``FOR UPDATE SKIP LOCKED`` with the fence and status
(sweep: the expiry) they were read with, so a row another transaction holds is passed over at
once instead of waited for. The locked rows are then read again: a statement that starts after
the lock sees every write committed before it, including the runtime control, requeue request
and adjudication rows that are not on the occurrence row (each of their writers locks the
occurrence row first, so none can change them while this transaction holds it), and the claim
or sweep is decided on those fresh rows.

PostgreSQL locks the newest version of a row before it re-checks the ``WHERE`` clause
(EvalPlanQual): a row another worker claimed and committed *during* the lock statement is locked
although it is not returned. So each lock attempt runs in a savepoint, and it is kept only when
every row asked for was locked and is still to be claimed or swept; otherwise the attempt is
rolled back to the savepoint (releasing whatever it locked) and repeated with the rows that were
fine. A worker therefore never keeps a lock on a row it does not claim or sweep, and never makes
the owner of such a row wait. One savepoint per lock round, not per row (a transaction with many
subtransactions slows every snapshot on the server).

A targeted claim (``claim_occurrence``) waits for the named row instead (plain ``FOR UPDATE``):
if another worker is claiming it right now, the targeted claim runs as if serially after that
claim (it then finds the row running under a live lease and returns ``None``).

The statements are dialect-free Core (``with_for_update`` renders nothing on SQLite, which never
runs them); the savepoint is standard SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from sqlalchemy import bindparam, literal_column, select, tuple_

from scheduler.contract.constants import RUNNING
from scheduler.schema import tables as t
from scheduler.store.claim_plan import claimable, sort_key, sweepable
from scheduler.store.claim_query import LOCKED_ROWS
from scheduler.store.fastpath import Prepared, StoredRow
from scheduler.store.tx import Tx

_o = t.occurrences
LOCK_CANDIDATES: Final = Prepared(
    select(_o.c.occurrence_id)
    .where(tuple_(_o.c.occurrence_id, _o.c.fence, _o.c.status).in_(bindparam("p_keys", expanding=True)))
    .with_for_update(skip_locked=True)
)
"""The candidates (id, fence, status) that still have the fence and status they were read with
and that no other transaction holds."""
LOCK_EXPIRED: Final = Prepared(
    select(_o.c.occurrence_id)
    .where(
        _o.c.occurrence_id.in_(bindparam("p_ids", expanding=True)),
        _o.c.status == literal_column(f"'{RUNNING}'"),
        _o.c.lease_expires_at <= bindparam("p_now"),
        _o.c.attempt >= _o.c.max_attempts,
    )
    .with_for_update(skip_locked=True)
)
"""Those of a sweep batch still expired on their final attempt that no other transaction holds."""
LOCK_TARGET: Final = Prepared(
    select(_o.c.occurrence_id).where(_o.c.occurrence_id == bindparam("p_id")).with_for_update()
)
"""The named occurrence of a targeted claim, waiting for a transaction holding it."""

SAVEPOINT: Final = "SAVEPOINT scheduler_claim_lock"
ROLLBACK_TO_SAVEPOINT: Final = "ROLLBACK TO SAVEPOINT scheduler_claim_lock"


def _lock_exactly(
    tx: Tx,
    rows: Sequence[StoredRow],
    lock: Callable[[Sequence[StoredRow]], tuple[Prepared, dict[str, Any]]],
    keep: Callable[[StoredRow, StoredRow], bool],
) -> list[StoredRow]:
    """Lock ``rows`` (SKIP LOCKED), read them again, and return the fresh rows ``keep(read, fresh)``
    accepts, in the order given; nothing else stays locked (see the module docstring)."""
    if not rows:
        return []
    tx.driver_sql(SAVEPOINT)
    wanted = list(rows)
    while wanted:
        statement, params = lock(wanted)
        locked = {row.occurrence_id for row in tx.all(statement, params)}
        if len(locked) == len(wanted):
            fresh = {row.occurrence_id: row for row in tx.all(LOCKED_ROWS, {"p_ids": sorted(locked)})}
            kept = [fresh[row.occurrence_id] for row in wanted if _kept(row, fresh, keep)]
            if len(kept) == len(wanted):
                return kept
            locked = {row.occurrence_id for row in kept}
        # Some row was not locked, or changed: release everything this attempt locked (at once,
        # so the owner of a row locked by mistake waits as little as possible) and try again.
        tx.driver_sql(ROLLBACK_TO_SAVEPOINT)
        wanted = [row for row in wanted if row.occurrence_id in locked]
    return []


def _kept(row: StoredRow, fresh: dict[str, StoredRow], keep: Callable[[StoredRow, StoredRow], bool]) -> bool:
    now_row = fresh.get(row.occurrence_id)
    return now_row is not None and keep(row, now_row)


def lock_candidates(tx: Tx, candidates: Sequence[StoredRow]) -> list[StoredRow]:
    """The candidates this transaction could lock, as they are now, in the order given.

    A candidate is passed over when another transaction holds it, when its fence or status
    changed since it was read (another worker claimed or settled it), or when its fresh row is
    no longer claimable at the same place in the seed's order (e.g. its lease was renewed).
    """
    now = tx.now

    def lock(rows: Sequence[StoredRow]) -> tuple[Prepared, dict[str, Any]]:
        return LOCK_CANDIDATES, {"p_keys": [(row.occurrence_id, row.fence, row.status) for row in rows]}

    def keep(read: StoredRow, fresh: StoredRow) -> bool:
        return claimable(fresh, now) and sort_key(fresh) == sort_key(read)

    return _lock_exactly(tx, candidates, lock, keep)


def locked_sweep(tx: Tx, batch: Sequence[StoredRow]) -> list[StoredRow]:
    """The rows of a sweep batch this transaction could lock, as they are now, in the batch's
    order; rows another transaction holds, and rows no longer to be swept, are left out.

    No statement runs for an empty batch (the common case: no expired final attempt)."""
    now = tx.now

    def lock(rows: Sequence[StoredRow]) -> tuple[Prepared, dict[str, Any]]:
        return LOCK_EXPIRED, {"p_ids": [row.occurrence_id for row in rows], "p_now": now}

    def keep(_read: StoredRow, fresh: StoredRow) -> bool:
        return fresh.status == RUNNING and fresh.lease_expires_at <= now and sweepable(fresh)

    return _lock_exactly(tx, batch, lock, keep)


def lock_target(tx: Tx, occurrence_id: str) -> None:
    """Hold the named occurrence (waiting for a transaction that holds it, up to the lock timeout)."""
    tx.first(LOCK_TARGET, {"p_id": occurrence_id})
