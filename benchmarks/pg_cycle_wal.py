"""WAL written per ``settle_and_claim`` cycle of one worker on PostgreSQL, by record type.

    python -m benchmarks.pg_cycle_wal --url postgresql+psycopg://root@127.0.0.1:5432/test

Enqueues ``--cycles`` + 1 due occurrences in a schema of its own (dropped at the end), claims
the first, runs ``CHECKPOINT`` (so every run starts with the same full-page images to write:
the first change of each page after a checkpoint logs the whole page), then runs ``--cycles``
cycles and prints the WAL bytes per cycle (``pg_current_wal_lsn`` before and after). Where the
``pg_walinspect`` extension is installed in the database (PostgreSQL 15 and later ship it:
``CREATE EXTENSION pg_walinspect``), it also prints each record type's count and bytes per
cycle (record, full-page images, both). The cycles are the only writers the server should have
meanwhile: other sessions' WAL would be counted too. ``CHECKPOINT`` needs a superuser or the
``pg_checkpoint`` role.
"""

from __future__ import annotations

import argparse
import time

from sqlalchemy import Engine, create_engine, text

from scheduler import open_store
from scheduler.bench.pg_server import quoted
from scheduler.bench.pg_workers import enqueue_batches

AUTHORITY = {"principal": {"type": "service", "id": "pg-cycle-wal"}}
_BY_RECORD = text(
    'SELECT "resource_manager/record_type", count, record_size, fpi_size, combined_size'
    " FROM pg_get_wal_stats(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn), true)"
    " WHERE count > 0 ORDER BY combined_size DESC"
)


def _lsn(engine: Engine) -> str:
    with engine.connect() as connection:
        return str(connection.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())


def run_cycles(engine: Engine, schema: str, cycles: int) -> tuple[str, str]:
    """The WAL positions before and after ``cycles`` cycles on a fresh queue in ``schema``."""
    store = open_store(engine, schema=schema)
    try:
        store.create_job(id="job", kind="wal", authority=AUTHORITY)
        enqueue_batches(store, "t", cycles + 1, int(time.time() * 1000) - 10 * (cycles + 1), job_id="job")
        held = store.claim_next(owner_id="w", lease_ms=60_000)
        with engine.connect() as connection:
            connection.execute(text("CHECKPOINT"))
            connection.commit()
        start = _lsn(engine)
        for _ in range(cycles):
            assert held is not None
            done = store.settle_and_claim(
                occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=60_000
            )
            held = done.claimed
        return start, _lsn(engine)
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True)
    parser.add_argument("--cycles", type=int, default=3000)
    arguments = parser.parse_args()
    engine = create_engine(arguments.url)
    schema = f"cycle_wal_{time.time_ns() % 10**9}"
    cycles = arguments.cycles
    try:
        start, end = run_cycles(engine, schema, cycles)
        with engine.connect() as connection:
            written = connection.execute(
                text("SELECT pg_wal_lsn_diff(CAST(:end AS pg_lsn), CAST(:start AS pg_lsn))"),
                {"start": start, "end": end},
            ).scalar_one()
            print(f"{cycles} cycles: {float(written) / cycles:,.0f} bytes of WAL per cycle")
            if connection.execute(text("SELECT 1 FROM pg_extension WHERE extname = 'pg_walinspect'")).first():
                print("per cycle: record type, count, record bytes, full-page image bytes, both")
                for row in connection.execute(_BY_RECORD, {"start": start, "end": end}):
                    name, count, *sizes = row
                    print(f"  {name:24} {count / cycles:6.2f}", *(f"{size / cycles:7.0f}" for size in sizes))
    finally:
        with engine.begin() as connection:
            connection.execute(text(f"DROP SCHEMA IF EXISTS {quoted(engine, schema)} CASCADE"))
        engine.dispose()


if __name__ == "__main__":
    main()
