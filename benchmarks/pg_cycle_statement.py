"""Server CPU of the one-statement cycle itself, as sent and with edits to its SQL, A/B.

    python -m benchmarks.pg_cycle_statement --url postgresql+psycopg://root@127.0.0.1:5432/test
    python -m benchmarks.pg_cycle_statement --url … --among-workers --edit 'LIMIT 8)=LIMIT 1)'

Drains a few cycles of a fresh queue (a schema of its own, dropped at the end) with
``settle_and_claim``, quiet or ``--among-workers`` (``ClaimContention`` held on the window of
heads), and records the cycle's round trip (``BEGIN``, the lead statement, the cycle statement:
``scheduler.backends.postgresql.cycle_statement``) through a psycopg cursor class. The next cycle is then sent
again by hand on a connection of its own, ``--runs`` times and rolled back each time, so every
run settles and claims the same rows; the backend's CPU time (``/proc/<pid>/stat``, the server
must be local) per run is printed for the statement as the store prepared it and, with
``--edit OLD=NEW`` (text replacements, repeatable), for an edited copy, alternating over
``--rounds`` with ``VACUUM`` between, so a change to the statement can be measured before it is
built in Core. Each run prints the check column of the statement's row (1: settled and claimed).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from scheduler import open_store
from scheduler.bench.pg_server import backend_cpu_s, quoted
from scheduler.bench.pg_workers import enqueue_batches

AUTHORITY = {"principal": {"type": "service", "id": "pg-cycle-statement"}}
LEASE_MS = 36_000_000  # the held lease outlives the measurement


def recording_cursor(seen: list[str]) -> type[psycopg.Cursor[Any]]:
    class Recording(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            seen.append(str(query))
            return super().execute(query, params, **kwargs)

    return Recording


def recorded_cycle(url: str, schema: str, among_workers: bool) -> tuple[list[str], list[str]]:
    """The next cycle's ``BEGIN`` and two ``EXECUTE``s, and the ``PREPARE`` texts they run."""
    seen: list[str] = []
    engine = create_engine(url, poolclass=NullPool, connect_args={"cursor_factory": recording_cursor(seen)})
    store = open_store(engine, schema=schema)
    try:
        store.create_job(id="job", kind="bench", authority=AUTHORITY)
        enqueue_batches(store, "t", 500, int(time.time() * 1000) - 1_000_000_000, job_id="job")
        if among_workers:
            store._claims.stay_among_workers()
        held = store.claim_next(owner_id="w", lease_ms=LEASE_MS)
        for _ in range(50):
            assert held is not None
            seen.clear()
            settled = held
            cycle = store.settle_and_claim(
                occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=LEASE_MS
            )
            held = cycle.claimed
        assert held is not None
        begin, lead, statement, commit = seen[0].split("; ")
        assert commit == "COMMIT" and "EXECUTE" in statement, seen[0]
        sent = [begin, *(part.replace(f"'{settled.id}'", f"'{held.id}'") for part in (lead, statement))]
        driver: Any = store.connection.connection.driver_connection
        driver.autocommit = True  # a rollback would DEALLOCATE ALL
        prepared = [
            driver.execute(
                "SELECT statement FROM pg_prepared_statements WHERE name = %(name)s",
                {"name": part.split("EXECUTE ", 1)[1].split("(", 1)[0]},
                prepare=False,
            ).fetchone()[0]
            for part in sent[1:]
        ]
        return sent, prepared
    finally:
        store.close()
        engine.dispose()


def timed(url: str, schema: str, sent: list[str], prepared: list[str], runs: int) -> tuple[float, Any]:
    """Server CPU µs per run of the recorded round trip (rolled back), and the last run's row."""
    with psycopg.connect(url, autocommit=True) as maintenance:
        for table in ("occurrences", "events"):
            maintenance.execute(f'VACUUM "{schema}".{table}')
    with psycopg.connect(url) as connection:
        for text in prepared:
            connection.execute(text, prepare=False)
        connection.commit()
        trip = "; ".join(sent)
        row = None
        for index in range(runs + 20):  # 20 first runs: past the custom plans, not counted
            if index == 20:
                before = backend_cpu_s([connection.info.backend_pid]) or 0.0
            cursor = connection.execute(trip, prepare=False)
            while cursor.nextset():
                pass
            row = cursor.fetchone()
            connection.rollback()
        after = backend_cpu_s([connection.info.backend_pid]) or 0.0
    return (after - before) / runs * 1e6, row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--among-workers", action="store_true")
    parser.add_argument("--edit", action="append", default=[], metavar="OLD=NEW")
    parser.add_argument("--runs", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    url = options.url.replace("postgresql+psycopg://", "postgresql://")
    schema = f"cycle_statement_{os.getpid()}"
    admin = create_engine(options.url, poolclass=NullPool)
    try:
        sent, prepared = recorded_cycle(options.url, schema, options.among_workers)
        edited = prepared[1]
        for edit in options.edit:
            old, new = edit.split("=", 1)
            assert old in edited, f"not in the statement: {old}"
            edited = edited.replace(old, new)
        variants = [("as prepared", prepared)] + ([("edited", [prepared[0], edited])] if options.edit else [])
        print(f"cycle statement: {len(prepared[1]):,} characters")
        for _ in range(options.rounds):
            for label, texts in variants:
                cpu_us, row = timed(url, schema, sent, texts, options.runs)
                print(
                    f"{label:12} server CPU {cpu_us:5.0f} µs per run; check column {row[0] if row else None}"
                )
    finally:
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {quoted(admin, schema)} CASCADE")
        admin.dispose()


if __name__ == "__main__":
    main()
