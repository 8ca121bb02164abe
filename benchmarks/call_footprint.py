"""Which of the package's modules one store call runs code from, and how many lines they hold.

A reading aid for the code's structure, not a speed figure: after a warm-up, one ``claim_next``
and one ``settle_and_claim`` (a worker's cycle) run under ``sys.setprofile``, and every module of
``scheduler`` that a Python frame of the call belongs to is listed with its line count. Usage
(from a checkout's root; works on any commit, through the public API)::

    python -m benchmarks.call_footprint [--pg-url postgresql+psycopg://…] [--list]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import scheduler
from benchmarks.ab_checkouts import fill_noop_queue

ROOT = Path(scheduler.__file__).resolve().parent


def modules_run_by(call: Callable[[], Any]) -> set[Path]:
    """The package's source files with a frame in ``call``."""
    seen: set[Path] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            seen.add(Path(frame.f_code.co_filename))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return {path.resolve() for path in seen if path.resolve().is_relative_to(ROOT)}


def footprint(store: Any) -> dict[str, set[Path]]:
    fill_noop_queue(store, 10)
    held = store.claim_next(owner_id="w", lease_ms=60_000)
    held = store.settle_and_claim(
        occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=60_000
    ).claimed
    store.settle(occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded")
    result = {"claim_next": modules_run_by(lambda: store.claim_next(owner_id="w", lease_ms=60_000))}
    held = store.claim_next(owner_id="w", lease_ms=60_000)

    def cycle() -> None:
        store.settle_and_claim(
            occurrence_id=held.id, owner_id="w", fence=held.fence, outcome="succeeded", lease_ms=60_000
        )

    result["settle_and_claim"] = modules_run_by(cycle)
    return result


def report(backend: str, result: dict[str, set[Path]], listing: bool) -> None:
    for call, paths in result.items():
        lines = sum(len(path.read_text().splitlines()) for path in paths)
        print(f"{backend} {call}: {len(paths)} modules, {lines:,} lines")
        if listing:
            for path in sorted(paths):
                print(f"    {path.relative_to(ROOT.parent)}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg-url", default=None)
    parser.add_argument("--list", action="store_true", help="list the modules")
    options = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="footprint-"))
    with scheduler.open_store(directory / "f.sqlite") as store:
        report("sqlite", footprint(store), options.list)
    if options.pg_url:
        import sqlalchemy

        schema = f"footprint_{uuid.uuid4().hex[:12]}"
        try:
            with scheduler.open_store(options.pg_url, schema=schema) as store:
                report("postgresql", footprint(store), options.list)
        finally:
            engine = sqlalchemy.create_engine(options.pg_url)
            with engine.begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            engine.dispose()


if __name__ == "__main__":
    main()
