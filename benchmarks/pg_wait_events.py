"""What the worker backends wait on while a load runs: sampled from ``pg_stat_activity``.

    python -m benchmarks.pg_contention --url postgresql+psycopg://root@127.0.0.1:5432/test \\
        --workers 4 --occurrences 12000 &
    sleep 9; python -m benchmarks.pg_wait_events --url postgresql://root@127.0.0.1:5432/test \\
        --prefix pg_contention_ --seconds 6

Every ``--interval-ms`` for ``--seconds``, reads the state and wait event of every client
backend whose ``application_name`` starts with ``--prefix`` (``pg_contention_`` for
``benchmarks/pg_contention.py``'s workers, ``bench_worker_`` for the bench's), and prints, for each
(state, wait event type, wait event), how many of those backends were in it per sample on
average: ``active`` with no wait event is running (on a CPU or waiting for one), ``Lock /
transactionid`` waits for another transaction's row lock, ``LWLock / WALWrite`` and ``IO /
WALSync`` wait for the WAL to be flushed at ``COMMIT``, ``idle / Client / ClientRead`` waits for
the client's next statement. The sampling connection costs a little CPU of its own (one
query per sample).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import psycopg

_SAMPLE = """
SELECT state, wait_event_type, wait_event FROM pg_stat_activity
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND application_name LIKE %(prefix)s
"""


def sample(url: str, prefix: str, seconds: float, interval_s: float) -> tuple[int, Counter[tuple[str, ...]]]:
    """The number of samples, and the backends seen in each (state, wait type, wait event)."""
    seen: Counter[tuple[str, ...]] = Counter()
    samples = 0
    pattern = {"prefix": prefix.replace("_", r"\_") + "%"}  # LIKE: "_" is a wildcard
    with psycopg.connect(url, autocommit=True) as connection:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            rows = connection.execute(_SAMPLE, pattern).fetchall()
            for row in rows:
                seen[tuple("-" if value is None else str(value) for value in row)] += 1
            samples += 1
            time.sleep(interval_s)
    return samples, seen


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="a libpq URL (postgresql://…)")
    parser.add_argument("--prefix", default="pg_contention_", help="application_name prefix of the backends")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--interval-ms", type=float, default=3.0)
    arguments = parser.parse_args()
    samples, seen = sample(arguments.url, arguments.prefix, arguments.seconds, arguments.interval_ms / 1000)
    print(f"{samples} samples; backends per sample by (state, wait event type, wait event):")
    for key, count in seen.most_common():
        print(f"  {count / max(samples, 1):5.2f}  {' / '.join(key)}")


if __name__ == "__main__":
    main()
