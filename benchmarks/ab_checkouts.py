"""Interleaved A/B of two checkouts of this project: the same workloads, one round after another.

Each round runs every workload once on checkout A and once on checkout B (the order alternates
from round to round), each measurement in a fresh process whose ``PYTHONPATH`` is that checkout,
through the public API only, so any two commits can be compared. It reports per workload the
median of A and B, the median of the per-round ratios B/A, and that ratio's spread (min–max), so a
difference can be told from round-to-round weather. Usage (from the checkout's root)::

    git worktree add /tmp/ab-old <old-commit>
    python -m benchmarks.ab_checkouts --a /tmp/ab-old --b . --rounds 7 \\
        --pg-url postgresql+psycopg://postgres@127.0.0.1:5432/DB

Workloads: ``sqlite-enqueue`` (one ``enqueue_occurrence`` per transaction), ``sqlite-claim-settle``
(``claim_next`` then ``settle``), ``sqlite-settle-and-claim`` (one call per cycle), and with
``--pg-url``: ``pg-enqueue`` (``--jobs`` ``enqueue_occurrence`` calls, one per transaction, the
server's clock, after 50 not measured), ``pg-worker-1`` (one ``Worker`` draining no-op jobs) and
``pg-workers-4`` (four worker processes draining one queue). SQLite files are WAL with
``synchronous=FULL`` (the store's default), in ``--dir``; each PostgreSQL measurement uses a schema
of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

SQLITE_WORKLOADS = ("sqlite-enqueue", "sqlite-claim-settle", "sqlite-settle-and-claim")
PG_WORKLOADS = ("pg-enqueue", "pg-worker-1", "pg-workers-4")
AUTHORITY = {"principal": {"type": "service", "id": "ab"}}


def _noop(occurrence: Any, ctx: Any) -> None:
    return None


def fill_noop_queue(store: Any, count: int) -> None:
    """Job ``noop`` and ``count`` of its occurrences, due now (``enqueue_many`` in chunks of 500)."""
    store.create_job(id="noop", kind="noop", authority=AUTHORITY)
    for start in range(0, count, 500):
        store.enqueue_many(
            [
                {"job_id": "noop", "scheduled_for": 0, "trigger_key": f"k{n}"}
                for n in range(start, min(count, start + 500))
            ]
        )


def _sqlite_enqueue(store: Any, ops: int) -> float:
    store.create_job(id="noop", kind="noop", authority=AUTHORITY)
    started = time.perf_counter()
    for n in range(ops):
        store.enqueue_occurrence(job_id="noop", scheduled_for=0, trigger_key=f"k{n}")
    return ops / (time.perf_counter() - started)


def _sqlite_claim_settle(store: Any, ops: int) -> float:
    fill_noop_queue(store, ops)
    started = time.perf_counter()
    for _ in range(ops):
        held = store.claim_next(owner_id="w", lease_ms=60_000)
        store.settle(occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded")
    return ops / (time.perf_counter() - started)


def _sqlite_settle_and_claim(store: Any, ops: int) -> float:
    fill_noop_queue(store, ops + 1)
    held = store.claim_next(owner_id="w", lease_ms=60_000)
    started = time.perf_counter()
    for _ in range(ops):
        outcome = store.settle_and_claim(
            occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=60_000
        )
        held = outcome.claimed
    return ops / (time.perf_counter() - started)


def _drain(url: str, schema: str, start_at: float, done: Any) -> None:
    from scheduler import open_store
    from scheduler.worker import Worker

    with open_store(url, schema=schema) as store:
        worker = Worker(store, {"noop": _noop}, periodic=False)
        while time.time() < start_at:
            time.sleep(0.001)
        done.put(worker.run_until_idle())


def _pg_workers(url: str, ops: int, processes: int) -> float:
    import sqlalchemy

    from scheduler import open_store

    schema = f"ab_{uuid.uuid4().hex[:12]}"
    try:
        with open_store(url, schema=schema) as store:
            fill_noop_queue(store, ops)
        context = multiprocessing.get_context("spawn")
        done = context.Queue()
        start_at = time.time() + 3.0  # every process has opened its store by then
        children = [
            context.Process(target=_drain, args=(url, schema, start_at, done)) for _ in range(processes)
        ]
        for child in children:
            child.start()
        ran = sum(done.get() for _ in children)
        elapsed = time.time() - start_at
        for child in children:
            child.join()
        if ran != ops:
            raise SystemExit(f"the workers ran {ran} occurrences, not {ops}")
        return ops / elapsed
    finally:
        engine = sqlalchemy.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()


def _pg_enqueue(url: str, ops: int) -> float:
    import sqlalchemy

    from scheduler import open_store

    schema = f"ab_{uuid.uuid4().hex[:12]}"
    try:
        with open_store(url, schema=schema) as store:
            store.create_job(id="noop", kind="noop", authority=AUTHORITY)
            for n in range(50):
                store.enqueue_occurrence(job_id="noop", scheduled_for=0, trigger_key=f"warm{n}")
            started = time.perf_counter()
            for n in range(ops):
                store.enqueue_occurrence(job_id="noop", scheduled_for=0, trigger_key=f"k{n}")
            return ops / (time.perf_counter() - started)
    finally:
        engine = sqlalchemy.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()


def measure(workload: str, ops: int, directory: Path, url: str | None) -> float:
    """One measurement of ``workload`` in this process (operations or jobs per second)."""
    if workload == "pg-enqueue":
        assert url is not None
        return _pg_enqueue(url, ops)
    if workload.startswith("pg-"):
        assert url is not None
        return _pg_workers(url, ops, 1 if workload == "pg-worker-1" else 4)
    from scheduler import open_store

    runs: dict[str, Callable[[Any, int], float]] = {
        "sqlite-enqueue": _sqlite_enqueue,
        "sqlite-claim-settle": _sqlite_claim_settle,
        "sqlite-settle-and-claim": _sqlite_settle_and_claim,
    }
    path = directory / f"ab-{uuid.uuid4().hex}.sqlite"
    try:
        with open_store(path) as store:
            return runs[workload](store, ops)
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def _one(checkout: Path, workload: str, ops: int, directory: Path, url: str | None) -> float:
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", workload, "--ops", str(ops)]
    command += ["--dir", str(directory)] + (["--pg-url", url] if url else [])
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    out = subprocess.run(command, env=env, capture_output=True, text=True, cwd=checkout)
    if out.returncode != 0:
        raise SystemExit(f"{workload} on {checkout} failed:\n{out.stderr}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["per_second"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--a", type=Path, help="checkout A (the baseline)")
    parser.add_argument("--b", type=Path, help="checkout B (the change)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=2_000, help="operations per SQLite measurement")
    parser.add_argument("--jobs", type=int, default=3_000, help="jobs per PostgreSQL worker measurement")
    parser.add_argument("--pg-url", default=None)
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite files go")
    parser.add_argument("--only", default=None, help="comma-separated workloads")
    parser.add_argument("--json", type=Path, default=None, help="write every figure to FILE")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    options = parser.parse_args()
    directory = options.dir or Path(tempfile.mkdtemp(prefix="ab-"))  # owner-only, as the store asks
    if options.measure:
        print(json.dumps({"per_second": measure(options.measure, options.ops, directory, options.pg_url)}))
        return
    if options.a is None or options.b is None:
        parser.error("--a and --b are required")
    workloads = list(SQLITE_WORKLOADS) + (list(PG_WORKLOADS) if options.pg_url else [])
    if options.only:
        workloads = [w for w in workloads if w in options.only.split(",")]
    figures: dict[str, dict[str, list[float]]] = {w: {"a": [], "b": []} for w in workloads}
    for round_no in range(options.rounds):
        order = ("a", "b") if round_no % 2 == 0 else ("b", "a")
        for workload in workloads:
            ops = options.jobs if workload.startswith("pg-") else options.ops
            for side in order:
                checkout = options.a if side == "a" else options.b
                figures[workload][side].append(_one(checkout, workload, ops, directory, options.pg_url))
        print(f"round {round_no + 1}/{options.rounds} done", file=sys.stderr)
    print("| workload | A median /s | B median /s | B/A median of rounds | B/A min–max | A spread |")
    print("|---|---|---|---|---|---|")
    for workload, sides in figures.items():
        ratios = [b / a for a, b in zip(sides["a"], sides["b"], strict=True)]
        spread = (max(sides["a"]) - min(sides["a"])) / statistics.median(sides["a"])
        print(
            f"| {workload} | {statistics.median(sides['a']):,.0f} | {statistics.median(sides['b']):,.0f} "
            f"| {statistics.median(ratios):.3f} | {min(ratios):.2f}–{max(ratios):.2f} | ±{spread / 2:.0%} |"
        )
    if options.json:
        options.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
