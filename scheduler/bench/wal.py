"""How many WAL frames (pages) one commit writes: the bytes every ``fdatasync`` has to flush.

The WAL is checkpointed and truncated first, so after ``count`` operations its size is exactly
the frames they appended (as long as they stay under the 1,000-frame auto-checkpoint).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Final

WAL_HEADER: Final = 32
FRAME_HEADER: Final = 24


def _checkpoint(path: Path) -> int:
    """Truncate the WAL (no reader may hold a snapshot); returns the page size."""
    connection = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return int(connection.execute("PRAGMA page_size").fetchone()[0])
    finally:
        connection.close()


def frames_per_operation(path: Path, operation: Callable[[], object], count: int) -> float:
    """Average WAL frames appended by each of ``count`` calls of ``operation`` on ``path``."""
    page_size = _checkpoint(path)
    for _ in range(count):
        operation()
    wal = Path(f"{path}-wal")
    size = wal.stat().st_size if wal.exists() else 0
    frames = max(0, size - WAL_HEADER) / (page_size + FRAME_HEADER)
    return frames / count


def floor_frames(directory: Path, count: int = 20) -> float:
    """Frames per commit of the floor loop (one small row per ``BEGIN IMMEDIATE … COMMIT``)."""
    path = directory / "floor-frames.sqlite"
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")
        connection.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")

        def commit() -> None:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO floor (value) VALUES (?)", ("x" * 200,))
            connection.execute("COMMIT")

        return frames_per_operation(path, commit, count)
    finally:
        connection.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
