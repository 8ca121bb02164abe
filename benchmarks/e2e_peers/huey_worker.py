"""huey's own consumer: ``huey.create_consumer(workers=C, worker_type="thread")`` started in
this process over a ``SqliteHuey`` file, with a plain no-op task. ``fsync=True`` (huey's default
is ``False``, i.e. ``synchronous=NORMAL``), so its commits are as durable as the store's
(``synchronous=FULL``); WAL, as huey sets by default. Jobs are queued by calling the task, one
commit each (huey has no batch enqueue).

huey dequeues by deleting the row, so a job is complete when its handler returned: the drain
ends at the ``N``-th handler's return, and the consumer's graceful stop (which waits for its
scheduler thread's one-second tick) is not timed.
"""

from __future__ import annotations

import os
import time
from typing import Any

from huey import SqliteHuey

from benchmarks.e2e_peers.protocol import Countdown, Finished, Prepared, serve


def prepare(config: dict[str, Any]) -> Prepared:
    countdown = Countdown(config["jobs"])
    huey = SqliteHuey("e2e", filename=config["target"], fsync=True)

    @huey.task()
    def noop(i: int) -> None:
        countdown.hit()

    started = time.perf_counter()
    for i in range(config["jobs"]):
        noop(i)
    enqueue_s = time.perf_counter() - started
    consumer = huey.create_consumer(workers=config["concurrency"], worker_type="thread")

    def run() -> Finished:
        started = time.monotonic()
        consumer.start()
        countdown.done.wait()
        assert countdown.done_at is not None
        return Finished(started, countdown.done_at, countdown.count, countdown.done_at)

    def close() -> None:
        consumer.stop(graceful=True)
        huey.storage.close()

    return Prepared(enqueue_s, [os.getpid()], run, lambda: huey.storage.queue_size(), close)


if __name__ == "__main__":
    serve(prepare)
