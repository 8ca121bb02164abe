"""Client and server CPU of one worker's ``settle_and_claim`` cycles on PostgreSQL (with
``--two-calls``, of ``claim_next`` then ``settle``: two transactions a cycle).

    python -m benchmarks.pg_cycle_cpu --url postgresql+psycopg://root@127.0.0.1:5432/test
    python -m benchmarks.pg_cycle_cpu --url … --analyze --per-statement
    PYTHONPATH=<checkout> python -m benchmarks.pg_cycle_cpu --url … --warm-up 200 --floor 1500

Runs ``--cycles`` cycles on a queue of as many rows (in a schema of its own, dropped at the end)
with the server clock, and prints cycles/s, client CPU per cycle (``time.thread_time``) and server
CPU per cycle (the backend's ``/proc/<pid>/stat``, read as the bench reads it; the server must be
local). ``--analyze`` runs
``ANALYZE occurrences`` first (the state autovacuum brings a real queue to); ``--per-statement``
also prints the client CPU and wall time of each fast-path statement (it wraps the fast path's
calls, adding ~2 µs to each). ``--contended`` keeps the store on the claim path it takes among workers
holding its first candidates (``ClaimContention``), to measure that path's own cost alone.
``--warm-up N`` runs N cycles first (the statements' first runs,
and their naming); ``--floor N`` measures the commit floor (N one-row ``INSERT`` + ``COMMIT``
through psycopg, ``scheduler.bench.pg_bench.commit_floor``) just before and just after the
measured cycles and prints the cycles' ratio to it: on a machine whose speed drifts from one
minute to the next, that ratio is steadier than the bench's figures taken minutes apart; run it
alternately for two checkouts (``PYTHONPATH``) to compare them.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from scheduler import open_store
from scheduler.bench.pg_bench import commit_floor
from scheduler.bench.pg_server import backend_cpu_s, backend_pids
from scheduler.bench.pg_workers import worker_engine
from scheduler.store.plumbing import fastpath

AUTHORITY = {"principal": {"type": "service", "id": "pg-cycle-cpu"}}
Totals = dict[str, list[float]]


@contextmanager
def timed_statements(totals: Totals) -> Iterator[None]:
    """Accumulate (count, client CPU s, wall s) per fast-path statement while inside."""
    run, driver_sql, commit = (
        fastpath.FastPath.run,
        fastpath.FastPath.run_driver_sql,
        fastpath.FastPath.commit,
    )
    names: dict[int, str] = {}

    def note(name: str, started: tuple[float, float]) -> None:
        entry = totals.setdefault(name, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += time.thread_time() - started[0]
        entry[2] += time.perf_counter() - started[1]

    def timed_run(self: Any, conn: Any, prepared: Any, parameters: Any, **options: Any) -> Any:
        started = (time.thread_time(), time.perf_counter())
        done = run(self, conn, prepared, parameters, **options)
        name = names.get(id(prepared))
        if name is None:
            name = names[id(prepared)] = " ".join(str(prepared.statement).split())[:70]
        note(name, started)
        return done

    def timed_driver_sql(self: Any, conn: Any, sql: str) -> None:
        started = (time.thread_time(), time.perf_counter())
        driver_sql(self, conn, sql)
        note(sql, started)

    def timed_commit(self: Any, conn: Any) -> None:
        started = (time.thread_time(), time.perf_counter())
        commit(self, conn)
        note("COMMIT", started)

    fastpath.FastPath.run = timed_run  # type: ignore[method-assign]
    fastpath.FastPath.run_driver_sql = timed_driver_sql  # type: ignore[method-assign]
    fastpath.FastPath.commit = timed_commit  # type: ignore[method-assign]
    try:
        yield
    finally:
        fastpath.FastPath.run, fastpath.FastPath.run_driver_sql = run, driver_sql  # type: ignore[method-assign]
        fastpath.FastPath.commit = commit  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--analyze", action="store_true")
    parser.add_argument("--per-statement", action="store_true")
    parser.add_argument(
        "--contended",
        action="store_true",
        help="claim as among workers that hold the first candidates (the window of heads), alone",
    )
    parser.add_argument("--warm-up", type=int, default=0, help="cycles run before the measured ones")
    parser.add_argument("--two-calls", action="store_true", help="each cycle: claim_next, then settle")
    parser.add_argument(
        "--floor", type=int, default=0, help="measure the commit floor (this many commits) before and after"
    )
    args = parser.parse_args()
    application = f"pg_cycle_cpu_{os.getpid()}"
    engine = worker_engine(args.url, application)  # the store's one connection, tagged
    admin = create_engine(args.url, poolclass=NullPool)  # untagged: not counted
    schema = f"cycle_cpu_{os.getpid()}"
    floor_table = f'"{schema}_floor".floor'
    store = open_store(engine, schema=schema)
    try:
        store.create_job(id="job", kind="bench", authority=AUTHORITY)
        queued = args.warm_up + args.cycles + 1
        due = int(time.time() * 1000) - 10**9
        for start in range(0, queued, 500):
            stop = min(queued, start + 500)
            store.enqueue_many(
                [
                    {"job_id": "job", "scheduled_for": due + i, "trigger_key": f"t{i}"}
                    for i in range(start, stop)
                ]
            )
        if args.analyze:
            with admin.begin() as connection:
                connection.exec_driver_sql(f'ANALYZE "{schema}".occurrences')
        if args.contended:
            store._claims.stay_among_workers()
        held = store.claim_next(owner_id="w", lease_ms=60_000)

        def cycles(count: int) -> None:
            nonlocal held
            for _ in range(count):
                assert held is not None
                if args.two_calls:
                    store.settle(occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded")
                    held = store.claim_next(owner_id="w", lease_ms=60_000)
                    continue
                held = store.settle_and_claim(
                    occurrence_id=held.id,
                    owner_id="w",
                    fence=held.fence,
                    outcome="succeeded",
                    lease_ms=60_000,
                ).claimed

        cycles(args.warm_up)
        floor = 0.0
        if args.floor:
            with admin.begin() as connection:
                connection.exec_driver_sql(f'CREATE SCHEMA "{schema}_floor"')
                connection.exec_driver_sql(f"CREATE TABLE {floor_table} (id bigserial PRIMARY KEY, v bigint)")
            floor = commit_floor(admin, floor_table, args.floor)
        totals: Totals = {}
        pids = backend_pids(admin, application)
        server = backend_cpu_s(pids) or 0.0
        client, wall = time.thread_time(), time.perf_counter()
        with timed_statements(totals) if args.per_statement else nullcontext():
            cycles(args.cycles)
        wall, client = time.perf_counter() - wall, time.thread_time() - client
        server = (backend_cpu_s(pids) or 0.0) - server
        print(
            f"{args.cycles / wall:.0f} cycles/s; per cycle: wall {wall / args.cycles * 1e3:.2f} ms, "
            f"client CPU {client / args.cycles * 1e6:.0f} µs, server CPU {server / args.cycles * 1e6:.0f} µs"
        )
        if args.floor:
            floor = (floor + commit_floor(admin, floor_table, args.floor)) / 2
            rate = args.cycles / wall
            print(f"commit floor (before and after) {floor:.0f} commits/s: {rate / floor:.3f} x the floor")
        for name, (count, cpu, spent) in sorted(totals.items(), key=lambda item: -item[1][1]):
            cpu_us, wall_us = cpu / count * 1e6, spent / count * 1e6
            print(f"  {count:6.0f} × client CPU {cpu_us:6.1f} µs, wall {wall_us:6.1f} µs  {name}")
    finally:
        store.close()
        with admin.begin() as connection:
            for name in (schema, f"{schema}_floor"):
                connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        engine.dispose()
        admin.dispose()


if __name__ == "__main__":
    main()
