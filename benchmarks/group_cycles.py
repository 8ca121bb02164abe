"""A batched worker's cycle: settle a group of ``--group`` runs and claim as many, four ways.

* ``settle_and_claim ×N``: one ``settle_and_claim`` per run (N commits per group);
* ``settle_many_and_claim``: the group's settlements and claims in one call (one commit);
* ``transaction(): settle_many + claim_batch``: the same in a ``store.transaction()`` block (each
  call in a savepoint of its own);
* ``commit_group``: the same as the batched worker (``scheduler.worker.batching``) does it, one
  internal call that also reads the claimed runs' job kinds and controls.

Each round gives each style a fresh database (a SQLite file, or a PostgreSQL schema with
``--url``) holding ``(cycles + 1) × group`` due occurrences, claims a first group, then times
``--cycles`` cycles of settling the held group (``succeeded``) and claiming the next. The styles
take turns within a round; printed: each style's median cycles/s (one cycle = ``--group``
settlements and claims) and its ratio to the first style. For example

    python -m benchmarks.group_cycles --cycles 200 --rounds 3
    python -m benchmarks.group_cycles --url postgresql+psycopg://postgres@127.0.0.1:5432/lab
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine

from scheduler import Occurrence, SchedulerStore, open_store
from scheduler.store.capabilities.worker_groups import CommittedGroup, commit_group, group_claims

OWNER = "bench-worker"
LEASE_MS = 60_000
AUTHORITY = {"principal": {"type": "service", "id": "bench"}}
ENQUEUE_BATCH = 1000
WORKER_CLAIMS = group_claims(OWNER, LEASE_MS, [("bench", None)])

Style = Callable[[SchedulerStore, list[Occurrence], int], list[Occurrence]]


def settlement(occurrence: Occurrence) -> dict[str, Any]:
    return {
        "occurrence_id": occurrence.id,
        "owner_id": OWNER,
        "fence": occurrence.fence,
        "outcome": "succeeded",
    }


def one_by_one(store: SchedulerStore, held: list[Occurrence], group: int) -> list[Occurrence]:
    claimed = []
    for occurrence in held:
        cycle = store.settle_and_claim(**settlement(occurrence), lease_ms=LEASE_MS)
        if cycle.claimed is not None:
            claimed.append(cycle.claimed)
    return claimed


def in_one_call(store: SchedulerStore, held: list[Occurrence], group: int) -> list[Occurrence]:
    settlements = [settlement(occurrence) for occurrence in held]
    return store.settle_many_and_claim(settlements, owner_id=OWNER, lease_ms=LEASE_MS, limit=group).claimed


def in_one_block(store: SchedulerStore, held: list[Occurrence], group: int) -> list[Occurrence]:
    with store.transaction() as tx:
        tx.settle_many([settlement(occurrence) for occurrence in held])
        return tx.claim_batch(owner_id=OWNER, lease_ms=LEASE_MS, limit=group)


def as_the_worker(store: SchedulerStore, held: list[Occurrence], group: int) -> list[Occurrence]:
    done = commit_group(store, [settlement(occurrence) for occurrence in held], WORKER_CLAIMS, group)
    assert isinstance(done, CommittedGroup), done
    return done.claimed


STYLES: dict[str, Style] = {
    "settle_and_claim ×N": one_by_one,
    "settle_many_and_claim": in_one_call,
    "transaction(): settle_many + claim_batch": in_one_block,
    "commit_group (+ runtimes read)": as_the_worker,
}


def fill(store: SchedulerStore, count: int) -> None:
    store.create_job(id="job-1", kind="bench", authority=AUTHORITY)
    due = int(time.time() * 1000) - count - 1000
    for start in range(0, count, ENQUEUE_BATCH):
        store.enqueue_many(
            [
                {"job_id": "job-1", "scheduled_for": due + i, "trigger_key": f"t{i:09d}"}
                for i in range(start, min(count, start + ENQUEUE_BATCH))
            ]
        )


def cycles_per_s(store: SchedulerStore, style: Style, group: int, cycles: int) -> float:
    fill(store, (cycles + 1) * group)
    held = store.claim_batch(owner_id=OWNER, lease_ms=LEASE_MS, limit=group)
    started = time.perf_counter()
    for _ in range(cycles):
        held = style(store, held, group)
        assert len(held) == group
    return cycles / (time.perf_counter() - started)


@contextmanager
def fresh_stores(url: str | None) -> Iterator[Callable[[], Any]]:
    """A factory of stores on fresh databases, each closed and removed by the context manager."""
    directory = Path(tempfile.mkdtemp(prefix="scheduler-lab-"))
    engine = create_engine(url) if url else None

    @contextmanager
    def fresh() -> Iterator[SchedulerStore]:
        name = f"groups_{uuid.uuid4().hex[:12]}"
        store = (
            open_store(directory / f"{name}.sqlite") if engine is None else open_store(engine, schema=name)
        )
        try:
            yield store
        finally:
            store.close()
            if engine is not None:
                with engine.begin() as connection:
                    connection.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')

    try:
        yield fresh
    finally:
        if engine is not None:
            engine.dispose()
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=None, help="postgresql+psycopg://… (default: SQLite files)")
    parser.add_argument("--group", type=int, default=8, help="runs settled and claimed per cycle")
    parser.add_argument("--cycles", type=int, default=200, help="timed cycles per style and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {name: [] for name in STYLES}
    with fresh_stores(args.url) as fresh:
        for _ in range(args.rounds):
            for name, style in STYLES.items():
                with fresh() as store:
                    figures[name].append(cycles_per_s(store, style, args.group, args.cycles))
    backend = "PostgreSQL" if args.url else "SQLite"
    print(f"{backend}, group {args.group}, {args.cycles} cycles × {args.rounds} rounds (median cycles/s)")
    first = statistics.median(next(iter(figures.values())))
    for name, values in figures.items():
        median = statistics.median(values)
        spread = ", ".join(f"{value:.0f}" for value in values)
        print(f"  {name:<42} {median:>8.0f}  {median / first:>5.2f} ×   ({spread})")


if __name__ == "__main__":
    main()
