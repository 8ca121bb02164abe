"""A ``settle`` that succeeds, in one statement (PostgreSQL).

A settle was two round trips: the row locked and read with its control, reservation and
adjudication (and the clock, with the ``BEGIN``), then the guarded settle ``UPDATE`` and its event
with the ``COMMIT``. When the settlement succeeds, holds its lease and has no control,
reservation or adjudication row, what Python decides is fixed by the row: it becomes
``succeeded`` (``settlement._next_state``) and its event's data is
``cycle_statement.settled_data_json``'s. So one statement, sent with the ``BEGIN`` and ``COMMIT``
in one round trip after a lead statement in the same query that locks the row
(:attr:`PendingSettle.lead`, as the ``cycle`` statement's), does it: ``settle`` of
``queries.sql``, the settlement half of ``cycle``. Locked first, the row and the rows its
writers add under its lock no longer change, and the statement reads them (and the clock) on a
snapshot taken after the lock (:mod:`.cycle_statement` tells why that matters).

The check (its column ``checked``) fails the statement, and the ``COMMIT`` with it, unless the row
was settled; the call then runs again the usual way (``WholeCycleMissed``), which decides every
other case — a lost lease, a control, reservation or adjudication row — and reports its error
exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from scheduler.backends.postgresql import queries
from scheduler.backends.postgresql.cycle_statement import SETTLED, event_row, settled_data_json
from scheduler.schema import tables as t
from scheduler.store.capabilities.authority import LOCK_OCCURRENCE
from scheduler.store.capabilities.occurrence_rows import occurrence_record
from scheduler.store.capabilities.settle_request import SettleRequest
from scheduler.store.plumbing.restart import RestartTransaction, WholeCycleMissed
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.telemetry import records_event
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Occurrence


class PendingSettle:
    """A successful ``settle`` left whole to the call's writes statement (``Tx.pick_later``);
    :attr:`result` once it ran."""

    __slots__ = ("_request", "_tx", "events", "result")

    settles: Final = True

    def __init__(self, tx: Tx, request: SettleRequest) -> None:
        self._tx = tx
        self._request = request
        self.events: list[dict[str, Any]] = []
        self.result: Occurrence | None = None

    @property
    def missed(self) -> type[RestartTransaction]:
        """The call runs again, still one the store may run again, the usual way (``session``)."""
        return WholeCycleMissed

    @property
    def lead(self) -> tuple[Prepared, dict[str, Any]]:
        """The row locked first (``authority.LOCK_OCCURRENCE``, as every writer of its control,
        reservation and adjudication rows locks it)."""
        return LOCK_OCCURRENCE, {"occurrence_id": self._request.occurrence_id}

    def completed(self, _unsent: object) -> Occurrence | None:
        return self.result

    def writes(
        self,
        kept: Sequence[tuple[Prepared, dict[str, Any]]],
        expected: Sequence[int],
        other_events: Sequence[dict[str, Any]],
    ) -> tuple[Prepared, dict[str, Any]]:
        """The settlement's statement and parameters (the call wrote and kept nothing else); with
        the server clock (``Tx.clock_unread``) ``now`` is NULL and the statement reads the clock,
        after the lead's lock."""
        assert not kept and not expected and not other_events
        tx, request = self._tx, self._request
        parameters = {
            "now": None if tx.clock_unread else tx.now,
            "p_id": request.occurrence_id,
            "p_owner": request.owner_id,
            "p_fence": request.fence,
            "p_result": request.result_json,
        }
        return queries.SETTLE, parameters

    def resolve(self, row: Any) -> None:
        """Take the statement's row: the call's clock, the settled record and its event."""
        tx = self._tx
        if tx.clock_unread:
            tx.adopt_clock(row.server_now)
        settled = {name: getattr(row, "s_" + name) for name in t.OCCURRENCE_COLUMNS}
        data = settled_data_json(settled["attempt"], settled["max_attempts"])
        self.events = [event_row(settled, SETTLED, tx.now, self._request.owner_id, data)]
        self.result = occurrence_record(settled)


def settle_in_one_statement(tx: Tx, request: SettleRequest) -> PendingSettle | None:
    """Leave a ``settle`` to one statement where it may be (see the module), returning the pending
    settlement, else ``None``: a failure, a success with an adjudication request, or where the
    settlement event is logged or counted (the call's state changes are collected before its
    writes are sent). The backend asks only in a call whose writes may carry it and that was not
    run again after the statement missed (``CallMode.as_one_statement``)."""
    if not (request.succeeded and request.adjudication_request_id is None and not records_event(SETTLED)):
        return None
    pending = PendingSettle(tx, request)
    tx.pick_later(pending)
    return pending
