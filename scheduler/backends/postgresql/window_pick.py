"""A contended ``settle_and_claim`` whose claim is taken inside its writes statement (PostgreSQL).

Among workers that hold the first candidates (``claim_locks.ClaimContention``) the cycle's first
statement reads the window of heads (``cycle_read``). The first free candidate of that window
used to be locked by a statement of its own (``claim_locks.lock_candidates``), the writes and
``COMMIT`` following in a third round trip. Where every candidate is a plain waiting row, the
call now keeps a *pending pick* (:class:`PendingPick`): the candidates in the seed's order, each
checked against what ``Claims.claim`` of it would write (``Claims.prepare``, the same code). The
call's writes statement (``Tx.flush_writes``) then locks and claims the first one free, writes
the call's events with the claim's last, and goes out with the ``COMMIT``::

    WITH w0 AS (<each kept write, as write_batch.combined>),
         pick AS MATERIALIZED (SELECT occurrence_id, fence, status FROM occurrences
                               WHERE occurrence_id IN (<candidates>)
                                 AND <version> IN (<the candidates' versions as read>)
                               ORDER BY <window position> LIMIT 1
                               FOR UPDATE OF occurrences SKIP LOCKED),
         claim AS (UPDATE occurrences SET status = 'running', attempt = attempt + 1,
                          fence = fence + 1, lease_owner = …, …
                   FROM pick WHERE <the picked row, at its version> AND <PLAIN_CLAIM_GUARD>
                   RETURNING occurrence_id, job_id, fence, attempt, pick.status),
         ev AS (INSERT INTO events … SELECT <the call's other events> UNION ALL
                SELECT <the claim event> FROM claim RETURNING 1)
    SELECT <counts>, (SELECT occurrence_id FROM claim) AS picked, <check>

A candidate's version is ``id:fence:status:attempt:available_at:scheduled_for``; on the row as
locked it is the one read, so the claim writes what ``Claims.claim`` of the row as read writes.
A candidate another transaction holds is passed over (``SKIP LOCKED``); one that changed since the
window was read fails the version check on the statement's snapshot and is passed over without
being locked; one changed by a transaction that committed after that snapshot is locked in its
newest version, which then fails the same check (PostgreSQL re-checks the ``WHERE`` clause on the
row it locked) and is passed over too. Such a row stays locked until this statement's own
``COMMIT``, in the same round trip: its owner's next write of it waits that long (the separate
lock statement released it one round trip later, by running the call again).

The statement's check fails it, with its ``COMMIT``, when a kept write missed its row, when the
claim ``UPDATE`` found the picked row's control, requeue request or job changed
(``PLAIN_CLAIM_GUARD``), or when no candidate was free while due rows may lie beyond the window
(``claim_plan.ClaimPlan.dry``): the call then runs again (``RestartTransaction``) the way it ran
before this module. When the window held every due row and none was free, the call settles and
claims nothing, as ``lock_candidates`` finding none decides.

So a contended cycle is two statements: its first statement and this one. A successful one is
first tried as one statement (``cycle_statement``, the window variant); this path serves where
that statement misses or does not apply.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Final

from sqlalchemy import (
    Integer,
    String,
    and_,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal_column,
    or_,
    select,
    union_all,
)
from sqlalchemy.sql.elements import BindParameter

from scheduler.contract.constants import QUEUED, RETRY_WAIT
from scheduler.schema import tables as t
from scheduler.store.capabilities.claim_plan import plain
from scheduler.store.capabilities.claim_query import replace_binds
from scheduler.store.capabilities.occurrence_rows import event_data_json
from scheduler.store.plumbing.restart import RestartTransaction
from scheduler.store.plumbing.statement_plans import STATEMENTS_LOCK, Prepared, StoredRow
from scheduler.store.plumbing.telemetry import records_event
from scheduler.store.plumbing.write_batch import (
    EVENT_COLUMNS,
    combined_parameters,
    count_check,
    part_counts,
    part_name,
)
from scheduler.store.records import Occurrence, SettledAndClaimed

MAX_CANDIDATES: Final = 16
"""At most this many candidates are picked from in the writes statement (the window of heads holds
``claim_query.HEAD_WINDOW`` rows of each of the two waiting statuses)."""
CLAIMED: Final = "occurrence_claimed"
_WAITING: Final = frozenset({QUEUED, RETRY_WAIT})
_o = t.occurrences
Prepare = Callable[[StoredRow, bool], tuple[dict[str, Any], dict[str, Any], Occurrence | None]]
_CLAIM_BINDS: Final = {"p_owner": "claim_owner", "p_expires": "claim_expires", "p_now": "claim_now"}


def version_sql(table: Any) -> Any:
    """``id:fence:status:attempt:available_at:scheduled_for`` of a row (see :func:`version`)."""
    expression: Any = table.c.occurrence_id
    for name in ("fence", "status", "attempt", "available_at", "scheduled_for"):
        value = table.c[name]
        expression = expression + literal_column("':'") + (value if name == "status" else cast(value, String))
    return expression


def version(row: StoredRow) -> str:
    """A candidate's version as read, as :func:`version_sql` renders it (the fence, attempt and
    times are integers and no status contains ``:``, so it is unambiguous)."""
    return (
        f"{row.occurrence_id}:{row.fence}:{row.status}:{row.attempt}:{row.available_at}:{row.scheduled_for}"
    )


def claim_data_json(attempt: int, previous_status: str) -> str:
    """The claim event's data of a plain waiting row, as the statement writes it
    (:func:`_claim_data_json`); used only where it equals the canonical text of the event's data."""
    return f'{{"attempt":{attempt},"previousOwner":null,"previousStatus":"{previous_status}"}}'


def claim_data_sql(claimed: Any) -> Any:
    """SQL for :func:`claim_data_json` of ``claimed``'s ``attempt`` and ``previous_status``."""
    return (
        literal_column("""'{"attempt":'""")
        + cast(claimed.c.attempt, String)
        + literal_column("""',"previousOwner":null,"previousStatus":"'""")
        + claimed.c.previous_status
        + literal_column("""'"}'""")
    )


class PendingPick:
    """The window's candidates (plain, waiting, in the seed's order) and, for each, what
    ``Claims.claim`` of it returns; resolved by the writes statement."""

    __slots__ = ("_done", "_prepare", "candidates", "claim", "events", "may_be_empty", "picked", "shared")

    def __init__(
        self,
        claim: Callable[[], Any],
        candidates: Sequence[StoredRow],
        prepare: Prepare,
        shared: dict[str, Any],
        *,
        may_be_empty: bool,
        done: Callable[[int | None], None],
    ) -> None:
        self.claim = claim
        self.candidates = tuple(candidates)
        self._prepare = prepare
        self.shared = shared
        self.may_be_empty = may_be_empty
        self.picked: Occurrence | None = None
        self.events: list[dict[str, Any]] = []
        """The claim event's row, once a candidate was claimed."""
        self._done = done

    @classmethod
    def of(
        cls,
        claim: Callable[[], Any],
        candidates: Sequence[StoredRow],
        prepare: Prepare,
        now: int,
        *,
        may_be_empty: bool,
        done: Callable[[int | None], None],
    ) -> PendingPick | None:
        """A pending pick of ``candidates`` (in the seed's order), or ``None`` where the writes
        statement would not write exactly what ``Claims.claim`` would.

        ``claim``: makes the claim ``UPDATE`` of a plain row claimed as read (a new copy of
        ``claim_writes.CLAIM_GUARDED``'s statement); ``prepare(row, record)``: ``Claims.prepare``
        of a candidate (its ``UPDATE`` parameters, event and, with ``record``, its claimed record);
        ``may_be_empty``: the window held every due row, so no free candidate means nothing to
        claim; ``done``: told the position of the candidate claimed (``None``: none) once the
        statement ran. Every candidate must be a plain waiting row whose claim adds one to its
        attempt and fence and whose event data is :func:`claim_data_json`'s, and no claim event
        may be logged or counted (the call's state changes are collected before its writes are
        sent).
        """
        if not 0 < len(candidates) <= MAX_CANDIDATES or records_event(CLAIMED):
            return None
        prepared = [prepare(row, False) for row in candidates]
        first_update, first_event, _ = prepared[0]
        encoded: set[str] = set()  # statuses whose event data the statement's text was checked for
        for row, (update, event, _record) in zip(candidates, prepared, strict=True):
            data = {"attempt": row.attempt + 1, "previousOwner": None, "previousStatus": row.status}
            if not (
                plain(row)
                and row.status in _WAITING
                and update["p_fence"] == row.fence
                and update["p_next_fence"] == event["fence"] == row.fence + 1
                and update["p_attempt"] == row.attempt + 1
                and all(update[name] == first_update[name] for name in _CLAIM_BINDS)
                and event["type"] == CLAIMED
                and event["owner_id"] == first_event["owner_id"]
                and event["job_id"] == row.job_id
                and event["data"] == data
            ):
                return None
            if row.status not in encoded:  # the attempt, below 33 (the CHECK), is its digits
                if event_data_json(data) != claim_data_json(row.attempt + 1, row.status):
                    return None
                encoded.add(row.status)
        shared = {renamed: first_update[name] for name, renamed in _CLAIM_BINDS.items()}
        shared["claim_event_type"] = CLAIMED
        shared["claim_event_occurred_at"] = now
        shared["claim_event_owner_id"] = first_event["owner_id"]
        return cls(claim, candidates, prepare, shared, may_be_empty=may_be_empty, done=done)

    def writes(
        self,
        kept: Sequence[tuple[Prepared, dict[str, Any]]],
        expected: Sequence[int],
        other_events: Sequence[dict[str, Any]],
    ) -> tuple[Prepared, dict[str, Any]]:
        """The writes statement and its parameters: the ``kept`` writes (each expected to write
        ``expected`` rows), the claim of the first free candidate, and the events,
        ``other_events`` first."""
        with STATEMENTS_LOCK:  # module-level statements are shared by every thread
            statement = _statement(
                self.claim, tuple(part for part, _ in kept), len(other_events), len(self.candidates)
            )
        parameters = combined_parameters(kept, expected)
        for index, row in enumerate(self.candidates):
            parameters[f"c{index}_id"] = row.occurrence_id
            parameters[f"c{index}_version"] = version(row)
        parameters.update(self.shared)
        for index, event in enumerate(other_events):
            for name in EVENT_COLUMNS:
                parameters[f"ev{index}_{name}"] = event[name]
        parameters["may_be_empty"] = 1 if self.may_be_empty else 0
        return statement, parameters

    @property
    def missed(self) -> type[RestartTransaction]:
        """The call runs again without leaving its claim to the writes statement."""
        return RestartTransaction

    @property
    def lead(self) -> None:
        """Nothing runs before the writes statement."""
        return None

    settles: Final = False
    """The statement claims; the call's settlement (if any) was sent before it."""

    def completed(self, result: SettledAndClaimed) -> SettledAndClaimed:
        """The ``settle_and_claim`` result with the record the statement claimed."""
        return replace(result, claimed=self.picked)

    def resolve(self, row: Any) -> None:
        """Record the candidate the statement claimed (its result ``row``'s ``picked``; ``None``:
        none was free): :attr:`picked`, its claimed record, and :attr:`events`, its claim event."""
        picked_id = row.picked
        position = None
        if picked_id is not None:
            position = [candidate.occurrence_id for candidate in self.candidates].index(picked_id)
            candidate = self.candidates[position]
            self.picked = self._prepare(candidate, True)[2]
            self.events = [
                {
                    "job_id": candidate.job_id,
                    "occurrence_id": candidate.occurrence_id,
                    "event_type": CLAIMED,
                    "occurred_at": self.shared["claim_event_occurred_at"],
                    "owner_id": self.shared["claim_event_owner_id"],
                    "fence": candidate.fence + 1,
                    "data_json": claim_data_json(candidate.attempt + 1, candidate.status),
                }
            ]
        self._done(position)


@functools.cache
def _statement(
    claim: Callable[[], Any], kept: tuple[Prepared, ...], other_events: int, candidates: int
) -> Prepared:
    counts = part_counts(kept)
    ids = [bindparam(f"c{index}_id", type_=_o.c.occurrence_id.type) for index in range(candidates)]
    versions = [bindparam(f"c{index}_version", type_=String()) for index in range(candidates)]
    pick = (
        select(_o.c.occurrence_id, _o.c.fence, _o.c.status)
        .where(_o.c.occurrence_id.in_(ids), version_sql(_o).in_(versions))
        .order_by(case({key: position for position, key in enumerate(ids)}, value=_o.c.occurrence_id))
        .limit(1)
        .with_for_update(skip_locked=True, of=_o)
        .cte("pick")
        .prefix_with("MATERIALIZED")
    )
    claimed = _claim(claim(), pick, versions).cte("claim")
    rows: list[Any] = [
        select(*[bindparam(f"ev{row}_{name}", type_=t.events.c[name].type) for name in EVENT_COLUMNS])
        for row in range(other_events)
    ]
    rows.append(
        select(
            claimed.c.job_id,
            claimed.c.occurrence_id,
            bindparam("claim_event_type", type_=t.events.c.event_type.type),
            bindparam("claim_event_occurred_at", type_=t.events.c.occurred_at.type),
            bindparam("claim_event_owner_id", type_=t.events.c.owner_id.type),
            claimed.c.fence,
            claim_data_sql(claimed),
        )
    )
    source: Any = rows[0] if len(rows) == 1 else union_all(*rows)
    written = (
        insert(t.events).from_select(list(EVENT_COLUMNS), source).returning(literal_column("1")).cte("ev")
    )
    picked_count = select(func.count()).select_from(pick).scalar_subquery()
    claimed_count = select(func.count()).select_from(claimed).scalar_subquery()
    nothing_free = and_(picked_count == 0, bindparam("may_be_empty", type_=Integer()) == 1)
    return Prepared(
        select(
            *[count.label(part_name(index)) for index, count in enumerate(counts)],
            select(claimed.c.occurrence_id).scalar_subquery().label("picked"),
            select(func.count()).select_from(written).scalar_subquery().label("events"),
            count_check(counts, or_(claimed_count == 1, nothing_free)),
        ),
        locks=True,
    )


def _claim(statement: Any, pick: Any, versions: Sequence[Any]) -> Any:
    """``statement`` (the claim ``UPDATE``) of the picked row: one more attempt and fence than
    the row has, its fence the one picked, and the row as written one of the candidates'
    versions as read; returning what the claim event needs."""
    replacements = {
        "p_id": pick.c.occurrence_id,
        "p_fence": pick.c.fence,
        "p_attempt": _o.c.attempt + 1,
        "p_next_fence": _o.c.fence + 1,
    }

    def replace(element: BindParameter[Any]) -> Any:
        if element.key in replacements:
            return replacements[element.key]
        if element.key in _CLAIM_BINDS:
            return bindparam(_CLAIM_BINDS[element.key], type_=element.type)
        return None

    return (
        replace_binds(statement, replace)
        .where(version_sql(_o).in_(versions))
        .returning(
            _o.c.occurrence_id, _o.c.job_id, _o.c.fence, _o.c.attempt, pick.c.status.label("previous_status")
        )
    )
