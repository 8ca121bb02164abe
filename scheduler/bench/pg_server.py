"""The PostgreSQL server side of the bench: backend pids and their CPU time (server is local).

Each backend process serves one client connection; its CPU time (user + system) is read from
``/proc/<pid>/stat`` before and after a measurement. That needs the server on this machine and
a ``/proc`` the bench can read; otherwise the figures are ``None`` (reported as n/a).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from sqlalchemy import Engine

_TICKS: int = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def quoted(engine: Engine, name: str) -> str:
    return str(engine.dialect.identifier_preparer.quote_identifier(name))


def backend_pids(engine: Engine, application_name: str) -> list[int]:
    """The server pids of the connections tagged ``application_name``."""
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %(name)s", {"name": application_name}
        ).all()
    return [int(row[0]) for row in rows]


def backend_cpu_s(pids: Sequence[int]) -> float | None:
    """User + system CPU seconds of these server processes so far (``None`` if unreadable)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / _TICKS if pids else None
