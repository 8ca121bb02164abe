"""Row locks for claims among concurrent writers (PostgreSQL: ``Backend.reruns_owned_writes``).

SQLite runs one writer at a time, so what a claim reads stays true until it commits. On
PostgreSQL (READ COMMITTED) other workers claim, settle, renew and sweep at the same time: the
claim statement (:mod:`scheduler.store.capabilities.claim_query`) is read without locks, and before rows are
claimed or swept this module locks them ``FOR UPDATE SKIP LOCKED``, so a row another transaction
holds is passed over at once instead of waited for. The locked rows are then read again: a
statement that starts after the lock sees every write committed before it, including the
runtime control, requeue request and adjudication rows that are not on the occurrence row (each
of their writers locks the occurrence row first, so none can change them while this transaction
holds it), and the claim or sweep is decided on those fresh rows.

Claims lock the first candidates free to take in one statement (:data:`LOCK_CANDIDATES`): the
candidates in the seed's order, limited to the number wanted, so among N workers reading the same
head of the queue each takes the first row the others do not hold without a statement per row
passed over. A candidate counts as free only if its fence and status are those it was read with,
checked on the statement's snapshot through a second reference to the table, not on the row
being locked: PostgreSQL locks the newest version of a row before it re-checks the ``WHERE``
clause (EvalPlanQual), and a condition on the locked row itself would leave a row that another
worker claimed and committed *during* the statement locked but not returned. Checked this way,
every row the statement locks is returned, as it is now, and one that changed is recognised.

Each lock attempt runs in a savepoint, kept only when every row locked is still to be claimed or
swept; otherwise the attempt is rolled back to the savepoint (releasing whatever it locked) and
repeated without the rows that changed. A worker therefore never keeps a lock on a row it does
not claim or sweep: the owner of a row locked that way (its settle or renew) waits only until the
attempt is rolled back, one round trip later. One savepoint per claim, reused
by the next attempt while nothing else ran (a transaction with many subtransactions slows every
snapshot on the server). A call the store may run again (``CallMode.may_run_again``) takes no savepoint for
a claim: where it would roll back to one, it raises ``RestartTransaction`` and the runner rolls
the whole call back and runs it again, with savepoints (a statement saved on every cycle against
a call run twice in the rare cycle whose candidate changed under its lock).

The quiet path locks the head in the statement that reads it (``queries.sql``'s
``claim_head``): :func:`locked_head` turns its result into the head as locked, to
be claimed on its probed control, requeue and job facts (:class:`LockedAsProbed`).

A sweep locks its whole batch (:data:`LOCK_EXPIRED`, the rows still expired on their final
attempt). A targeted claim (``claim_occurrence``) waits for the named row instead (plain ``FOR
UPDATE``): if another worker is claiming it right now, the targeted claim runs as if serially
after that claim (it then finds the row running under a live lease and returns ``None``).

The statements are dialect-free Core (``with_for_update`` renders nothing on SQLite, which never
runs them); the savepoint is standard SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from sqlalchemy import Integer, String, bindparam, case, cast, literal_column, select

from scheduler.backends.postgresql.queries import LOCKED_PREFIX
from scheduler.contract.constants import RUNNING
from scheduler.schema import tables as t
from scheduler.store.capabilities.claim_plan import (
    ClaimContention as ClaimContention,  # re-exported: the state the claim tactics read
)
from scheduler.store.capabilities.claim_plan import LockedAsProbed, claimable, plain, sort_key, sweepable
from scheduler.store.capabilities.claim_query import LOCKED_ROWS
from scheduler.store.plumbing.constructs import row_check
from scheduler.store.plumbing.statement_plans import Prepared, StoredRow
from scheduler.store.plumbing.tx import RestartTransaction, Tx

_o = t.occurrences
_seen = t.occurrences.alias("as_read")


def _version(table: Any) -> Any:
    """``id:fence:status``, one value per row version a claim tells apart (see :func:`version`).

    Compared as one value rather than as ``(id, fence, status) IN …``: PostgreSQL factors the
    terms every candidate shares (``status = 'queued' AND fence = 0``) out of that list, and on a
    queue without statistics then walks the status index instead of the primary key.
    """
    return (
        table.c.occurrence_id
        + literal_column("':'")
        + cast(table.c.fence, String)
        + literal_column("':'")
        + table.c.status
    )


def version(occurrence_id: str, fence: int, status: str) -> str:
    """A row version's ``id:fence:status`` as :data:`LOCK_CANDIDATES` compares it (unambiguous:
    the fence is an integer and no status contains ``:``)."""
    return f"{occurrence_id}:{fence}:{status}"


_ids: Any = bindparam("p_ids", expanding=True)


def _lock_candidates(*columns: Any) -> Prepared:
    return Prepared(
        select(*columns)
        .where(
            _o.c.occurrence_id.in_(_ids),
            _o.c.occurrence_id.in_(
                select(_seen.c.occurrence_id).where(
                    _seen.c.occurrence_id.in_(_ids),
                    _version(_seen).in_(bindparam("p_versions", expanding=True)),
                )
            ),
        )
        .order_by(
            case(
                (_o.c.status == literal_column(f"'{RUNNING}'"), _o.c.lease_expires_at),
                else_=_o.c.available_at,
            ),
            _o.c.scheduled_for,
            _o.c.occurrence_id,
        )
        .limit(bindparam("p_limit", type_=Integer(), literal_execute=True))
        .with_for_update(skip_locked=True, of=_o),
        passes_kept_writes=True,
    )


LOCK_CANDIDATES: Final = _lock_candidates(_o.c.occurrence_id, _o.c.fence, _o.c.status)
"""The first ``p_limit`` of the candidates ``p_ids`` in the seed's order (``claim_plan.sort_key``)
that no other transaction holds and that had, when the statement began, the fence and status
they were read with (``p_versions``: :func:`version` of each); each is returned as it is once
locked."""
LOCK_CANDIDATE_ROWS: Final = _lock_candidates(*_o.c)
"""``LOCK_CANDIDATES`` returning every column of each row as locked (a claim of one plain
candidate, in a call the store may run again, is decided on it without reading the row again:
``claim_plan.LockedAsProbed``)."""
LOCK_EXPIRED: Final = Prepared(
    select(_o.c.occurrence_id)
    .where(
        _o.c.occurrence_id.in_(bindparam("p_ids", expanding=True)),
        row_check(_o.c.status == literal_column(f"'{RUNNING}'")),
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
    if not tx.claim_savepoint_kept:
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
    # The savepoint stays established after the rollback, and the transaction is as it was when
    # it was taken: the next lock round (usually the next candidate) starts from it instead of
    # nesting another one.
    tx.claim_savepoint_kept = True
    return []


def _kept(row: StoredRow, fresh: dict[str, StoredRow], keep: Callable[[StoredRow, StoredRow], bool]) -> bool:
    now_row = fresh.get(row.occurrence_id)
    return now_row is not None and keep(row, now_row)


def lock_candidates(tx: Tx, candidates: Sequence[StoredRow], count: int) -> tuple[list[StoredRow], int]:
    """The first ``count`` candidates (given in the seed's order) this transaction could lock, as
    they are now, and how many of ``candidates`` were looked at; those after stay candidates.

    A candidate is passed over when another transaction holds it, when its fence or status
    changed since it was read (another worker claimed or settled it), or when its fresh row is
    no longer claimable at the same place in the seed's order (e.g. its lease was renewed).
    """
    now = tx.now

    def keep(read: StoredRow, fresh: StoredRow) -> bool:
        return _same_place(fresh, read, now)

    savepoint = not tx.call.may_run_again
    if savepoint and not tx.claim_savepoint_kept:
        tx.driver_sql(SAVEPOINT)
    as_locked = not savepoint and count == 1  # one row, decided on its columns as locked
    statement = LOCK_CANDIDATE_ROWS if as_locked else LOCK_CANDIDATES
    position = {row.occurrence_id: index for index, row in enumerate(candidates)}
    remaining = list(candidates)
    while remaining:
        params = {
            "p_ids": [row.occurrence_id for row in remaining],
            "p_versions": [version(row.occurrence_id, row.fence, row.status) for row in remaining],
            "p_limit": count,
        }
        locked = tx.all(statement, params)
        if not locked:
            break  # nothing was locked: the transaction is as it was at the savepoint
        seen = len(candidates)
        if len(locked) == count:  # the limit stopped the statement: later candidates were not looked at
            seen = max(position[row.occurrence_id] for row in locked) + 1
        read = {row.occurrence_id: row for row in remaining}
        unchanged = [row.occurrence_id for row in locked if _as_read(row, read[row.occurrence_id])]
        if len(unchanged) == len(locked) and as_locked and all(plain(read[key]) for key in unchanged):
            (row,) = locked
            claimed = _as_locked(read[row.occurrence_id], row, _ROW_NAMES)
            if not _still_first(claimed, read[row.occurrence_id], now):
                raise RestartTransaction  # changed under the lock: the call runs again
            return [claimed], seen
        if len(unchanged) == len(locked):
            fresh = {row.occurrence_id: row for row in tx.all(LOCKED_ROWS, {"p_ids": sorted(unchanged)})}
            kept = [fresh[key] for key in unchanged if _kept(read[key], fresh, keep)]
            if len(kept) == len(locked):
                return sorted(kept, key=lambda row: position[row.occurrence_id]), seen
            unchanged = [row.occurrence_id for row in kept]
        # A row changed while the statement ran, or is no longer to be claimed: release
        # everything this attempt locked and try again without the rows that changed (a
        # call the store may run again has no savepoint: the whole call runs again, with one).
        if not savepoint:
            raise RestartTransaction
        tx.driver_sql(ROLLBACK_TO_SAVEPOINT)
        changed = {row.occurrence_id for row in locked} - set(unchanged)
        remaining = [row for row in remaining if row.occurrence_id not in changed]
    # Nothing stays locked, and the savepoint is still established: the next attempt reuses it.
    tx.claim_savepoint_kept = savepoint
    return [], len(candidates)


_LOCKED_NAMES: Final = tuple((column.name, LOCKED_PREFIX + column.name) for column in _o.c)
_ROW_NAMES: Final = tuple((column.name, column.name) for column in _o.c)


def locked_head(tx: Tx, rows: Sequence[StoredRow], head: StoredRow | None) -> LockedAsProbed | None:
    """The head ``queries.CLAIM_HEAD`` locked (``rows``: its result; ``head``:
    the candidate its plan chose), or ``None`` when it locked nothing (another transaction holds
    the head). In a call the store may run again only: a locked row that is not the plan's head, or
    that changed while the statement ran, cannot be released there (``RestartTransaction``)."""
    locked = next((row for row in rows if getattr(row, LOCKED_PREFIX + "occurrence_id") is not None), None)
    if locked is None:
        return None
    if head is None or locked.occurrence_id != head.occurrence_id:
        raise RestartTransaction
    fresh = _as_locked(head, locked, _LOCKED_NAMES)
    if not _still_first(fresh, head, tx.now):
        raise RestartTransaction
    return fresh


def _as_locked(read: StoredRow, locked: StoredRow, names: Sequence[tuple[str, str]]) -> LockedAsProbed:
    """``read`` with the occurrence columns of ``locked`` (``names``: column, name in ``locked``)."""
    values = read._mapping
    if type(values) is not dict:  # a fast-path row's is a fresh dict already
        values = dict(values)
    for name, locked_name in names:
        values[name] = getattr(locked, locked_name)
    return LockedAsProbed(values)


def _still_first(fresh: StoredRow, read: StoredRow, now: int) -> bool:
    """The row as locked is the version read, claimable at the same place in the seed's order."""
    return _as_read(fresh, read) and _same_place(fresh, read, now)


def _same_place(fresh: StoredRow, read: StoredRow, now: int) -> bool:
    """The fresh row is claimable at the place in the seed's order the read row had."""
    return claimable(fresh, now) and sort_key(fresh) == sort_key(read)


def _as_read(locked: StoredRow, read: StoredRow) -> bool:
    return bool(locked.fence == read.fence and locked.status == read.status)


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
