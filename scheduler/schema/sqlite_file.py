"""A database file SQLite would take for an empty database although it is not one.

SQLite refuses a file that does not begin with its header ("file is not a database"), except a
file of exactly one byte: its unix VFS reports that size as 0 (it writes one ``S`` into a new
file itself on some macOS file systems), so a stray 1-byte file opens as an empty database and
creating the schema would overwrite it. Such a file is refused like any other foreign file
(``SCHEDULER_SCHEMA_CORRUPT``), unless it is that ``S``.

The byte is read only when the file is 1 byte long: closing a descriptor drops every POSIX lock
this process holds on the file, and a real database (never 1 byte long) may be locked by
another connection of the process.
"""

from __future__ import annotations

import os
from typing import Final

from sqlalchemy import Connection

from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema.target import SCHEMA_CORRUPT, SchemaTarget, schema_error

NOT_A_DATABASE: Final = "file is not a database"
"""SQLite's message for a file that is not a database (result code ``SQLITE_NOTADB``)."""
_SQLITE_PLACEHOLDER: Final = b"S"


def is_stray_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a 1-byte file other than SQLite's own placeholder (see the module)."""
    try:
        if os.stat(path).st_size != 1:
            return False
        with open(path, "rb") as handle:
            return handle.read(1) != _SQLITE_PLACEHOLDER
    except OSError:
        return False  # missing or unreadable: SQLite reports it


def database_path(connection: Connection, target: SchemaTarget) -> str | None:
    """The file of ``target``'s database on this SQLite connection (``None``: in memory)."""
    for row in connection.exec_driver_sql("PRAGMA database_list"):
        if str(row[1]).lower() == target.schema.lower():
            return str(row[2]) or None
    return None


def stray_file_error(path: str) -> SchedulerKernelError:
    """The refusal of a file that is not an SQLite database."""
    message = f"Scheduler database file is not an SQLite database ({NOT_A_DATABASE})"
    return schema_error(SCHEMA_CORRUPT, message, {"path": path})


def foreign_file_error(error: BaseException, path: str) -> SchedulerKernelError | None:
    """``SCHEDULER_SCHEMA_CORRUPT`` for SQLite's own "file is not a database" (``SQLITE_NOTADB``,
    possibly wrapped by SQLAlchemy) raised on ``path``; ``None`` for any other error."""
    for candidate in (error, getattr(error, "orig", None)):
        if getattr(candidate, "sqlite_errorname", None) == "SQLITE_NOTADB":
            return stray_file_error(path)
    return None


def refuse_stray_file(connection: Connection, target: SchemaTarget) -> None:
    """``SCHEDULER_SCHEMA_CORRUPT`` when ``target``'s database file is a stray 1-byte file."""
    path = database_path(connection, target)
    if path is not None and is_stray_file(path):
        raise stray_file_error(path)


__all__ = [
    "NOT_A_DATABASE",
    "database_path",
    "foreign_file_error",
    "is_stray_file",
    "refuse_stray_file",
    "stray_file_error",
]
