"""One module per backend for everything the store does differently on it.

``sqlite`` and ``postgresql`` register their renderings of the neutral constructs of
:mod:`scheduler.store.plumbing.constructs` when imported (this package imports both) and hold each backend's
runtime pieces. :func:`for_connection` picks the module for a connection.
"""

from __future__ import annotations

from types import ModuleType

from sqlalchemy import Connection

from scheduler.backends.postgresql import backend as postgresql
from scheduler.backends.sqlite import backend as sqlite
from scheduler.contract.errors import invalid_argument

_BY_NAME: dict[str, ModuleType] = {sqlite.NAME: sqlite, postgresql.NAME: postgresql}


def for_connection(conn: Connection) -> ModuleType:
    """The dialect module of ``conn``'s backend; ``SCHEDULER_INVALID_ARGUMENT`` for another one."""
    try:
        return _BY_NAME[conn.dialect.name]
    except KeyError:
        raise invalid_argument(
            f"the scheduler store supports SQLite and PostgreSQL, not {conn.dialect.name}"
        ) from None


__all__ = ["for_connection", "postgresql", "sqlite"]
