"""The first statement of a quiet ``settle_and_claim`` among concurrent writers (PostgreSQL).

One statement does what the cycle's first two did: it locks the settled occurrence and reads
it with its control, reservation and adjudication (``settlement.CURRENT_ROWS``), reads the
server clock after that lock, and with that clock as ``now`` reads the queue's heads and locks a
plain head, as ``claim_head`` does for a single claim: the statements ``cycle_read`` and
``cycle_read_window`` of ``queries.sql``.

The clock depends on the settled row being locked, and the probe on the clock, so PostgreSQL
takes the lock first, then reads the clock (API §8), then the heads. The heads are read on the
statement's snapshot, taken before the lock, so the call runs again the usual way
(``RestartTransaction``) rather than claim on that older snapshot when

* the settled row was updated by a transaction that committed after the snapshot (the row as
  locked is a newer version than a second reference to it reads: ``dialect.row_version``): the
  call would otherwise see that transaction's write to the settled row but not its other writes,
  which no serial order explains; or
* the lock waited longer than :data:`MAX_WAIT_US` (``waited_us``, from an instant read just
  before the lock, after the statement's snapshot and its planning): other transactions may have
  committed meanwhile, and the heads should not be older than the call's clock by more than a
  statement's own run time. (Measured from the statement's start, as it was, it also counted the
  planning of an ``EXECUTE`` sent in a simple query — the named statements' first runs, and
  any run after a plan invalidation — as a wait.)

Among workers that hold the first candidates (``claim_locks.ClaimContention``) the statement
reads the first ``claim_query.HEAD_WINDOW`` due rows of each waiting status and locks none of
them: a head locked here on the statement's older snapshot is often one another worker claimed
and committed meanwhile (PostgreSQL then locks its newest version, and the call would have to
run again). The first free row of the window is locked by a statement of its own
(``claim_locks.lock_candidates``: ``LOCK_CANDIDATE_ROWS`` on a fresh snapshot; three statements
a contended cycle, where reading the full candidate list made four). Since contended cycles also take this
statement, a lock wait over :data:`MAX_WAIT_US` or a
settled row changed meanwhile runs them again too, as it does quiet ones. The window
(``cycle_read_window``) replaces the probe and lock: no ``locked_*`` columns and no
``head_plain`` (with them, always NULL, the statement cost ~60 µs more server CPU per cycle).

Each result row carries the settled row (``settled_<column>``, the same on every row) and one
probe or window row (its own column names, ``arm`` NULL when nothing is due), so the rows serve as they
are as the probe's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from scheduler.backends.postgresql import queries
from scheduler.store.capabilities.claim_eligibility import ClaimFilter
from scheduler.store.capabilities.settlement import CURRENT_ROWS
from scheduler.store.plumbing.statement_plans import StoredRow
from scheduler.store.plumbing.tx import RestartTransaction, Tx

SETTLED_PREFIX: Final = "settled_"
MAX_WAIT_US: Final = 2000
"""A lock wait longer than this (µs from the statement's start to the clock read) means the heads
were read on a snapshot older than the call's clock by more than a statement's own run time
(``queries.sql`` writes it into the cycle statements: ``waited_us <= 2000``)."""

_CURRENT_NAMES: Final = tuple(column.name for column in CURRENT_ROWS.selected_columns)


def cycle_parameters(
    tx: Tx, occurrence_id: str, owner_id: str, fence: int, claim_filter: ClaimFilter
) -> dict[str, Any]:
    """The parameters every statement of ``queries.sql`` takes: with the server clock
    (``Tx.clock_unread``) ``now`` is NULL, and the statement reads the clock after its lock."""
    parameters = queries.filter_parameters(claim_filter.kinds, claim_filter.workspace_id)
    parameters["now"] = None if tx.clock_unread else tx.now
    parameters["p_id"] = occurrence_id
    parameters["p_owner"] = owner_id
    parameters["p_fence"] = fence
    return parameters


@dataclass(frozen=True, slots=True)
class CycleRead:
    """What the statement read: the settled row's columns (``None``: no such occurrence) and
    the head probe's rows (with the ``locked_*`` columns of the head it locked), or the window
    of heads' rows (``window``: no ``locked_*`` columns)."""

    current: dict[str, Any] | None
    heads: Sequence[StoredRow]


def read_cycle(
    tx: Tx, occurrence_id: str, owner_id: str, fence: int, claim_filter: ClaimFilter, window: bool = False
) -> CycleRead:
    """Run the statement for the settlement of ``occurrence_id`` (held by ``owner_id`` at ``fence``)
    and a claim with ``claim_filter``; with ``window``, the probe reads ``claim_query.HEAD_WINDOW``
    due entries per status and locks none (a claim among workers holding the first ones);
    with the server clock (``Tx.clock_unread``), ``tx``'s clock is read after the lock, else the
    injected clock's sample is ``now``. A call the store may run again only (a long lock wait
    restarts the call)."""
    server_clock = tx.clock_unread
    params = cycle_parameters(tx, occurrence_id, owner_id, fence, claim_filter)
    rows = tx.all(queries.CYCLE_READ_WINDOW if window else queries.CYCLE_READ, params)
    if not rows:
        return CycleRead(None, ())
    first = rows[0]
    if getattr(first, SETTLED_PREFIX + "waited_us") > MAX_WAIT_US or getattr(
        first, SETTLED_PREFIX + "row_version"
    ) != getattr(first, SETTLED_PREFIX + "version_as_read"):
        raise RestartTransaction
    if server_clock:
        tx.adopt_clock(getattr(first, SETTLED_PREFIX + "server_now"))
    current = dict(zip(_CURRENT_NAMES, first, strict=False))  # the first columns, in this order
    return CycleRead(current, [row for row in rows if row.arm is not None])
