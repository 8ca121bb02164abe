"""The hand-tuned PostgreSQL statements of ``queries.sql``, loaded as :class:`Prepared` statements.

The statements are written as SQL, for a reviewer to read as SQL: a quiet claim's head probe and
lock (``claim_head``: :mod:`.claim_tactics`), a settle_and_claim's first statement
(``cycle_read``, ``cycle_read_window``: :mod:`.cycle_read`), the whole successful cycle in one
statement (``cycle``, ``cycle_window``: :mod:`.cycle_statement`), an enqueue of a new identity
with its lead lock (``enqueue``, ``enqueue_lock``: :mod:`.enqueue_statement`), and a quiet
``claim_next`` and a successful ``settle`` each in one statement (``claim``, ``claim_window``:
:mod:`.claim_statement`; ``settle``: :mod:`.settle_statement`). A ``{table}`` in the file is one
of the scheduler's tables; it is rendered as the compiler renders that table, so a store's
schema (``schema_translate_map``) applies to these statements as to every Core statement, on the
fast path and on SQLAlchemy's own execution alike.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, Final

from sqlalchemy import column, text
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import TextClause

from scheduler.schema import tables as t
from scheduler.store.plumbing.statement_plans import Prepared

_TABLES: Final = {
    table.name: table
    for table in (
        t.occurrences,
        t.jobs,
        t.events,
        t.occurrence_controls,
        t.occurrence_retries,
        t.adjudications,
        t.authority_reservations,
    )
}
_PLACEHOLDER: Final = re.compile(r"\{(\w+)\}")
_NAME: Final = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


class SchemaText(TextClause):
    """SQL text whose ``{table}`` placeholders name the scheduler's tables."""

    __visit_name__ = "scheduler_schema_text"
    inherit_cache = True


@compiles(SchemaText)
def _render(element: SchemaText, compiler: Any, **kw: Any) -> str:
    names = {name: compiler.preparer.format_table(table) for name, table in _TABLES.items()}
    rendered = _PLACEHOLDER.sub(lambda match: names[match.group(1)], element.text)
    return str(compiler.process(text(rendered), **kw))


def load(source: str) -> dict[str, str]:
    """The statements of a ``queries.sql`` text by name, without comments, on one line (the file
    has no ``--`` inside a string)."""
    parts = _NAME.split(source)
    statements: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        statement = " ".join(" ".join(line.split("--", 1)[0] for line in body.splitlines()).split())
        unknown = set(_PLACEHOLDER.findall(statement)) - set(_TABLES)
        if unknown:
            raise ValueError(f"{name}: not a scheduler table: {sorted(unknown)}")
        statements[name] = statement
    return statements


SQL: Final = load(resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8"))
"""Every statement of ``queries.sql`` by name, as written there."""

_OCCURRENCE: Final = t.OCCURRENCE_COLUMNS
_SETTLED: Final = (
    *_OCCURRENCE,
    "control_state",
    "control_expected_fence",
    "reservation_status",
    "reservation_policy_revision",
    "reservation_units",
    "adjudication_status",
    "adjudication_request_id",
    "row_version",
    "version_as_read",
    "server_now",
    "waited_us",
)
_PROBED: Final = (
    "arm",
    *_OCCURRENCE,
    "control_state",
    "control_expected_fence",
    "retry_request_id",
    "job_ok",
    "adjudication_request_id",
)
_READ: Final = (*("settled_" + name for name in _SETTLED), *_PROBED)
_CYCLE: Final = (
    "checked",
    "server_now",
    *("s_" + name for name in _OCCURRENCE),
    *("c_" + name for name in _OCCURRENCE),
    "c_previous_status",
    "c_position",
)
_CLAIM: Final = (
    "checked",
    "server_now",
    *("c_" + name for name in _OCCURRENCE),
    "c_previous_status",
    "c_position",
)
_SETTLE: Final = ("checked", "server_now", *("s_" + name for name in _OCCURRENCE))
LOCKED_PREFIX: Final = "locked_"
"""The columns of the head ``claim_head`` and ``cycle_read`` locked: ``locked_<column>``."""
_LOCKED: Final = (*(LOCKED_PREFIX + name for name in _OCCURRENCE), "head_plain")
_ENQUEUE: Final = (
    "checked",
    "server_now",
    *_OCCURRENCE,
    "job_authority_json",
    "job_payload_json",
    "job_trigger_json",
)
COLUMNS: Final = {
    "claim_head": (*_PROBED, *_LOCKED),
    "cycle_read": (*_READ, *_LOCKED),
    "cycle_read_window": _READ,
    "cycle": _CYCLE,
    "cycle_window": _CYCLE,
    "enqueue_lock": ("locked",),
    "enqueue": _ENQUEUE,
    "claim": _CLAIM,
    "claim_window": _CLAIM,
    "settle": _SETTLE,
}
"""Each statement's result columns, in order (``tests/backends/postgresql/test_postgresql_queries.py``
checks them against the server's)."""


def prepared(name: str, sql: str | None = None) -> Prepared:
    """The statement ``name`` (or ``sql`` in its place, with its result columns) to run."""
    statement = SchemaText(SQL[name] if sql is None else sql).columns(*(column(key) for key in COLUMNS[name]))
    # A claim read sees only rows claimable or sweepable at ``now`` and the row it locks itself,
    # so it may run before the writes a call keeps for later (``Tx.write_later``).
    return Prepared(statement, locks=True, passes_kept_writes=name == "claim_head")


CLAIM_HEAD: Final = prepared("claim_head")
CYCLE_READ: Final = prepared("cycle_read")
CYCLE_READ_WINDOW: Final = prepared("cycle_read_window")
CYCLE: Final = prepared("cycle")
CYCLE_WINDOW: Final = prepared("cycle_window")
ENQUEUE_LOCK: Final = prepared("enqueue_lock")
ENQUEUE: Final = prepared("enqueue")
CLAIM: Final = prepared("claim")
CLAIM_WINDOW: Final = prepared("claim_window")
SETTLE: Final = prepared("settle")


def filter_parameters(kinds: tuple[str, ...] | None, workspace_id: str | None) -> dict[str, Any]:
    """``:job_kinds`` and ``:workspace_id`` of a claim filter (``None``: any)."""
    return {"job_kinds": None if kinds is None else list(kinds), "workspace_id": workspace_id}
