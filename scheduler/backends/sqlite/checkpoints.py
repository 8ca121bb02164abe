"""Keeping the SQLite write-ahead log (``-wal``) in bounds while a store runs.

SQLite checkpoints the WAL into the database every 1000 pages, but a checkpoint cannot copy
frames newer than the snapshot of the oldest open read transaction, so a long reader lets the
WAL grow without bound; and SQLite never shrinks the file by itself. The policy:

1. ``PRAGMA journal_size_limit`` (:data:`WAL_SIZE_LIMIT_BYTES`, set at open): whenever the WAL
   restarts after a complete checkpoint, SQLite truncates the file to the limit. Under
   continuous writes that alone brings the file back once the long reader has ended.
2. :meth:`WalCheckpoints.after_write` every :data:`CHECK_EVERY_WRITES` commits, and
   :meth:`WalCheckpoints.idle` whenever a claim finds no work: if the ``-wal`` file is over the
   limit, a ``PASSIVE`` checkpoint (never waits); when that copied every frame (no reader still
   needs the log), a ``TRUNCATE`` checkpoint with the busy timeout at 0 shrinks the file to 0
   bytes, so an idle worker's WAL shrinks too. If a reader is still active both simply report
   "busy" and the next check tries again.

A checkpoint failure never fails the operation that triggered it (that one has committed).
Closing the store checkpoints as well (see ``opening.py``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

WAL_SIZE_LIMIT_BYTES: Final = 16 * 1024 * 1024
CHECK_EVERY_WRITES: Final = 1000

log = logging.getLogger(__name__)


def journal_size_limit_pragma(limit: int = WAL_SIZE_LIMIT_BYTES) -> str:
    return f"PRAGMA journal_size_limit = {int(limit)}"


def wal_size(database: Path) -> int:
    """The size of ``database``'s ``-wal`` file in bytes (0 when there is none)."""
    try:
        return os.stat(f"{database}-wal").st_size
    except OSError:
        return 0


def _driver(conn: Connection) -> Any:
    return conn.connection.dbapi_connection


def checkpoint_passive(conn: Connection) -> bool:
    """``PRAGMA wal_checkpoint(PASSIVE)``; True when every WAL frame is now in the database."""
    busy, logged, copied = _driver(conn).execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return bool(busy == 0 and logged == copied)


def checkpoint_truncate_now(conn: Connection) -> bool:
    """``PRAGMA wal_checkpoint(TRUNCATE)`` without waiting for readers; True if it truncated."""
    driver = _driver(conn)
    (timeout,) = driver.execute("PRAGMA busy_timeout").fetchone()
    driver.execute("PRAGMA busy_timeout = 0")
    try:
        busy, _logged, _copied = driver.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        driver.execute(f"PRAGMA busy_timeout = {int(timeout)}")
    return bool(busy == 0)


class WalCheckpoints:
    """The while-running checkpoint policy of one store connection on a database file."""

    __slots__ = ("database", "limit", "writes")

    def __init__(self, database: Path, limit: int = WAL_SIZE_LIMIT_BYTES) -> None:
        self.database = database
        self.limit = limit
        self.writes = 0

    def after_write(self, conn: Connection) -> None:
        """Count a committed write; every ``CHECK_EVERY_WRITES`` of them, check the WAL."""
        self.writes += 1
        if self.writes >= CHECK_EVERY_WRITES:
            self.check(conn)

    def idle(self, conn: Connection) -> None:
        """The store has nothing to do (a claim found no work): check the WAL now."""
        self.check(conn)

    def check(self, conn: Connection) -> None:
        """Shrink an over-limit WAL when no reader needs it any more (never waits)."""
        self.writes = 0
        if wal_size(self.database) <= self.limit:
            return
        try:
            if checkpoint_passive(conn):
                checkpoint_truncate_now(conn)
        except (sqlite3.Error, SQLAlchemyError) as error:
            log.debug("WAL checkpoint skipped: %s", error)
