"""Helpers of the hardening tests: stores on real files, raw inspection, read-only media.

Everything here works on real SQLite files, real threads and real processes; nothing is mocked.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.schema.upgrade import apply_step

T0 = 1767225600000
AUTHORITY: dict[str, Any] = {
    "principal": {"type": "user", "id": "user-alice"},
    "tenantId": "tenant-acme",
    "workspaceId": "ws-main",
    "requestedCapabilities": ["calendar.read"],
}
REPO = Path(__file__).resolve().parents[1]


def expect_code(code: str, call: Callable[[], Any]) -> SchedulerKernelError:
    with pytest.raises(SchedulerKernelError) as caught:
        call()
    assert caught.value.code == code, f"{caught.value.code}: {caught.value.message}"
    return caught.value


def new_store(path: Path, **options: Any) -> SchedulerStore:
    """A v6 store with one job ``job-a`` (a fixed clock unless one is given)."""
    options.setdefault("clock", lambda: T0)
    store = open_store(path, **options)
    store.create_job(id="job-a", kind="agenda", authority=AUTHORITY)
    return store


def enqueue_requests(prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        {"job_id": "job-a", "scheduled_for": T0, "trigger_key": f"{prefix}-{index}"} for index in range(count)
    ]


def raw_rows(path: Path, sql: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on a fresh read-only connection (sees every committed write)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return connection.execute(sql, parameters).fetchall()
    finally:
        connection.close()


def orphan_occurrences(path: Path) -> list[str]:
    """Occurrences without their ``occurrence_enqueued`` event (a half-committed enqueue)."""
    return [
        row[0]
        for row in raw_rows(
            path,
            "SELECT occurrence_id FROM occurrences o WHERE NOT EXISTS (SELECT 1 FROM events e "
            "WHERE e.occurrence_id = o.occurrence_id AND e.event_type = 'occurrence_enqueued')",
        )
    ]


def sidecars(path: Path) -> list[str]:
    return sorted(
        candidate.name for candidate in path.parent.iterdir() if candidate.name.startswith(path.name + "-")
    )


def open_descriptors() -> set[str]:
    """What this process's file descriptors point at."""
    found = set()
    for entry in os.scandir("/proc/self/fd"):
        try:
            found.add(os.readlink(entry.path))
        except OSError:
            continue
    return found


def database_descriptors(path: Path) -> list[str]:
    """Open descriptors of this process on the database or its sidecars."""
    return sorted(target for target in open_descriptors() if target.startswith(str(path)))


def create_database_at_version(path: Path, version: int) -> None:
    """A healthy scheduler database at schema ``version`` (1..6), made by the upgrade steps."""
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
            for step in range(1, version + 1):
                apply_step(connection, step, T0)
            connection.commit()
    finally:
        engine.dispose()
    path.chmod(0o600)


# ----------------------------------------------------------------- read-only media


def _unshare_prefix() -> list[str] | None:
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    prefix = [unshare, "-m"] if os.geteuid() == 0 else [unshare, "-r", "-m"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, check=False)
    return prefix if probe.returncode == 0 else None


_MOUNT_READ_ONLY = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && exec "$@"'


@contextmanager
def read_only_media(directory: Path) -> Iterator[Callable[[list[str]], subprocess.CompletedProcess[str]]]:
    """Run commands that see ``directory`` as read-only media.

    Preferred: a read-only bind mount of ``directory`` inside a private mount namespace
    (``unshare -m``, or ``unshare -r -m`` for a non-root user): writes fail with ``EROFS``
    exactly as on a read-only mount, and nothing outside the command's namespace changes.
    Without ``unshare``: a non-root user gets a directory and files without write permission
    (``EACCES``), which SQLite meets the same way (it cannot create the ``-shm``).
    """
    prefix = _unshare_prefix()
    if prefix is not None:

        def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*prefix, "sh", "-c", _MOUNT_READ_ONLY, "sh", str(directory), *argv],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )

        yield run
        return
    if os.geteuid() == 0:
        pytest.fail("read-only media needs `unshare` (mount namespaces) when the tests run as root")
    modes = {entry: entry.stat().st_mode for entry in [directory, *directory.iterdir()]}
    for entry in modes:
        entry.chmod(0o555 if entry.is_dir() else 0o444)
    try:
        yield lambda argv: subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    finally:
        for entry, mode in modes.items():
            entry.chmod(mode)


def python_argv(source: str) -> list[str]:
    """``python -c source`` with the repository importable."""
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n{source}"]
