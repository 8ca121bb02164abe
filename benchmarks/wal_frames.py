"""How many WAL frames (pages) one commit writes: the bytes every ``fdatasync`` has to flush.

    python -m benchmarks.wal_frames [--depth 100000]

Prints the frames per commit of the raw commit floor (one small row), ``enqueue_occurrence``,
``claim_next``, ``settle`` and ``settle_and_claim`` on a store with ``--depth`` queued
occurrences (bulk-inserted as ``scheduler bench`` builds its depths). The WAL is checkpointed and
truncated first, so after ``count`` operations its size is exactly the frames they appended (as
long as they stay under the 1,000-frame auto-checkpoint).
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from scheduler.bench.context import LEASE_MS
from scheduler.bench.depth import DepthBuilder, depth_job
from scheduler.bench.stores import PAST_MS, enqueue_request, open_bench_store, settle_kwargs, wall_ms

WAL_HEADER: Final = 32
FRAME_HEADER: Final = 24
SAMPLES: Final = 20
OWNER: Final = "wal-frames"


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


def store_frames(path: Path, depth: int) -> dict[str, float]:
    """Frames per commit of each store call on a store of ``depth`` queued occurrences."""
    store: Any = open_bench_store(path)
    try:
        DepthBuilder(path, depth_job(store)).add(depth + 2 * SAMPLES + 1)
        base = wall_ms() - PAST_MS
        requests = iter(enqueue_request("frames", index, base) for index in range(SAMPLES))
        frames = {
            "enqueue_occurrence": frames_per_operation(
                path, lambda: store.enqueue_occurrence(**next(requests)), SAMPLES
            )
        }
        claimed: list[Any] = []
        frames["claim_next"] = frames_per_operation(
            path, lambda: claimed.append(store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS)), SAMPLES
        )
        pending = iter(claimed)
        frames["settle"] = frames_per_operation(
            path, lambda: store.settle(**settle_kwargs(next(pending), OWNER)), SAMPLES
        )
        held = store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS)

        def cycle() -> None:
            nonlocal held
            held = store.settle_and_claim(**settle_kwargs(held, OWNER), lease_ms=LEASE_MS).claimed

        frames["settle_and_claim"] = frames_per_operation(path, cycle, SAMPLES)
        return frames
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--depth", type=int, default=1_000, help="queued occurrences (default 1,000)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scheduler-lab-") as directory:
        print(f"raw commit floor: {floor_frames(Path(directory)):.1f} frames per commit")
        for name, frames in store_frames(Path(directory) / "store.sqlite", options.depth).items():
            print(f"{name} @ {options.depth:,} queued: {frames:.1f} frames per commit")


if __name__ == "__main__":
    main()
