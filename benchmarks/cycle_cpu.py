"""CPU per operation of the store's hot calls against the bench's raw-``sqlite3`` schema floor.

Runs ``--cycles`` operations of each loop on a temporary WAL database (``synchronous=FULL``, as
the bench) and prints the CPU (``time.process_time``) per operation in µs, store and floor side
by side, so ``store − floor`` is the library's own CPU:

* ``cycle``: ``claim_next`` + ``settle`` (two commits) vs the floor's two-commit cycle;
* ``one``: ``settle_and_claim`` (one commit) vs the floor's one-commit cycle;
* ``enqueue``: ``enqueue_occurrence`` vs the floor's two INSERTs.

``--only LOOP --side store|floor`` runs one loop alone (for ``valgrind --tool=callgrind``);
``--callgrind`` runs every loop under callgrind twice (``--cycles`` and a tenth of it) and prints
the instructions per operation of the difference, which removes start-up and the queue fill::

    python -m benchmarks.cycle_cpu --cycles 2000
    python -m benchmarks.cycle_cpu --callgrind --cycles 400

CPU figures move with the machine's load; instruction counts hardly do.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from benchmarks import schema_floor
from scheduler.bench.context import LEASE_MS
from scheduler.bench.depth import INSERT_EVENT, INSERT_OCCURRENCE, DepthBuilder, depth_job
from scheduler.bench.stores import enqueue_request, fill_queue, open_bench_store, settle_kwargs, wall_ms

OWNER: Final = "cycle-cpu"
LOOPS: Final = ("cycle", "one", "enqueue")
Loop = Callable[[int], Callable[[], None]]
"""Given the operation count: the set-up done, a callable that runs the measured operations."""


def _store_cycle(path: Path, count: int) -> Callable[[], None]:
    store = open_bench_store(path)
    fill_queue(store, "cycle", count)

    def run() -> None:
        for _ in range(count):
            claimed = store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS)
            store.settle(**settle_kwargs(claimed, OWNER))

    return run


def _store_one(path: Path, count: int) -> Callable[[], None]:
    store = open_bench_store(path)
    fill_queue(store, "one", count + 1)
    held = store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS)

    def run() -> None:
        nonlocal held
        for _ in range(count):
            held = store.settle_and_claim(**settle_kwargs(held, OWNER), lease_ms=LEASE_MS).claimed

    return run


def _store_enqueue(path: Path, count: int) -> Callable[[], None]:
    store = open_bench_store(path)
    base = wall_ms()

    def run() -> None:
        for index in range(count):
            store.enqueue_occurrence(**enqueue_request("enqueue", index, base))

    return run


def _floor_connection(path: Path, queued: int) -> tuple[Any, DepthBuilder]:
    store = open_bench_store(path)
    try:
        builder = DepthBuilder(path, depth_job(store), prefix="floor")
    finally:
        store.close()
    if queued:
        builder.add(queued)
    return schema_floor._connect(path), builder


def _floor_cycle(path: Path, count: int) -> Callable[[], None]:
    connection, _builder = _floor_connection(path, count)
    return lambda: [schema_floor._cycle(connection) for _ in range(count)] and None


def _floor_one(path: Path, count: int) -> Callable[[], None]:
    connection, _builder = _floor_connection(path, count + 1)
    connection.execute("BEGIN IMMEDIATE")
    held = schema_floor._claim_rows(connection, wall_ms())
    connection.execute("COMMIT")

    def run() -> None:
        nonlocal held
        for _ in range(count):
            held = schema_floor._one_commit_cycle(connection, held)

    return run


def _floor_enqueue(path: Path, count: int) -> Callable[[], None]:
    connection, builder = _floor_connection(path, 0)

    def run() -> None:
        for index in range(count):
            occurrences, events = builder.rows(index, index + 1, wall_ms())
            connection.execute("BEGIN IMMEDIATE")
            connection.execute(INSERT_OCCURRENCE, occurrences[0])
            connection.execute(INSERT_EVENT, events[0])
            connection.execute("COMMIT")

    return run


SIDES: Final[dict[str, dict[str, Loop]]] = {
    "store": {"cycle": _store_cycle, "one": _store_one, "enqueue": _store_enqueue},
    "floor": {"cycle": _floor_cycle, "one": _floor_one, "enqueue": _floor_enqueue},
}


def cpu_us_per_op(loop: str, side: str, count: int) -> float:
    """Set up ``loop`` on a fresh database, run it; CPU µs per operation of the run alone."""
    with tempfile.TemporaryDirectory(prefix="cycle-cpu-") as scratch:
        run = SIDES[side][loop](Path(scratch) / "cpu.sqlite", count)
        started = time.process_time()
        run()
        return (time.process_time() - started) * 1e6 / count


def _instructions(loop: str, side: str, count: int) -> int:
    """Instructions callgrind counts for one whole process running ``loop`` (``count`` ops)."""
    with tempfile.TemporaryDirectory(prefix="cycle-cpu-cg-") as scratch:
        out = Path(scratch) / "callgrind.out"
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            sys.executable, __file__, "--only", loop, "--side", side, "--cycles", str(count),
        ]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True)
        match = re.search(r"^summary:\s*(\d+)", out.read_text(), re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no summary line in {out}")
        return int(match.group(1))


def instructions_per_op(loop: str, side: str, count: int) -> float:
    short = max(1, count // 10)
    return (_instructions(loop, side, count) - _instructions(loop, side, short)) / (count - short)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000, help="operations per loop")
    parser.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS))
    parser.add_argument("--only", choices=LOOPS, help="run this loop alone, print nothing")
    parser.add_argument("--side", choices=tuple(SIDES), default="store")
    parser.add_argument("--callgrind", action="store_true", help="instructions per op under callgrind")
    args = parser.parse_args(argv)
    if args.only:
        cpu_us_per_op(args.only, args.side, args.cycles)
        return
    measure = instructions_per_op if args.callgrind else cpu_us_per_op
    unit = "M instructions/op" if args.callgrind else "CPU µs/op"
    scale = 1e-6 if args.callgrind else 1.0
    print(f"{'loop':<10} {'store':>10} {'floor':>10} {'store-floor':>12}   ({unit}, {args.cycles} ops)")
    for loop in args.loops:
        store, floor = (measure(loop, side, args.cycles) * scale for side in ("store", "floor"))
        print(f"{loop:<10} {store:>10.3f} {floor:>10.3f} {store - floor:>+12.3f}")


if __name__ == "__main__":
    main()
