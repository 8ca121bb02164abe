"""A ``settle_and_claim`` that succeeds, in one statement (PostgreSQL).

A quiet cycle was two round trips: the first statement (``cycle_read``) locked the settled row,
read the clock and the queue's heads and locked a plain head; Python decided the settlement and
the claim on those rows; the second statement wrote them with the ``COMMIT``. When the
settlement succeeds, holds its lease and has no control, reservation or adjudication row, and
the head is a plain waiting row (``claim_plan.plain``) locked as probed, what Python decides is
fixed by the rows: the settled row becomes ``succeeded`` (``settlement._next_state``), the head
is claimed with one more attempt and fence (``Claims.prepare``), and the two events' data are
``{"attempt":…,"maxAttempts":…}`` and ``claim_data_json``'s. So one statement, sent with the
transaction's ``BEGIN`` and ``COMMIT`` in one round trip, does all of it, after a lead statement
in the same query that locks the settled row (:attr:`PendingCycle.lead`): the statements
``cycle`` and ``cycle_window`` of ``queries.sql``. Each writes what ``settlement``'s guarded
settle ``UPDATE`` and ``claim_writes``' guarded claim ``UPDATE`` write for these rows
(``tests/backends/postgresql/test_postgresql_cycle_statement.py`` compares every table with the
two-statement cycle's).

Why the lead lock: the statement reads the settled row's control, reservation and adjudication
on its snapshot, taken when it starts. Their writers lock the occurrence row first, then write
those rows; one that committed after that snapshot but before the statement's own lock (no wait,
or a short one) would be invisible to it, and its pause request would be left on a settled
occurrence. (The two-statement cycle checks them again in its writes statement, on a newer
snapshot.) Locked by the statement before, the row can no longer change, and the cycle's
statement reads them on a snapshot taken after that lock. The head needs no such lead: a control
or requeue row can only be added to a row that is running or a dead letter, a change of the head
its version check sees.

Among workers that hold the first candidates (``ClaimContention`` not quiet) the statement reads the
window of heads instead of the head (:func:`_window_and_lock`): the candidates
``claim_plan.window_plan`` yields, in the seed's order, up to the first row that is not plain and no
further than the last row of an arm that may hold unread rows; the first one free is locked ``SKIP
LOCKED`` at its version as read. A row passed over because its version changed stays locked until
the ``COMMIT`` in the same round trip. The claimed row's place (``c_position``) tells
``ClaimContention`` whether the first candidate was free.

The check (its column ``checked``, as ``write_batch.count_check``'s) fails the statement, and the
``COMMIT`` with it, unless the settlement wrote its row and either the head was claimed or nothing
is due; the call then runs again the usual way (``RestartTransaction``), which decides every other
case — a lost lease, an expired lease to sweep or reclaim, a head another worker holds or that is
not plain (quiet), no free candidate before the window's first row that is not plain or past its
known order (among workers), an unrepresentable lease expiry — and reports its error exactly as
before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from scheduler.backends.postgresql import queries
from scheduler.backends.postgresql.claim_locks import ClaimContention
from scheduler.backends.postgresql.cycle_read import cycle_parameters
from scheduler.schema import tables as t
from scheduler.store.capabilities.authority import LOCK_OCCURRENCE
from scheduler.store.capabilities.claim_eligibility import ClaimFilter
from scheduler.store.capabilities.occurrence_rows import occurrence_record
from scheduler.store.capabilities.settle_request import SettleRequest
from scheduler.store.plumbing.restart import RestartTransaction, WholeCycleMissed
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.telemetry import records_event
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Occurrence, SettledAndClaimed

SETTLED: Final = "occurrence_succeeded"
CLAIMED: Final = "occurrence_claimed"


def settled_data_json(attempt: int, max_attempts: int) -> str:
    """The settlement event's data of a row with no reservation, succeeded
    (``settlement.settlement_event_data``; ``queries.sql`` writes the same text)."""
    return f'{{"attempt":{attempt},"maxAttempts":{max_attempts}}}'


def claim_data_json(attempt: int, previous_status: str) -> str:
    """The claim event's data of a plain waiting row (``claim_writes``' event data for a row with
    no previous owner; ``queries.sql`` writes the same text)."""
    return f'{{"attempt":{attempt},"previousOwner":null,"previousStatus":"{previous_status}"}}'


class PendingCycle:
    """A successful ``settle_and_claim`` left whole to the call's writes statement
    (``Tx.pick_later``); :attr:`result` once it ran."""

    __slots__ = (
        "_contention",
        "_filter",
        "_lease_ms",
        "_request",
        "_tx",
        "events",
        "position",
        "result",
    )

    def __init__(
        self,
        tx: Tx,
        request: SettleRequest,
        lease_ms: int,
        claim_filter: ClaimFilter,
        contention: ClaimContention,
    ) -> None:
        self._tx = tx
        self._request = request
        self._lease_ms = lease_ms
        self._filter = claim_filter
        self._contention = contention
        self.events: list[dict[str, Any]] = []
        self.result: SettledAndClaimed | None = None
        self.position: int | None = None
        """The claimed row's place among the candidates in the seed's order (1: the first)."""

    @property
    def missed(self) -> type[RestartTransaction]:
        """The call runs again, still one the store may run again, the usual way (``session``)."""
        return WholeCycleMissed

    settles: Final = True
    """The statement settles the call's occurrence (its events are known once it ran)."""

    def completed(self, _unsent: object) -> SettledAndClaimed | None:
        """The call's result is the statement's (:attr:`result`)."""
        return self.result

    @property
    def lead(self) -> tuple[Prepared, dict[str, Any]]:
        """The settled row locked first (``authority.LOCK_OCCURRENCE``, as every writer of its
        control, reservation and adjudication rows locks it): the cycle's statement then reads
        those rows on a snapshot taken after the lock (see the module)."""
        return LOCK_OCCURRENCE, {"occurrence_id": self._request.occurrence_id}

    def writes(
        self,
        kept: Sequence[tuple[Prepared, dict[str, Any]]],
        expected: Sequence[int],
        other_events: Sequence[dict[str, Any]],
    ) -> tuple[Prepared, dict[str, Any]]:
        """The cycle's statement and parameters (the call wrote and kept nothing else)."""
        assert not kept and not expected and not other_events
        request = self._request
        parameters = cycle_parameters(
            self._tx, request.occurrence_id, request.owner_id, request.fence, self._filter
        )
        parameters["p_result"] = request.result_json
        parameters["p_lease"] = self._lease_ms
        window = not self._contention.probe_first
        return (queries.CYCLE_WINDOW if window else queries.CYCLE), parameters

    def resolve(self, row: Any) -> None:
        """Take the statement's row: the call's clock, both records and both events."""
        tx, owner = self._tx, self._request.owner_id
        if tx.clock_unread:
            tx.adopt_clock(row.server_now)
        now = tx.now
        settled = {name: getattr(row, "s_" + name) for name in t.OCCURRENCE_COLUMNS}
        self.events = [
            event_row(
                settled, SETTLED, now, owner, settled_data_json(settled["attempt"], settled["max_attempts"])
            )
        ]
        claimed: Occurrence | None = None
        if row.c_occurrence_id is not None:
            values = {name: getattr(row, "c_" + name) for name in t.OCCURRENCE_COLUMNS}
            claimed = occurrence_record(values)
            claim_data = claim_data_json(values["attempt"], row.c_previous_status)
            self.events.append(event_row(values, CLAIMED, now, owner, claim_data))
            self.position = row.c_position
            self._contention.took_first(self.position == 1)
        self.result = SettledAndClaimed(settled=occurrence_record(settled), claimed=claimed)


def event_row(row: dict[str, Any], event_type: str, now: int, owner: str, data_json: str) -> dict[str, Any]:
    """The ``events`` row a one-statement call wrote for the occurrence ``row`` (as returned)."""
    return {
        "job_id": row["job_id"],
        "occurrence_id": row["occurrence_id"],
        "event_type": event_type,
        "occurred_at": now,
        "owner_id": owner,
        "fence": row["fence"],
        "data_json": data_json,
    }


def cycle_in_one_statement(
    tx: Tx,
    request: SettleRequest,
    lease_ms: int,
    claim_filter: ClaimFilter,
    contention: ClaimContention | None,
) -> PendingCycle | None:
    """Leave the whole call to one statement where it may be (see the module), returning the
    pending cycle (the call's result is its :attr:`~PendingCycle.result` once the writes were
    sent), else ``None``: a success without an adjudication request, where no settlement or claim
    event is logged or counted (the call's state changes are collected before its writes are
    sent). The backend asks only in a call whose writes may carry the cycle
    (``claim_tactics.picks_in_writes``) and that was not run again after the statement missed
    (``CallMode.as_one_statement``). Quiet, the statement claims
    the head (``cycle``); among workers, from the window of heads (``cycle_window``)."""
    if not (
        contention is not None
        and request.succeeded
        and request.adjudication_request_id is None
        and not records_event(SETTLED)
        and not records_event(CLAIMED)
    ):
        return None
    pending = PendingCycle(tx, request, lease_ms, claim_filter, contention)
    tx.pick_later(pending)
    return pending
