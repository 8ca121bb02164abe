"""The adapter's side of ``e2e_workers`` (standard library only: imported from every peer's venv).

The driver starts ``python -m benchmarks.e2e_peers.NAME '<json config>'`` and the adapter answers
one JSON line per step on the original stdout (everything a library prints goes to stderr):

1. it makes a fresh store, enqueues ``jobs`` no-op jobs (timed apart) and builds its worker, then
   says ``{"ready": true, "enqueue_s", "pids"}`` (every process that will run jobs);
2. on ``go`` it starts the worker and says ``{"wall_s", "handled", "tail_s"}`` once all jobs were
   handled and their outcomes committed (``tail_s``: from the last handler's return to that point);
3. on ``check`` (after the driver read the processes' CPU) it counts the jobs not completed,
   closes everything and says ``{"remaining"}``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO


class Countdown:
    """Counts handled jobs; ``done`` is set (and ``done_at`` noted) when the ``n``-th one is."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self.done_at: float | None = None
        self.done = threading.Event()
        self._lock = threading.Lock()

    def hit(self) -> None:
        with self._lock:
            self.count += 1
            if self.count == self.n:
                self.done_at = time.monotonic()
                self.done.set()


@dataclass(frozen=True)
class Finished:
    """One drain: ``monotonic`` instants (system-wide, comparable across processes)."""

    started: float
    ended: float
    handled: int
    last_handled: float | None


@dataclass(frozen=True)
class Prepared:
    """A store with the jobs queued and a worker ready to start."""

    enqueue_s: float
    pids: list[int]
    run: Callable[[], Finished]
    remaining: Callable[[], int]
    close: Callable[[], None]


def stop_when(event: threading.Event, stop: Callable[[], Any]) -> threading.Thread:
    """A daemon thread that calls ``stop()`` once ``event`` is set."""

    def watch() -> None:
        event.wait()
        stop()

    thread = threading.Thread(target=watch, name="e2e-stop-when-done", daemon=True)
    thread.start()
    return thread


def _protocol_stream() -> TextIO:
    """The original stdout for the protocol; fd 1 becomes stderr for everything else (libraries,
    C extensions and child processes), so nothing else can write a protocol line."""
    stream = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(2, 1)
    return stream


def _expect(word: str) -> None:
    line = sys.stdin.readline().strip()
    if line != word:
        raise SystemExit(f"expected {word!r} from the driver, got {line!r}")


def serve(prepare: Callable[[dict[str, Any]], Prepared]) -> None:
    """Run the three steps for ``prepare`` (the adapter's function) with the config of argv[1]."""
    out = _protocol_stream()

    def say(**fields: Any) -> None:
        out.write(json.dumps(fields) + "\n")

    config = json.loads(sys.argv[1])
    prepared = prepare(config)
    say(ready=True, enqueue_s=prepared.enqueue_s, pids=prepared.pids)
    _expect("go")
    finished = prepared.run()
    tail = None if finished.last_handled is None else finished.ended - finished.last_handled
    say(wall_s=finished.ended - finished.started, handled=finished.handled, tail_s=tail)
    _expect("check")
    remaining = prepared.remaining()
    prepared.close()
    say(remaining=remaining)
