"""One worker's ``settle_and_claim`` cycles/s against the PostgreSQL commit floor measured around it.

    PYTHONPATH=<checkout> python tools/pg_floor_ratio.py --url postgresql+psycopg://root@127.0.0.1:5432/test

The bench's single-worker loop (a store on the server clock, in a schema of its own, dropped at
the end), after ``--warm-up`` cycles, between two floor measurements (``--floor`` one-row
``INSERT`` + ``COMMIT`` on a scratch table through psycopg): on a machine whose speed drifts from
one minute to the next, the ratio of one short run is steadier than the bench's figures taken
minutes apart. Run it alternately for two checkouts (``PYTHONPATH``) to compare them: the
named-statements figures of docs/benchmarks.md came from six such pairs.
"""

from __future__ import annotations

import argparse
import os
import time

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from scheduler import open_store

AUTHORITY = {"principal": {"type": "service", "id": "pg-floor-ratio"}}
LEASE_MS = 600_000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--warm-up", type=int, default=200)
    parser.add_argument("--floor", type=int, default=1500)
    options = parser.parse_args()
    schema = f"floor_ratio_{os.getpid()}"  # ("pg_" is reserved for system schemas)
    url = make_url(options.url)
    raw = psycopg.connect(
        host=url.host or "localhost",
        port=url.port or 5432,
        user=url.username,
        dbname=url.database,
        password=url.password,
    )
    raw.execute(
        f"CREATE SCHEMA {schema}_floor; CREATE TABLE {schema}_floor.t (id bigserial PRIMARY KEY, v text)"
    )
    raw.commit()
    engine = create_engine(options.url, poolclass=NullPool)
    try:
        store = open_store(engine, schema=schema)
        store.create_job(id="job", kind="bench", authority=AUTHORITY)
        for n in range(options.cycles + options.warm_up + 1):
            store.enqueue_occurrence(job_id="job", scheduled_for=0, trigger_key=f"t{n}")
        held = store.claim_next(owner_id="w", lease_ms=LEASE_MS)

        def cycles(count: int) -> None:
            nonlocal held
            for _ in range(count):
                assert held is not None
                held = store.settle_and_claim(
                    occurrence_id=held.id,
                    owner_id="w",
                    fence=held.fence,
                    outcome="succeeded",
                    lease_ms=LEASE_MS,
                ).claimed

        def floor() -> float:
            started = time.perf_counter()
            for _ in range(options.floor):
                raw.execute(f"INSERT INTO {schema}_floor.t (v) VALUES (%s)", ("x",))
                raw.commit()
            return options.floor / (time.perf_counter() - started)

        cycles(options.warm_up)
        before = floor()
        started, client = time.perf_counter(), time.process_time()
        cycles(options.cycles)
        seconds, client = time.perf_counter() - started, time.process_time() - client
        commits = (before + floor()) / 2
        rate = options.cycles / seconds
        print(
            f"floor {commits:,.0f} commits/s, settle_and_claim {rate:,.0f} cycles/s, "
            f"{rate / commits:.3f} x the floor, client CPU {client / options.cycles * 1e6:,.0f} us/cycle"
        )
        store.close()
    finally:
        engine.dispose()
        raw.rollback()
        raw.execute(f"DROP SCHEMA IF EXISTS {schema}_floor CASCADE; DROP SCHEMA IF EXISTS {schema} CASCADE")
        raw.commit()
        raw.close()


if __name__ == "__main__":
    main()
