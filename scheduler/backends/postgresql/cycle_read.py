"""The first statement of a quiet ``settle_and_claim`` among concurrent writers (PostgreSQL).

One statement does what the cycle's first two did: it locks the settled occurrence and reads
it with its control, reservation and adjudication (``settlement.CURRENT_ROWS``), reads the
server clock after that lock, and with that clock as ``now`` reads the queue's heads and locks a
plain head (``claim_query.build_head_probe_and_lock``)::

    WITH cycle_started AS MATERIALIZED (SELECT clock_timestamp() AS at),
         locked_current AS MATERIALIZED (SELECT … FROM occurrences …
                                         WHERE occurrence_id = :p_id
                                           AND (SELECT at FROM cycle_started) IS NOT NULL
                                         FOR UPDATE OF occurrences),
         cycle_clock AS MATERIALIZED (SELECT <clock_timestamp() in ms> AS now,
                                             <µs since cycle_started> AS waited_us
                                      FROM (SELECT count(*) FROM locked_current) AS current_locked),
         probe AS MATERIALIZED (<the head probe, now = (SELECT now FROM cycle_clock)>),
         head AS (…), locked AS MATERIALIZED (…)
    SELECT locked_current.* AS settled_*, cycle_clock.*, heads.*
    FROM locked_current CROSS JOIN cycle_clock
         LEFT OUTER JOIN (<heads and the locked head>) AS heads ON true

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
(``claim_query.build_head_window``) replaces the probe and lock: no ``locked_*`` columns and no
``head_plain`` (with them, always NULL, the statement cost ~60 µs more server CPU per cycle).

Each result row carries the settled row (``settled_<column>``, the same on every row) and one
probe or window row (its own column names, ``arm`` NULL when nothing is due), so the rows serve as they
are as the probe's rows.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import BigInteger, bindparam, exists, func, literal_column, select, true

from scheduler.contract.constants import RUNNING
from scheduler.schema import tables as t
from scheduler.store.capabilities.claim_query import (
    ClaimFilter,
    Shape,
    build_head_probe_and_lock,
    build_head_window,
    head_probe_params,
)
from scheduler.store.capabilities.settlement import CURRENT_ROWS
from scheduler.store.plumbing.constructs import micros_since, row_version, server_clock_ms, server_instant
from scheduler.store.plumbing.statement_plans import STATEMENTS_LOCK, Prepared, StoredRow
from scheduler.store.plumbing.tx import RestartTransaction, Tx

SETTLED_PREFIX: Final = "settled_"
MAX_WAIT_US: Final = 2000
"""A lock wait longer than this (µs from the statement's start to the clock read) means the heads
were read on a snapshot older than the call's clock by more than a statement's own run time."""

_o = t.occurrences
_as_read = t.occurrences.alias("settled_as_read")
_CURRENT_NAMES: Final = tuple(column.name for column in CURRENT_ROWS.selected_columns)


@dataclass(frozen=True, slots=True)
class SettledLock:
    """The statement's first CTEs: ``current`` (the settled row locked, with its control,
    reservation, adjudication and ``row_version``), ``clock`` (``now`` read after that lock, and
    ``waited_us``), ``now`` (``clock``'s ``now`` as a scalar), ``lease_held`` (the settlement's
    lease is held at ``now``: binds ``p_owner``, ``p_fence``) and ``version_as_read`` (the settled
    row's version on the statement's snapshot)."""

    current: Any
    clock: Any
    now: Any
    lease_held: Any
    version_as_read: Any


_SLIM_CURRENT: Final = (
    "occurrence_id",
    "status",
    "lease_owner",
    "fence",
    "lease_expires_at",
    "control_state",
    "reservation_status",
    "adjudication_status",
)
"""The columns of the settled row ``cycle_statement`` reads (it writes the rest from the row itself)."""


def settled_lock(server_clock: bool, slim: bool = False) -> SettledLock:
    """The settled row (bind ``p_id``) locked, then the clock read (the server's, else the bind
    ``now``): the first steps of this statement and of ``cycle_statement``'s (``slim``: with only
    the columns of :data:`_SLIM_CURRENT` and ``row_version``)."""
    started = select(server_instant().label("at")).cte("cycle_started").prefix_with("MATERIALIZED")
    started_at = select(started.c.at).scalar_subquery()
    rows = CURRENT_ROWS
    if slim:
        rows = rows.with_only_columns(*[rows.selected_columns[name] for name in _SLIM_CURRENT])
    current = (
        rows.add_columns(row_version(_o).label("row_version"))
        .where(_o.c.occurrence_id == bindparam("p_id"), started_at.is_not(None))
        .with_for_update(of=_o)
        .cte("locked_current")
        .prefix_with("MATERIALIZED")
    )
    locked = select(func.count().label("rows")).select_from(current).subquery("current_locked")
    now = server_clock_ms() if server_clock else bindparam("now", type_=BigInteger())
    clock = (
        select(now.label("now"), micros_since(started_at).label("waited_us"))
        .select_from(locked)
        .cte("cycle_clock")
        .prefix_with("MATERIALIZED")
    )
    clock_now = select(clock.c.now).scalar_subquery()
    # The head is locked only for a settlement that holds its lease (settlement._lease_held): a
    # call that fails with SCHEDULER_LEASE_LOST never holds a row it does not claim.
    lease_held = exists().where(
        current.c.status == literal_column(f"'{RUNNING}'"),
        current.c.lease_owner == bindparam("p_owner"),
        current.c.fence == bindparam("p_fence"),
        current.c.lease_expires_at > clock_now,
    )
    as_read = (
        select(row_version(_as_read)).where(_as_read.c.occurrence_id == bindparam("p_id")).scalar_subquery()
    )
    return SettledLock(current, clock, clock_now, lease_held, as_read)


def _build(shape: Shape, server_clock: bool, window: bool) -> Any:
    settled = settled_lock(server_clock)
    current, clock = settled.current, settled.clock
    heads: Any
    if window:  # a claim among workers: candidates to lock in a statement of their own
        heads = build_head_window(shape, settled.now)
    else:
        heads = build_head_probe_and_lock(shape, now=settled.now, lock_if=settled.lease_held)
    probed = heads.subquery("heads")
    return select(
        *[column.label(SETTLED_PREFIX + column.name) for column in current.c],
        settled.version_as_read.label(SETTLED_PREFIX + "version_as_read"),
        clock.c.now.label(SETTLED_PREFIX + "server_now"),
        clock.c.waited_us.label(SETTLED_PREFIX + "waited_us"),
        probed,
    ).select_from(current.join(clock, true()).outerjoin(probed, true()))


def _prepared(shape: Shape, server_clock: bool, window: bool) -> Prepared:
    with STATEMENTS_LOCK:  # built from module-level statements every thread shares
        return _built(shape, server_clock, window)


@functools.cache
def _built(shape: Shape, server_clock: bool, window: bool) -> Prepared:
    return Prepared(_build(shape, server_clock, window), locks=True)


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
    params = head_probe_params(0 if server_clock else tx.now, claim_filter)
    if server_clock:
        del params["now"]  # the statement reads its own clock
    params["p_id"] = occurrence_id
    params["p_owner"] = owner_id
    params["p_fence"] = fence
    rows = tx.all(_prepared(claim_filter.shape, server_clock, window), params)
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
