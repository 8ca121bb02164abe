"""Worker throughput: run N no-op occurrences through ``Worker.run_until_idle`` on a fresh WAL file.

Prints CPU and wall time per occurrence (one lane: claim, runtime read, handler, settle — one commit
per cycle when the store has ``settle_and_claim``). Usage:

    python -m benchmarks.bench_worker --occurrences 2000 --dir /tmp/scheduler-bench
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from scheduler import open_store
from scheduler.worker import Worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--occurrences", type=int, default=2_000)
    parser.add_argument("--dir", type=Path, default=None)
    options = parser.parse_args()
    base = options.dir or Path(tempfile.mkdtemp())
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = base / f"worker-bench-{time.time_ns()}.sqlite"
    with open_store(path) as store:
        store.create_job(id="noop", kind="noop", authority={"principal": {"type": "service", "id": "bench"}})
        keys = (f"k{n}" for n in range(options.occurrences))
        store.enqueue_many([{"job_id": "noop", "scheduled_for": 0, "trigger_key": key} for key in keys])
        worker = Worker(store, {"noop": lambda occurrence, ctx: None}, periodic=False)
        started_cpu, started = time.process_time(), time.perf_counter()
        ran = worker.run_until_idle()
        cpu, wall = time.process_time() - started_cpu, time.perf_counter() - started
    print(
        f"{ran} occurrences: {cpu / ran * 1e6:.0f} µs CPU and {wall / ran * 1e6:.0f} µs wall each "
        f"({ran / wall:.0f}/s wall, synchronous=FULL)"
    )


if __name__ == "__main__":
    main()
