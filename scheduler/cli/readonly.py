"""Reading a SQLite file without writing it: ``mode=ro`` connections, one snapshot per command.

A reader of a WAL database may create the ``-wal``/``-shm`` sidecars (owner-only); the database
file itself is never written. On read-only media the file is read ``immutable=1`` when that is
correct (see :func:`readonly_snapshot`).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from scheduler.contract.errors import SchedulerKernelError
from scheduler.store.plumbing.failures import find_storage_failure_code, storage_unavailable


def readonly_engine(path: Path, *, immutable: bool = False) -> Engine:
    """An engine whose connections open ``file:PATH?mode=ro``: SQLite refuses every write.

    A reader of a WAL database may create the ``-wal``/``-shm`` sidecars; they are created
    owner-only. The database file itself is never written. ``immutable`` adds ``immutable=1``
    (no locks, no WAL): only for :func:`readonly_connection`'s read-only-media fallback.
    """
    uri = f"file:{quote(str(path))}?mode=ro" + ("&immutable=1" if immutable else "")

    def connect() -> sqlite3.Connection:
        previous = os.umask(0o077)
        try:
            connection = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        finally:
            os.umask(previous)
        connection.execute("PRAGMA query_only = ON")
        connection.execute("PRAGMA trusted_schema = OFF")
        return connection

    return create_engine("sqlite+pysqlite://", creator=connect, poolclass=NullPool)


_UNSHARED_SIDECARS = ("-wal", "-journal")
"""Sidecars that may hold committed data the main file does not (yet) have."""


def _file_state(path: Path) -> tuple[object, ...]:
    info = os.stat(path)
    sidecars = tuple(os.path.lexists(f"{path}{suffix}") for suffix in _UNSHARED_SIDECARS)
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, *sidecars)


def _needs_immutable_read(path: Path) -> bool:
    """Whether only an ``immutable=1`` read can read this file, and such a read is correct.

    True when the directory cannot be written (read-only media, or a directory this user may
    not write), so SQLite cannot create the ``-shm`` a WAL database needs and ``mode=ro`` fails
    with ``SQLITE_CANTOPEN``/``SQLITE_READONLY``, and no ``-wal``/``-journal`` lies beside the
    file, so the main file holds every committed write. With such a sidecar present the read is
    refused (``SCHEDULER_STORAGE_UNAVAILABLE``): ``immutable`` would ignore committed data.
    """
    if os.access(path.parent, os.W_OK):
        return False
    probe = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    try:
        probe.execute("SELECT count(*) FROM sqlite_master").fetchall()
        return False
    except sqlite3.Error as error:
        name = str(getattr(error, "sqlite_errorname", ""))
        if not name.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY")):
            return False  # not a read-only-media problem: the command reports it
        if any(os.path.lexists(f"{path}{suffix}") for suffix in _UNSHARED_SIDECARS):
            raise _sidecar_on_readonly_media(path, find_storage_failure_code(error) or name) from error
        return True
    finally:
        probe.close()


def _sidecar_on_readonly_media(path: Path, storage_code: str) -> SchedulerKernelError:
    error = storage_unavailable(phase="open", storage_code=storage_code, commit_state="not_committed")
    error.message = (
        f"{path} cannot be read here: its directory is not writable and a -wal/-journal beside it "
        "may hold committed writes; copy the database with its sidecars to writable storage"
    )
    error.args = (error.message,)
    return error


def stored_journal_mode(path: Path, reported: str) -> str:
    """The journal mode of the file: ``wal`` when its header says so (an ``immutable=1`` reader
    reports ``delete`` for a WAL database), else what the connection ``reported``."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(20)
    except OSError:
        return reported
    wal_format = len(header) == 20 and header[18] == 2 and header[19] == 2
    return "wal" if wal_format else reported


def _changed_while_read(path: Path) -> SchedulerKernelError:
    error = storage_unavailable(
        phase="read", storage_code="SQLITE_BUSY", commit_state="not_committed", retryable=True
    )
    error.message = (
        f"{path} changed while it was read without locks (read-only directory): the output above "
        "may be inconsistent; run the command again"
    )
    error.args = (error.message,)
    return error


@contextmanager
def readonly_snapshot(path: Path) -> Iterator[Connection]:
    """A read-only connection inside one deferred read transaction (one consistent snapshot).

    On read-only media (a directory SQLite cannot create the ``-shm`` in) a WAL database cannot
    be opened with ``mode=ro``; when no ``-wal``/``-journal`` is beside it the main file is read
    with ``immutable=1`` instead, and afterwards the command fails (exit 1,
    ``SCHEDULER_STORAGE_UNAVAILABLE``, retryable) if the file or its sidecars changed meanwhile
    (a writer elsewhere, which ``immutable`` would not have seen).

    The snapshot is ended with ROLLBACK: it has nothing to commit, and on a damaged file SQLite's
    COMMIT can fail ("database disk image is malformed") after every read succeeded, which would
    throw away what the command found.
    """
    immutable = _needs_immutable_read(path)
    before = _file_state(path) if immutable else None
    engine = readonly_engine(path, immutable=immutable)
    try:
        with engine.connect() as connection:
            snapshot = connection.begin()
            connection.exec_driver_sql("BEGIN")
            try:
                yield connection
            finally:
                with suppress(DBAPIError):
                    snapshot.rollback()
    finally:
        engine.dispose()
    if before is not None and _file_state(path) != before:
        raise _changed_while_read(path)
