"""A quiet ``claim_next`` in one statement (PostgreSQL).

A quiet claim was three round trips: the clock read (with the transaction's ``BEGIN``), the head
probe that locks a plain head (``claim_head``), and the claim's writes with the ``COMMIT``. When
no expired lease is to be acted on and the earliest head is a plain waiting row
(``claim_plan.plain``) that no other transaction holds, what Python decides is fixed by the row:
it is claimed with one more attempt and fence (``Claims.prepare``), its event's data
``cycle_statement.claim_data_json``'s. So one statement, sent with the ``BEGIN`` and ``COMMIT`` in
one round trip, does it all: ``claim`` of ``queries.sql``, the claim half of the ``cycle``
statement (:mod:`.cycle_statement`), reading the clock first. No lead statement: nothing is
locked before the heads are read, and a control or requeue row can only be added to a row that
is running or a dead letter, a change of the head its version check sees.

Among workers that hold the first candidates (``ClaimContention`` not quiet) the statement claims
from the window of heads instead (``claim_window``, the claim half of ``cycle_window``): the first
free candidate in the seed's order, up to the first row that is not plain and no further than the
last row of an arm that may hold unread rows.

The check (its column ``checked``) fails the statement, and the ``COMMIT`` with it, unless a row
was claimed or nothing is due, and the lease expiry is representable; the call then runs again the
usual way (``WholeCycleMissed``), which decides every other case — an expired lease to sweep or
reclaim, a head another worker holds or that is not plain, no free candidate in the window, an
unrepresentable lease expiry — and reports its error exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from scheduler.backends.postgresql import queries
from scheduler.backends.postgresql.claim_locks import ClaimContention
from scheduler.backends.postgresql.cycle_statement import CLAIMED, claim_data_json, event_row
from scheduler.schema import tables as t
from scheduler.store.capabilities.claim_eligibility import ClaimFilter
from scheduler.store.capabilities.occurrence_rows import occurrence_record
from scheduler.store.plumbing.restart import RestartTransaction, WholeCycleMissed
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.telemetry import records_event
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Occurrence


class PendingClaim:
    """A quiet ``claim_next`` left whole to the call's writes statement (``Tx.pick_later``);
    :attr:`result` once it ran (``claim_in``'s list: the claimed occurrence, or none)."""

    __slots__ = ("_contention", "_filter", "_lease_ms", "_owner", "_tx", "events", "result")

    settles: Final = False
    lead: Final = None
    """Nothing to lock first (see the module)."""

    def __init__(
        self, tx: Tx, owner: str, lease_ms: int, claim_filter: ClaimFilter, contention: ClaimContention
    ) -> None:
        self._tx = tx
        self._owner = owner
        self._lease_ms = lease_ms
        self._filter = claim_filter
        self._contention = contention
        self.events: list[dict[str, Any]] = []
        self.result: list[Occurrence] = []

    @property
    def missed(self) -> type[RestartTransaction]:
        """The call runs again, still one the store may run again, the usual way (``session``)."""
        return WholeCycleMissed

    def completed(self, _unsent: object) -> list[Occurrence]:
        return self.result

    def writes(
        self,
        kept: Sequence[tuple[Prepared, dict[str, Any]]],
        expected: Sequence[int],
        other_events: Sequence[dict[str, Any]],
    ) -> tuple[Prepared, dict[str, Any]]:
        """The claim's statement and parameters (the call wrote and kept nothing else); with the
        server clock (``Tx.clock_unread``) ``now`` is NULL and the statement reads the clock."""
        assert not kept and not expected and not other_events
        tx = self._tx
        parameters = queries.filter_parameters(self._filter.kinds, self._filter.workspace_id)
        parameters["now"] = None if tx.clock_unread else tx.now
        parameters["p_owner"] = self._owner
        parameters["p_lease"] = self._lease_ms
        window = not self._contention.probe_first
        return (queries.CLAIM_WINDOW if window else queries.CLAIM), parameters

    def resolve(self, row: Any) -> None:
        """Take the statement's row: the call's clock, the claimed record and its event."""
        tx = self._tx
        if tx.clock_unread:
            tx.adopt_clock(row.server_now)
        if row.c_occurrence_id is None:
            return  # nothing was due
        values = {name: getattr(row, "c_" + name) for name in t.OCCURRENCE_COLUMNS}
        claim_data = claim_data_json(values["attempt"], row.c_previous_status)
        self.events.append(event_row(values, CLAIMED, tx.now, self._owner, claim_data))
        self.result = [occurrence_record(values)]
        self._contention.took_first(row.c_position == 1)


def claim_in_one_statement(
    tx: Tx, owner: str, lease_ms: int, claim_filter: ClaimFilter, contention: ClaimContention | None
) -> PendingClaim | None:
    """Leave a ``claim_next`` to one statement where it may be (see the module), returning the
    pending claim, else ``None``: where the claim event is logged or counted (the call's state
    changes are collected before its writes are sent). The backend asks only in a call whose
    writes may carry it and that was not run again after the statement missed
    (``CallMode.as_one_statement``)."""
    if contention is None or records_event(CLAIMED):
        return None
    pending = PendingClaim(tx, owner, lease_ms, claim_filter, contention)
    tx.pick_later(pending)
    return pending
