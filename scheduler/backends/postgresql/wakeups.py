"""Wake-ups for idle workers on PostgreSQL: ``NOTIFY`` from transactions the store owns (API §9).

A write transaction the store owns (a method call on a store from ``open_store``, or a whole
``store.transaction()`` block) that made an occurrence claimable — enqueued, requeued, resumed,
retried, reopened by an adjudication — sends one ``pg_notify`` on the store's wake channel before
it commits; PostgreSQL delivers it only if the transaction commits. Idle workers ``LISTEN`` on the
channel (:class:`scheduler.worker.ListenWaker`) and claim at once instead of at their next poll.

Never from a caller's transaction (``SchedulerStore.on_connection``): at COMMIT a transaction
that notified takes a database-wide lock on the notification queue, which would serialize every
committing application transaction that enqueued. An outbox enqueue therefore relies on the
workers' polling (capped backoff, 2 s by default), or on an explicit
:meth:`NotifyOperations.notify_workers` after the caller's COMMIT.

Settlements (opt-in, for the Tasks layer's result waiters): a store whose ``notify_settled`` is on
sends one ``pg_notify`` on the settle channel (:func:`settle_channel`) from an owned transaction
that ended an occurrence (succeeded or dead-lettered) and made no work claimable; one that did
both notifies the work channel only, which result waiters listen on too. So a transaction sends at
most one notification, and the kernel's own stores (``notify_settled`` off) send none for a
settlement: a NOTIFY serializes the commits of every transaction that sends one.

SQLite has no ``NOTIFY``: nothing is sent there and workers poll.
"""

from __future__ import annotations

import hashlib
from typing import Final

from sqlalchemy import Connection, text

from scheduler.store.plumbing.wake_events import SETTLE_EVENTS, WAKE_EVENTS, settles_runs, wakes_workers

CHANNEL_PREFIX: Final = "scheduler_work."
SETTLE_CHANNEL_PREFIX: Final = "scheduler_done."
_MAX_CHANNEL_BYTES: Final = 63  # PostgreSQL identifiers (NAMEDATALEN - 1)
_NOTIFY: Final = text("SELECT pg_notify(:channel, '')")


def wake_channel(schema: str, prefix: str = CHANNEL_PREFIX) -> str:
    """The ``LISTEN``/``NOTIFY`` channel of the scheduler schema ``schema``:
    ``scheduler_work.<schema>``, or ``scheduler_work.#<first 24 hex of sha256(schema)>`` when that
    would exceed PostgreSQL's 63-byte identifier limit (``prefix``: another channel's)."""
    channel = prefix + schema
    if len(channel.encode()) <= _MAX_CHANNEL_BYTES:
        return channel
    return prefix + "#" + hashlib.sha256(schema.encode()).hexdigest()[:24]


def settle_channel(schema: str) -> str:
    """The channel settlements of the schema ``schema`` notify: ``scheduler_done.<schema>``."""
    return wake_channel(schema, SETTLE_CHANNEL_PREFIX)


def send_wakeup(conn: Connection, channel: str) -> None:
    """Queue one notification on ``channel`` in ``conn``'s transaction (delivered at COMMIT)."""
    conn.execute(_NOTIFY, {"channel": channel})


__all__ = [
    "CHANNEL_PREFIX",
    "SETTLE_CHANNEL_PREFIX",
    "SETTLE_EVENTS",
    "WAKE_EVENTS",
    "send_wakeup",
    "settle_channel",
    "settles_runs",
    "wake_channel",
    "wakes_workers",
]
