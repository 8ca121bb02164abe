"""Benchmark ``store.stats()`` and ``prune(dry_run=True)`` on a database of N occurrences (default 1M).

Builds (once, cached at --db) a v6 database with 20 job kinds: 96 % succeeded, 2 % queued (half due),
1 % retry_wait, 0.5 % dead_letter, 0.5 % running (a tenth with expired leases), rows written by raw
bulk insert in the shape ``enqueue_occurrence`` writes. Then prints the CPU and wall time of each
call (median of --repeat runs). Usage:

    python -m benchmarks.bench_stats --db /tmp/bench/stats-1m.sqlite --occurrences 1000000
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time
from pathlib import Path

from scheduler import open_store
from scheduler.contract.canonical import canonical_json
from scheduler.contract.identity import derive_occurrence_identity

T0 = 1_767_225_600_000
KINDS = 20
AUTHORITY = {"principal": {"type": "service", "id": "bench"}}


def build(path: Path, total: int) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open_store(path, clock=lambda: T0) as store:
        for index in range(KINDS):
            store.create_job(id=f"job-{index}", kind=f"kind-{index}", authority=AUTHORITY)
        authority = canonical_json(store.get_job("job-0").authority, "authority")  # type: ignore[union-attr]
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA synchronous = OFF")
    connection.execute("BEGIN")
    rows = []
    for number in range(total):
        job = f"job-{number % KINDS}"
        identity = derive_occurrence_identity(
            job_id=job, job_revision=1, scheduled_for=T0 + number, trigger_key=f"k{number}"
        )
        bucket = number % 200
        status, owner, expires, settled, error = "succeeded", None, None, T0 + number + 10, None
        if bucket < 4:
            status, settled = "queued", None
        elif bucket < 6:
            status, settled = "retry_wait", None
        elif bucket == 6:
            status, error = "dead_letter", '{"code":"E","message":"m"}'
        elif bucket == 7:
            status, owner, settled = "running", "w", None
            expires = T0 if (number // 200) % 10 == 0 else T0 * 2
        available = T0 + 10 * total if bucket in (0, 1) else T0 + number  # half of the queued rows: future
        rows.append(
            (
                identity.occurrence_id,
                job,
                identity.idempotency_key,
                f"k{number}",
                T0 + number,
                available,
                status,
                owner,
                expires,
                authority,
                error,
                T0 + number,
                T0 + number,
                settled,
            )
        )
        if len(rows) == 20_000:
            insert(connection, rows)
            rows.clear()
    insert(connection, rows)
    connection.execute("COMMIT")
    connection.close()


def insert(connection: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    connection.executemany(
        "INSERT INTO occurrences (occurrence_id, job_id, job_revision, idempotency_key, trigger_key,"
        " scheduled_for, available_at, status, attempt, max_attempts, fence, lease_owner, lease_expires_at,"
        " authority_json,"
        " payload_json, last_error_json, result_json, created_at, updated_at, settled_at)"
        " VALUES (?, ?, 1, ?, ?, ?, ?, ?, 1, 3, 1, ?, ?, ?, 'null', ?, NULL, ?, ?, ?)",
        rows,
    )


def measure(label: str, call: object, repeat: int) -> None:
    cpu, wall = [], []
    for _ in range(repeat):
        started_cpu, started = time.process_time(), time.perf_counter()
        call()  # type: ignore[operator]
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started)
    print(
        f"{label}: cpu {statistics.median(cpu) * 1000:.1f} ms,"
        f" wall {statistics.median(wall) * 1000:.1f} ms (median of {repeat})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", type=Path, default=Path("/tmp/scheduler-bench/stats.sqlite"))
    parser.add_argument("--occurrences", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    if not options.db.exists():
        started = time.perf_counter()
        build(options.db, options.occurrences)
        print(f"built {options.occurrences} occurrences in {time.perf_counter() - started:.0f} s")
    now = T0 + options.occurrences  # every row created; half of them settled over half this long ago
    with open_store(options.db, clock=lambda: now) as store:
        stats = store.stats()
        print(
            f"statuses {stats.statuses}, oldest due age {stats.oldest_due_age_ms} ms,"
            f" expired {stats.expired_leases}"
        )
        measure("stats()", store.stats, options.repeat)
        measure("queue_depth()", store.queue_depth, options.repeat)
        half = options.occurrences // 2
        measure(
            f"prune(older_than_ms={half}, dry_run=True, max_batches=1)",
            lambda: store.prune(older_than_ms=half, dry_run=True, max_batches=1),
            options.repeat,
        )


if __name__ == "__main__":
    main()
