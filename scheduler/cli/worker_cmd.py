"""``scheduler worker MODULE:ATTR``: run a worker process until SIGTERM/SIGINT (exit 0)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

import typer

from scheduler.cli.common import (
    EXIT_USAGE,
    CliFailure,
    DbOption,
    JsonOption,
    command,
    resolve_target,
    write_store,
)
from scheduler.cli.reads import key_option
from scheduler.contract.constants import MAX_LEASE_MS
from scheduler.worker import RetryPolicy, Worker
from scheduler.worker.loading import load_handlers

_RECORD_FIELDS = ("event", "state", "occurrence", "job", "kind", "owner", "fence", "attempt", "duration_ms")


class JsonLines(logging.Formatter):
    """One JSON object per log record, with the structured ``extra`` fields the library sets."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in _RECORD_FIELDS:
            if hasattr(record, field):
                document[field] = getattr(record, field)
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False, default=str)


@contextmanager
def _logs_on_stderr(level: str, as_json: bool) -> Iterator[None]:
    """The ``scheduler`` loggers on stderr while the worker runs (restored afterwards)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonLines() if as_json else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logger = logging.getLogger("scheduler")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


Kinds = Annotated[
    str | None,
    typer.Option("--kinds", help="Comma-separated job kinds to claim (default: every handled kind)."),
]
LogLevel = Literal["debug", "info", "warning", "error"]


def _kinds(text: str) -> list[str]:
    """``--kinds a,b``: job kinds checked like the store checks them (at least one)."""
    selected = [key_option(kind, "jobKind", 128) or "" for kind in text.split(",") if kind.strip()]
    if not selected:
        raise CliFailure("--kinds names no job kind", exit_code=EXIT_USAGE, code="CLI_USAGE")
    return selected


@command
def worker_command(
    handlers: Annotated[str, typer.Argument(help="MODULE:ATTR naming a mapping of job kind to handler.")],
    db: DbOption = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, max=1000, help="Occurrences at once.")
    ] = 1,
    kinds: Kinds = None,
    lease_ms: Annotated[
        int, typer.Option("--lease-ms", min=1, max=MAX_LEASE_MS, help="Lease per claim (ms).")
    ] = 30_000,
    grace_ms: Annotated[
        int, typer.Option("--grace-ms", min=0, help="Shutdown grace period for in-flight work (ms).")
    ] = 30_000,
    retry_base_ms: Annotated[
        int, typer.Option("--retry-base-ms", min=0, help="First retry delay (ms).")
    ] = 1_000,
    retry_max_ms: Annotated[
        int, typer.Option("--retry-max-ms", min=0, help="Longest retry delay (ms).")
    ] = 300_000,
    missed_ticks: Annotated[
        Literal["latest", "all"],
        typer.Option("--missed-ticks", help="Periodic ticks missed during downtime."),
    ] = "latest",
    periodic: Annotated[
        bool, typer.Option("--periodic/--no-periodic", help="Fire periodic triggers.")
    ] = True,
    poll_min_ms: Annotated[
        int, typer.Option("--poll-min-ms", min=1, max=3_600_000, help="First idle poll delay (ms).")
    ] = 50,
    poll_max_ms: Annotated[
        int,
        typer.Option(
            "--poll-max-ms",
            min=1,
            max=3_600_000,
            help="Longest idle poll delay (ms); on PostgreSQL NOTIFY wakes idle workers sooner.",
        ),
    ] = 2_000,
    log_level: Annotated[LogLevel, typer.Option("--log-level", help="Level of the logs on stderr.")] = "info",
    as_json: JsonOption = False,
) -> None:
    """Run handlers for the occurrences of their job kinds until SIGTERM or SIGINT.

    On a signal the worker stops claiming, lets in-flight handlers finish within --grace-ms and
    exits 0 (a second signal ends the grace period). Logs go to stderr (--json: one JSON object per line).
    """
    selected = None if kinds is None else _kinds(kinds)  # option values first: a bad one exits 2
    mapping = load_handlers(handlers)
    with write_store(resolve_target(db)) as store:
        worker = Worker(
            store,
            mapping,
            concurrency=concurrency,
            lease_ms=lease_ms,
            kinds=selected,
            shutdown_grace_ms=grace_ms,
            retry=RetryPolicy(base_ms=retry_base_ms, max_ms=max(retry_base_ms, retry_max_ms)),
            missed_ticks=missed_ticks,
            periodic=periodic,
            poll_min_ms=poll_min_ms,
            poll_max_ms=max(poll_min_ms, poll_max_ms),
        )
        with _logs_on_stderr(log_level, as_json):
            worker.run()
