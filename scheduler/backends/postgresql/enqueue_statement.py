"""An ``enqueue_occurrence`` of a new identity in one statement (PostgreSQL).

The usual way sends the advisory lock on the identity's key, the job's read, the clock's read,
the occurrence's ``INSERT``, its event's ``INSERT`` and the wake channel's ``pg_notify`` as
statements of their own, each a round trip, between ``BEGIN`` and ``COMMIT``. When the job
exists and is enabled and no row holds the identity, what Python decides is fixed by the job's
row: the identity is derived from its revision, the row takes its ``max_attempts``, its authority
and (unless the caller gave one) its payload, re-encoded as canonical JSON, and the event's data
is ``{"jobRevision":…,"scheduledFor":…,"triggerKey":…}``. So the statement ``enqueue`` of
``queries.sql`` does all of it, sent with the transaction's ``BEGIN`` and ``COMMIT`` in one round
trip after a lead statement in the same query, ``enqueue_lock``, that takes the lock the usual
way takes (:attr:`PendingEnqueue.lead`): the statement's snapshot, taken after the lock, then sees
every committed enqueue of the same identity, as the usual way's reads do.

What the statement cannot do is read the job's stored JSON as Python reads it (``map_job``
validates it; the stored texts are re-encoded, and a text that is not canonical would be written
re-encoded). So the statement writes only when the job's stored authority, payload and trigger
texts are ones Python verified — valid, and the authority and payload canonical, so that
re-encoding gives them back — compared by their digest (:func:`texts_digest`), which this module
remembers per schema and job (:data:`_VERIFIED`). A job not verified yet, or whose texts changed,
has its texts returned by the statement (nothing written), verified here, and the call runs again
the usual way; the next enqueue of that job is one statement.

The check (its column ``checked``, as ``write_batch.count_check``'s) fails the statement, and the
``COMMIT`` with it, unless the occurrence, its event and the notification were written (or the job
had its texts returned): the call then runs again the usual way (``WholeCycleMissed``), which
decides every other case — a missing or disabled job, an identity already stored (its payload
compared), a revision the identity refuses — and reports its result or error exactly as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

from scheduler.backends.interface import EnqueueCall
from scheduler.backends.postgresql import queries
from scheduler.backends.postgresql.backend import key_space
from scheduler.backends.postgresql.wakeups import wake_channel
from scheduler.contract.canonical import canonical_json, normalize_and_encode_json
from scheduler.contract.identity import identity_digest_parts
from scheduler.contract.scalars import MISSING
from scheduler.schema import tables as t
from scheduler.store.capabilities.occurrence_rows import event_data_json, occurrence_record
from scheduler.store.plumbing.restart import RestartTransaction, WholeCycleMissed
from scheduler.store.plumbing.rows import read_stored_authority, read_stored_json
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.telemetry import records_event
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import Occurrence

ENQUEUED: Final = "occurrence_enqueued"
_REVISION_HEAD: Final = '{"jobRevision":0'
_MAX_VERIFIED: Final = 8192
"""Jobs remembered (all forgotten at once when full): a job forgotten costs its next enqueue one
round trip more than the usual way, which verifies it again."""
_VERIFIED: dict[tuple[str, str], str | None] = {}
"""(schema, job id) -> the digest of the job's texts as last verified, or ``None``: they were
not taken as stored (no statement is tried for the job while this entry is kept)."""


def texts_digest(authority_json: str, payload_json: str, trigger_json: str) -> str:
    """The sha256 of a job's three texts as the statement computes it (UTF-8, NUL-separated: a
    PostgreSQL text holds no NUL)."""
    joined = b"\0".join(text.encode("utf-8") for text in (authority_json, payload_json, trigger_json))
    return hashlib.sha256(joined).hexdigest()


def verified_digest(authority_json: str, payload_json: str, trigger_json: str) -> str | None:
    """:func:`texts_digest` of a job's stored texts if the usual way reads them without an error
    and writes its authority and payload as stored (canonical JSON), else ``None``."""
    try:
        read_stored_json(trigger_json, "job trigger")
        payload = read_stored_json(payload_json, "job payload")
        authority = read_stored_authority(authority_json, "job authority")
        if (
            canonical_json(payload, "occurrence.payload") != payload_json
            or canonical_json(authority, "occurrence.authority") != authority_json
        ):
            return None
    except Exception:  # whatever the usual way raises, it raises it itself
        return None
    return texts_digest(authority_json, payload_json, trigger_json)


def _remember(key: tuple[str, str], digest: str | None) -> None:
    if len(_VERIFIED) >= _MAX_VERIFIED:
        _VERIFIED.clear()
    _VERIFIED[key] = digest


def _schema(tx: Tx) -> str | None:
    """The store's schema (the map every statement of the store runs with)."""
    mapping = (tx.options or {}).get("schema_translate_map")
    schema = None if mapping is None else mapping.get(None)
    return schema if isinstance(schema, str) else None


class PendingEnqueue:
    """A whole ``enqueue_occurrence`` left to the call's writes statement (``Tx.pick_later``);
    :attr:`result` once it ran."""

    __slots__ = ("_key", "_lock", "_payload_json", "_request", "_tx", "events", "result")

    def __init__(
        self,
        tx: Tx,
        request: EnqueueCall,
        payload_json: str | None,
        schema: str,
        lock: tuple[str, str],
    ) -> None:
        self._tx = tx
        self._request = request
        self._payload_json = payload_json
        self._key = (schema, request.job_id)
        self._lock = (key_space(schema, lock[0]), lock[1])
        self.events: list[dict[str, Any]] = []
        self.result: Occurrence | None = None

    @property
    def missed(self) -> type[RestartTransaction]:
        """The call runs again, still one the store may run again, the usual way (``session``)."""
        return WholeCycleMissed

    settles: Final = False
    """An enqueue ends no occurrence."""

    def completed(self, _unsent: object) -> Occurrence | None:
        """The call's result is the statement's (:attr:`result`)."""
        return self.result

    @property
    def lead(self) -> tuple[Prepared, dict[str, Any]]:
        """The identity's advisory lock, as the usual way takes it (``Tx.lock_keys``; see the
        module)."""
        space, key = self._lock
        return queries.ENQUEUE_LOCK, {"space": space, "lock_key": key}

    def writes(
        self,
        kept: Sequence[tuple[Prepared, dict[str, Any]]],
        expected: Sequence[int],
        other_events: Sequence[dict[str, Any]],
    ) -> tuple[Prepared, dict[str, Any]]:
        """The enqueue's statement and parameters (the call wrote and kept nothing else)."""
        assert not kept and not expected and not other_events
        tx, request = self._tx, self._request
        head, tail = identity_digest_parts(request.job_id, request.scheduled_for, request.trigger_key)
        data = event_data_json(_event_data(0, request))
        assert data.startswith(_REVISION_HEAD)
        parameters = {
            "job_id": request.job_id,
            "trigger_key": request.trigger_key,
            "scheduled_for": request.scheduled_for,
            "available_at": request.available_at,
            "payload_json": self._payload_json,
            "now": None if tx.clock_unread else tx.now,
            "job_texts": _VERIFIED.get(self._key),
            "identity_head": head.hex(),
            "identity_tail": tail.hex(),
            "event_tail": data[len(_REVISION_HEAD) :],
            "channel": wake_channel(self._key[0]),
        }
        return queries.ENQUEUE, parameters

    def resolve(self, row: Any) -> None:
        """Take the statement's row: the call's clock, the occurrence and its event; a job whose
        texts came back instead is verified, and the call runs again the usual way."""
        if row.occurrence_id is None:
            _remember(
                self._key, verified_digest(row.job_authority_json, row.job_payload_json, row.job_trigger_json)
            )
            raise self.missed
        tx = self._tx
        if tx.clock_unread:
            tx.adopt_clock(row.server_now)
        values = {name: getattr(row, name) for name in t.OCCURRENCE_COLUMNS}
        self.events = [
            {
                "job_id": values["job_id"],
                "occurrence_id": values["occurrence_id"],
                "event_type": ENQUEUED,
                "occurred_at": values["created_at"],
                "owner_id": None,
                "fence": None,
                "data_json": event_data_json(_event_data(values["job_revision"], self._request)),
            }
        ]
        self.result = occurrence_record(values, deduplicated=False)


def _event_data(revision: int, request: EnqueueCall) -> dict[str, Any]:
    """The ``occurrence_enqueued`` event's data (``occurrences._enqueued``)."""
    return {"jobRevision": revision, "scheduledFor": request.scheduled_for, "triggerKey": request.trigger_key}


def enqueue_in_one_statement(tx: Tx, request: EnqueueCall, lock: tuple[str, str]) -> PendingEnqueue | None:
    """Leave the whole call to one statement where it may be (see the module), returning the
    pending enqueue (the call's result is its :attr:`~PendingEnqueue.result` once the writes were
    sent), else ``None``: where the enqueued event is logged or counted (the call's state changes
    are collected before its writes are sent), where the caller's payload is not valid JSON (the
    usual way reports a missing or disabled job first), and for a job whose texts were found not
    to be taken as stored. The backend asks only in a call whose writes may carry it and that was
    not run again after the statement missed (``CallMode.as_one_statement``)."""
    schema = _schema(tx)
    if schema is None or tx.pick is not None or records_event(ENQUEUED):
        return None
    if _VERIFIED.get((schema, request.job_id), "") is None:
        return None
    payload_json: str | None = None
    if request.payload is not MISSING:
        try:
            payload_json = normalize_and_encode_json(request.payload, "occurrence.payload")[1]
        except Exception:  # the usual way raises it, after the job's own errors
            return None
    pending = PendingEnqueue(tx, request, payload_json, schema, lock)
    tx.pick_later(pending)
    return pending
