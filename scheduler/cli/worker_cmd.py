"""``scheduler worker MODULE:ATTR``: run a worker process until SIGTERM/SIGINT (exit 0).

``MODULE:ATTR`` names a mapping of job kind to handler (API §9), or a ``Tasks`` object (API §10),
whose tasks it runs: the queues of ``Tasks(queues=…)`` in that order, then the other queues of its
tasks alphabetically, or ``--queues a,b`` (claimed in that strict order). A ``Tasks`` worker uses
the ``Tasks`` object's own database unless ``--db`` names another.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Annotated, Any, Literal

import typer

from scheduler.cli.common import (
    EXIT_USAGE,
    CliFailure,
    DbOption,
    JsonOption,
    command,
    explicit_db,
    resolve_target,
    write_store,
)
from scheduler.cli.reads import key_option
from scheduler.contract.constants import MAX_LEASE_MS
from scheduler.contract.errors import invalid_argument
from scheduler.tasks import Tasks
from scheduler.worker import RetryPolicy, Worker
from scheduler.worker.loading import load_attribute

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
Queues = Annotated[
    str | None,
    typer.Option(
        "--queues",
        help="For a Tasks object: comma-separated queues, claimed in this strict order "
        "(default: Tasks(queues=...) order, then the others alphabetically).",
    ),
]
LogLevel = Literal["debug", "info", "warning", "error"]


def _kinds(text: str, option: str = "--kinds") -> list[str]:
    """``--kinds a,b`` / ``--queues a,b``: job kinds checked like the store checks them (at least one)."""
    selected = [key_option(kind, "jobKind", 128) or "" for kind in text.split(",") if kind.strip()]
    if not selected:
        raise CliFailure(f"{option} names no job kind", exit_code=EXIT_USAGE, code="CLI_USAGE")
    return selected


def _usage(message: str) -> CliFailure:
    return CliFailure(message, exit_code=EXIT_USAGE, code="CLI_USAGE")


@command
def worker_command(
    handlers: Annotated[
        str, typer.Argument(help="MODULE:ATTR naming a mapping of job kind to handler, or a Tasks object.")
    ],
    db: DbOption = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, max=1000, help="Occurrences at once.")
    ] = 1,
    kinds: Kinds = None,
    queues: Queues = None,
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
    settle_batch_ms: Annotated[
        int,
        typer.Option(
            "--settle-batch-ms",
            min=0,
            max=1_000,
            help="With --concurrency above 1: longest a finished run waits to be settled with others (ms).",
        ),
    ] = 20,
    log_level: Annotated[LogLevel, typer.Option("--log-level", help="Level of the logs on stderr.")] = "info",
    as_json: JsonOption = False,
) -> None:
    """Run handlers (or a Tasks object's tasks) for their job kinds (queues) until SIGTERM or SIGINT.

    On a signal the worker stops claiming, lets in-flight handlers finish within --grace-ms and
    exits 0 (a second signal ends the grace period). Logs go to stderr (--json: one JSON object per line).
    """
    selected = None if kinds is None else _kinds(kinds)  # option values first: a bad one exits 2
    ordered = None if queues is None else _kinds(queues, "--queues")
    target = load_attribute(handlers)
    if isinstance(target, Tasks):
        if selected is not None:
            raise _usage("--kinds is for a handlers mapping: a Tasks object takes --queues")
    elif isinstance(target, Mapping):
        if ordered is not None:
            raise _usage("--queues is for a Tasks object: a handlers mapping takes --kinds")
    else:
        raise invalid_argument(f"{handlers} is neither a mapping of job kind to handler nor a Tasks object")
    options: dict[str, Any] = {
        "concurrency": concurrency,
        "lease_ms": lease_ms,
        "shutdown_grace_ms": grace_ms,
        "retry": RetryPolicy(base_ms=retry_base_ms, max_ms=max(retry_base_ms, retry_max_ms)),
        "missed_ticks": missed_ticks,
        "periodic": periodic,
        "poll_min_ms": poll_min_ms,
        "poll_max_ms": max(poll_min_ms, poll_max_ms),
        "settle_batch_ms": settle_batch_ms,
    }
    with ExitStack() as stack:
        if isinstance(target, Tasks):
            chosen = explicit_db(db)
            # --db without --schema: the Tasks object's own schema (its runs are deferred there)
            store = (
                None
                if chosen is None
                else stack.enter_context(write_store(resolve_target(chosen), default_schema=target.schema))
            )
            worker: Worker = target.worker(ordered, store=store, **options)
        else:
            store = stack.enter_context(write_store(resolve_target(db)))
            worker = Worker(store, target, kinds=selected, **options)
        with _logs_on_stderr(log_level, as_json):
            worker.run()
