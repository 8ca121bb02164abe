"""Statements and round trips per job of the store's workers draining N no-op jobs.

The workers and their queues are ``e2e_workers``' (``benchmarks.e2e_peers.ours``: ``Worker`` or
the ``Tasks`` worker, defaults everywhere), run here in this process; every statement on the
worker's store connection during the drain is counted, not timed:

* SQLite: the driver connection's trace callback (each statement run, ``BEGIN``/``COMMIT``/
  ``SAVEPOINT`` and each parameter set of an ``executemany`` included);
* PostgreSQL: libpq's protocol trace of the driver connection: statements are the server's
  ``CommandComplete`` replies (``BEGIN``, ``SAVEPOINT`` and ``COMMIT`` included; each parameter set
  of an ``executemany`` is one), round trips the times the server answered after the client sent
  (a pipelined ``executemany`` is one), savepoints the ``SAVEPOINT`` commands.

The ``LISTEN`` connection of the PostgreSQL waker is not counted (it only listens). Usage::

    python -m benchmarks.worker_statements --jobs 400 \\
        [--pg-url postgresql://postgres@127.0.0.1:5432/postgres] [--only worker-sqlite-c8,...]

``--pg-url`` names a database the script may create a scratch database from (dropped after).
"""

from __future__ import annotations

import argparse
import re
import sqlite3
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.e2e_peers.ours import _enqueue, _worker
from benchmarks.e2e_peers.protocol import Countdown, stop_when


@contextmanager
def sqlite_counter(dbapi: Any, counts: Counter[str]) -> Iterator[None]:
    def traced(sql: str) -> None:
        counts["statements"] += 1
        counts["savepoints"] += sql.lstrip().upper().startswith("SAVEPOINT")
        counts["sql: " + re.sub(r"\d+", "N", " ".join(sql.split())[:70])] += 1

    dbapi.set_trace_callback(traced)
    try:
        yield
    finally:
        with suppress(sqlite3.ProgrammingError):  # closed by the worker (a Tasks worker's own store)
            dbapi.set_trace_callback(None)


@contextmanager
def pg_counter(dbapi: Any, counts: Counter[str]) -> Iterator[None]:
    trace = tempfile.NamedTemporaryFile("w+", prefix="pg-trace-", suffix=".txt")  # noqa: SIM115
    pgconn = dbapi.pgconn
    pgconn.trace(trace.fileno())
    pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
    try:
        yield
    finally:
        pgconn.untrace()
        trace.seek(0)
        last = ""
        for line in trace:
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 3:
                continue
            if fields[0] == "B" and last == "F":
                counts["round trips"] += 1  # the server answers what the client sent (pipelined or not)
            last = fields[0]
            if fields[0] != "B":
                continue
            if fields[2] == "CommandComplete":
                tag = fields[3].strip().strip('"').split() if len(fields) > 3 else []
                counts["statements"] += 1
                counts["savepoints"] += tag[:1] == ["SAVEPOINT"]
                counts["sql: " + " ".join(tag[:1] or ["?"])] += 1
            elif fields[2] == "ErrorResponse":
                counts["statements"] += 1
                counts["sql: (error)"] += 1
        trace.close()


def drain(config: dict[str, Any]) -> Counter[str]:
    """Queue the jobs, run the worker until all were handled, counting its statements meanwhile."""
    _enqueue(config)
    countdown = Countdown(config["jobs"])
    worker, close = _worker(config, countdown.hit)
    counts: Counter[str] = Counter()
    store = worker.store
    dbapi = store.connection.connection.dbapi_connection
    counter: Callable[[Any, Counter[str]], Any] = (
        pg_counter if config["target"].startswith("postgresql") else sqlite_counter
    )
    try:
        stop_when(countdown.done, worker.stop)
        with counter(dbapi, counts):
            worker.run(install_signal_handlers=False)
    finally:
        close()
    return counts


@contextmanager
def scratch_database(url: str) -> Iterator[str]:
    name = f"worker_statements_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def sqlite_file() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="worker-statements-") as directory:
        yield str(Path(directory) / "store.sqlite")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--pg-url", default=None, help="libpq URL of a database to create a scratch one from")
    parser.add_argument("--only", default="", help="comma-separated substrings of the rows to run")
    parser.add_argument("--show", action="store_true", help="also list the statements (by their start)")
    args = parser.parse_args()
    databases = ["sqlite"] + (["pg"] if args.pg_url else [])
    wanted = [part for part in args.only.split(",") if part]
    print(f"{args.jobs} jobs per drain; per job: statements, round trips (PostgreSQL), savepoints")
    for database in databases:
        for api in ("worker", "tasks"):
            for concurrency in (1, 8):
                key = f"{api}-{database}-c{concurrency}"
                if wanted and not any(part in key for part in wanted):
                    continue
                place = scratch_database(args.pg_url) if database == "pg" else sqlite_file()
                with place as target:
                    config = {"target": target, "jobs": args.jobs, "api": api, "concurrency": concurrency}
                    counts = drain(config)
                per_job = {name: value / args.jobs for name, value in counts.items()}
                trips = f"{per_job['round trips']:6.2f}" if database == "pg" else "     -"
                print(
                    f"  {key:<18} {per_job['statements']:6.2f} statements  {trips} round trips"
                    f"  {per_job['savepoints']:5.2f} savepoints"
                )
                if args.show:
                    for name, value in sorted(per_job.items(), key=lambda item: -item[1]):
                        if name.startswith("sql: "):
                            print(f"      {value:6.2f}  {name[5:]}")


if __name__ == "__main__":
    threading.current_thread().name = "worker-statements"
    main()
