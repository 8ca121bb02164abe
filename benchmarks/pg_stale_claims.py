"""``claim_next`` on PostgreSQL right after a burst of enqueues, before any ANALYZE.

For each depth: a fresh schema, ``enqueue_many`` of that many due occurrences (1,000 a call), no
ANALYZE, then ``--claims`` claims, timed one by one, on the store's connection as it opens (no
bitmap scans, ``opening_postgresql.PLANNER_SQL``) and with the planner's defaults put back on it
(``SET enable_bitmapscan = on``: the claim as it ran before). Both runs set ``synchronous_commit =
off`` on the store's connection so the figure is the claim's reads, not each commit's fsync.
Printed: the median claim, and the mean of the first ten (psycopg prepares a statement after five
executions and the server tries five custom plans before it settles on a generic one, so these are
planned for their parameters). Run it where autovacuum cannot analyze the table meanwhile, e.g.

    .venv/bin/python -m benchmarks.pg_stale_claims \\
        --url postgresql+psycopg://root@127.0.0.1:5432/test --depths 1000 100000
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from sqlalchemy import Engine, create_engine

from scheduler import SchedulerStore, open_store

T0 = 1_767_225_600_000
AUTHORITY = {"principal": {"type": "service", "id": "bench"}}
BATCH = 1000


def enqueue(store: SchedulerStore, depth: int) -> None:
    store.create_job(id="job-1", kind="bench", authority=AUTHORITY)
    for start in range(0, depth, BATCH):
        store.enqueue_many(
            [
                {"job_id": "job-1", "scheduled_for": T0 - depth + i, "trigger_key": f"t{i:09d}"}
                for i in range(start, min(depth, start + BATCH))
            ]
        )


FIRST = 10


def claim_times_ms(engine: Engine, depth: int, claims: int, *, planner_defaults: bool) -> list[float]:
    """Wall time of each of ``claims`` claims from a fresh queue of ``depth`` due occurrences."""
    schema = f"stale_{uuid.uuid4().hex[:12]}"
    store = open_store(engine, schema=schema, clock=lambda: T0)
    try:
        enqueue(store, depth)
        store.connection.exec_driver_sql("SET synchronous_commit = off")
        if planner_defaults:
            store.connection.exec_driver_sql("SET enable_bitmapscan = on")
        store.connection.commit()
        times = []
        for _ in range(claims):
            started = time.perf_counter()
            store.claim_next(owner_id="bench", lease_ms=60_000)
            times.append((time.perf_counter() - started) * 1000)
        return times
    finally:
        store.close()
        with engine.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')


def summary(times: list[float]) -> str:
    return f"{statistics.median(times):>8.3f} {statistics.mean(times[:FIRST]):>9.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="postgresql+psycopg://…")
    parser.add_argument("--depths", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--claims", type=int, default=200)
    args = parser.parse_args()
    engine = create_engine(args.url)
    try:
        print(f"claim_next (ms), {args.claims} claims from a queue never analyzed")
        print(f"{'':>9} {'planner defaults':>18} {'store connection':>18}")
        print(
            f"{'queued':>9} {'median':>8} {'first ' + str(FIRST):>9} {'median':>8} {'first ' + str(FIRST):>9}"
        )
        for depth in args.depths:
            before = claim_times_ms(engine, depth, args.claims, planner_defaults=True)
            after = claim_times_ms(engine, depth, args.claims, planner_defaults=False)
            print(f"{depth:>9} {summary(before)} {summary(after)}")
    finally:
        engine.dispose()


if __name__ == "__main__":
    main()
