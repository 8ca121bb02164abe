"""Replays a recorded trace of the original (``tests/fixtures/README.md`` §6) against this API.

Each recorded call is mapped to the Python method of API.md §5 (camelCase option objects become
keyword arguments), run with the clock set to the call's ``now`` and the recording's UUID
sequence, and its result (``to_dict()``) or error code compared with the recorded one. Finally
the database is reopened and ``scheduler.testing.dump_tables`` is compared with ``final_dump``.

Where the database lives is a :class:`ReplayBackend`; ``REPLAY_BACKENDS`` lists the ones the trace
tests run on: a SQLite file and a fresh PostgreSQL schema (event ids compared after dense
renumbering, API §8). A backend for another database adds itself there and gets every trace for free.
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from backends import POSTGRESQL, SQLITE, PostgresServer, configured_url, unique_name
from dump import HEADER, diff, dump
from recorded import FIXTURES, UNDEFINED, Undefined, decode

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.testing import dump_tables


class NotApplicable(Exception):
    """A recorded call that has no spelling in the Python API (JavaScript-only argument shapes)."""


# --------------------------------------------------------------------------- the database


class ReplayBackend(Protocol):
    """Where a replay keeps its database."""

    def prepare(self, trace: dict[str, Any]) -> None:
        """Start from an empty database (or the trace's ``initial_db``); ``NotApplicable`` if impossible."""

    def open(self, **options: Any) -> SchedulerStore:
        """``open_store`` on this backend's database with ``options`` (clock, uuid_factory, …)."""

    def header(self) -> dict[str, Any]:
        """The final dump's header fields this backend can read (``user_version`` …), or ``{}``."""

    def expected_tables(self, tables: dict[str, Any]) -> dict[str, Any]:
        """The recorded tables this backend is expected to hold."""

    def event_ranks(self, tables: dict[str, Any]) -> dict[int, int]:
        """Event id → the id to compare it as (``{}``: compare ids as they are)."""

    def cleanup(self) -> None:
        """Drop whatever ``prepare`` created."""


class SqliteFileBackend:
    """A SQLite file in a temporary directory (the recording's own backend)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "kernel.sqlite"

    def prepare(self, trace: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if trace.get("initial_db"):
            shutil.copyfile(FIXTURES / trace["initial_db"], self.path)

    def open(self, **options: Any) -> SchedulerStore:
        return open_store(self.path, **options)

    def header(self) -> dict[str, Any]:
        dumped = dump(self.path)
        return {key: dumped[key] for key in HEADER}

    def expected_tables(self, tables: dict[str, Any]) -> dict[str, Any]:
        return tables

    def event_ranks(self, tables: dict[str, Any]) -> dict[int, int]:
        return {}

    def cleanup(self) -> None:
        shutil.rmtree(self.path.parent, ignore_errors=True)


class PostgresSchemaBackend:
    """A fresh schema on the server of ``SCHEDULER_TEST_POSTGRES_URL``, dropped afterwards.

    Created by the trace's own first ``open_store`` (so the ``migrations`` rows carry the trace's
    clock, as in the recording). Compared as API §8 says: the recorded tables minus SQLite's
    ``sqlite_sequence``, no SQLite header, and event ids renumbered densely in id order (PostgreSQL
    may leave gaps after a rolled-back write). A trace that starts from a recorded SQLite file
    (``initial_db``) is ``NotApplicable``: a PostgreSQL schema cannot start from a SQLite file's bytes.
    """

    def __init__(self, _directory: Path) -> None:
        url = configured_url()
        if url is None:
            raise NotApplicable("no PostgreSQL server is configured")
        self.server = PostgresServer(url)
        self.schema = unique_name("t_replay")

    def prepare(self, trace: dict[str, Any]) -> None:
        if trace.get("initial_db"):
            self.server.dispose()
            raise NotApplicable(
                f"the trace starts from the recorded SQLite file {trace['initial_db']}; "
                "a PostgreSQL schema cannot start from a SQLite file's bytes"
            )

    def open(self, **options: Any) -> SchedulerStore:
        return open_store(self.server.engine, schema=self.schema, **options)

    def header(self) -> dict[str, Any]:
        return {}

    def expected_tables(self, tables: dict[str, Any]) -> dict[str, Any]:
        return {name: rows for name, rows in tables.items() if name != "sqlite_sequence"}

    def event_ranks(self, tables: dict[str, Any]) -> dict[int, int]:
        ids = sorted(row["event_id"] for row in tables.get("events", []))
        return {event_id: rank for rank, event_id in enumerate(ids, start=1)}

    def cleanup(self) -> None:
        self.server.drop_schema(self.schema)
        self.server.dispose()


REPLAY_BACKENDS: dict[str, Callable[[Path], ReplayBackend]] = {
    SQLITE: SqliteFileBackend,
    POSTGRESQL: PostgresSchemaBackend,
}
"""Backend name (``backends.SQLITE`` / ``backends.POSTGRESQL``) → factory taking a private temporary
directory. The trace tests run on each; ``conftest`` skips a ``postgresql`` one when no server is set."""


# --------------------------------------------------------------------------- recorded call → Python call

# Recorded method → (Python method, how the original took its arguments):
#   "options": f({...}) → f(**kw);  "positional": f(a, …) → f(a, …);
#   "id_options": f(a, {...}) → f(a, **kw);  "patch": updateJob(id, revision, patch) → f(id, revision, **kw)
METHODS: dict[str, tuple[str, str]] = {
    "createJob": ("create_job", "options"),
    "getJob": ("get_job", "positional"),
    "updateJob": ("update_job", "patch"),
    "enqueueOccurrence": ("enqueue_occurrence", "options"),
    "enqueueOccurrenceOncePerTrigger": ("enqueue_occurrence_once_per_trigger", "options"),
    "getOccurrence": ("get_occurrence", "positional"),
    "listOccurrencesByTrigger": ("list_occurrences_by_trigger", "options"),
    "claimNext": ("claim_next", "options"),
    "claimOccurrence": ("claim_occurrence", "options"),
    "renew": ("renew", "options"),
    "settle": ("settle", "options"),
    "history": ("history", "options"),
    "listDeadLetters": ("list_dead_letters", "options"),
    "schemaInfo": ("schema_info", "positional"),
    "setAuthorityPolicy": ("set_authority_policy", "id_options"),
    "getAuthorityPolicy": ("get_authority_policy", "positional"),
    "ensureAuthorityPolicy": ("ensure_authority_policy", "id_options"),
    "getAuthorityReservation": ("get_authority_reservation", "positional"),
    "reserveAuthority": ("reserve_authority", "options"),
    "getAdjudicationCase": ("get_adjudication_case", "positional"),
    "listAdjudicationCases": ("list_adjudication_cases", "options"),
    "getOccurrenceAdjudication": ("get_occurrence_adjudication", "positional"),
    "adjudicateOccurrence": ("adjudicate_occurrence", "options"),
    "prepareDomainMigration": ("prepare_domain_migration", "positional"),
    "applyDomainMigration": ("apply_domain_migration", "positional"),
    "verifyDomainMigration": ("verify_domain_migration", "id_options"),
    "beginDomainMigrationRetirement": ("begin_domain_migration_retirement", "positional"),
    "confirmDomainMigrationEntryRetired": ("confirm_domain_migration_entry_retired", "options"),
    "beginDomainMigrationRollback": ("begin_domain_migration_rollback", "positional"),
    "rollbackDomainMigrationTargets": ("rollback_domain_migration_targets", "positional"),
    "restoreDomainMigrationEntrySource": ("restore_domain_migration_entry_source", "options"),
    "confirmDomainMigrationEntrySourceRestored": (
        "confirm_domain_migration_entry_source_restored",
        "options",
    ),
    "getDomainMigration": ("get_domain_migration", "positional"),
    "listDomainMigrations": ("list_domain_migrations", "options"),
    "getActiveDomainMigrationBySource": ("get_active_domain_migration_by_source", "options"),
    "bindDomainMigrationSourceLocator": ("bind_domain_migration_source_locator", "options"),
    "getOccurrenceControl": ("get_occurrence_control", "positional"),
    "listRuntimeControlOccurrences": ("list_runtime_control_occurrences", "options"),
    "requestOccurrencePause": ("request_occurrence_pause", "options"),
    "ackOccurrencePause": ("ack_occurrence_pause", "options"),
    "resumeOccurrence": ("resume_occurrence", "options"),
    "requeueDeadLetter": ("requeue_dead_letter", "options"),
}

# Optional parameters whose Python default ``None`` means "not given" while the original rejects an
# explicit ``null``: a recorded ``null`` there has no Python spelling.
NULL_IS_NOT_ABSENT: dict[str, frozenset[str]] = {
    "claim_next": frozenset({"job_kind", "workspace_id"}),
    "history": frozenset({"occurrence_id", "job_id"}),
    "list_dead_letters": frozenset({"job_id"}),
    "settle": frozenset({"retry_at", "adjudication_request_id"}),
    "set_authority_policy": frozenset({"expected_revision"}),
    "request_occurrence_pause": frozenset({"expected_revision"}),
    "list_domain_migrations": frozenset({"state"}),
}
# Required parameters holding a JSON document, where ``null`` is a value: the original's absent key
# (``undefined``) cannot be passed as ``None``.
DOCUMENT_PARAMETERS = frozenset({"source"})


def snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def required_keywords(method: str) -> list[str]:
    """Keyword-only parameters without a default (API.md §5), read from the method's signature."""
    parameters = inspect.signature(getattr(SchedulerStore, method)).parameters.values()
    return [p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.default is p.empty]


def keywords(options: Any, method: str, *, destructured: bool = True) -> dict[str, Any]:
    """An options object as keyword arguments (a JS ``undefined``/absent key → validated like ``null``)."""
    if options is None or options is UNDEFINED:
        options = {}
    if not isinstance(options, dict):
        raise NotApplicable("the options argument is not an object")
    result = {snake_case(k): v for k, v in options.items() if not (destructured and v is UNDEFINED)}
    for name in NULL_IS_NOT_ABSENT.get(method, ()):
        if name in result and result[name] is None:
            raise NotApplicable(f"{name}=null is rejected by the original; Python's None means absent")
    for name in required_keywords(method):
        if name not in result:
            if name in DOCUMENT_PARAMETERS:
                raise NotApplicable(f"{name} absent: JavaScript undefined is not the JSON null")
            result[name] = None
    return result


def contains_undefined(value: Any) -> bool:
    if isinstance(value, Undefined):
        return True
    if isinstance(value, dict):
        return any(contains_undefined(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(contains_undefined(item) for item in value)
    return False


@dataclass(frozen=True)
class Invocation:
    method: str
    args: list[Any]
    kwargs: dict[str, Any]

    def __call__(self, store: SchedulerStore) -> Any:
        return getattr(store, self.method)(*self.args, **self.kwargs)


def invocation(op: str, recorded_args: list[Any]) -> Invocation:
    """The Python call for a recorded ``op`` with its positional ``args`` (README §6)."""
    if op not in METHODS:
        raise NotApplicable(f"unknown operation {op}")
    method, style = METHODS[op]
    args = [decode(a) for a in recorded_args]
    while args and args[-1] is UNDEFINED:  # a trailing undefined is an argument not passed
        args.pop()
    rest = args[1:2] if style == "id_options" else args[2:3] if style == "patch" else args[:1]
    if style == "positional":
        call = Invocation(method, args, {})
    elif style == "options":
        call = Invocation(method, [], keywords(rest[0] if rest else None, method))
    elif style == "id_options":
        call = Invocation(method, args[:1], keywords(rest[0] if rest else None, method))
    else:  # updateJob checks its patch with hasOwn: a present undefined is a present field
        call = Invocation(method, args[:2], keywords(rest[0] if rest else None, method, destructured=False))
    if contains_undefined(call.args) or contains_undefined(call.kwargs):
        raise NotApplicable("a present-but-undefined value has no Python spelling")
    return call


# --------------------------------------------------------------------------- comparing outcomes


def as_json(value: Any) -> Any:
    """A result as the JSON the original would print (records through ``to_dict()``)."""
    if hasattr(value, "to_dict"):
        return as_json(value.to_dict())
    if isinstance(value, dict):
        return {key: as_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json(item) for item in value]
    if value is None or isinstance(value, (str, int, float)):
        return value
    raise TypeError(f"a result of type {type(value).__name__} has no JSON form")


def first_difference(want: Any, got: Any, path: str = "$") -> str | None:
    """Where ``got`` first differs from the recorded ``want``; ``None`` when identical.

    Booleans are never numbers, and a float where the recording has an integer is a difference
    (the original prints integral numbers without a fraction).
    """
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got)):
            if key not in got:
                return f"{path}.{key}: missing"
            if key not in want:
                return f"{path}.{key}: unexpected key"
            found = first_difference(want[key], got[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return f"{path}: {len(want)} items expected, {len(got)} found"
        for index, (a, b) in enumerate(zip(want, got, strict=True)):
            found = first_difference(a, b, f"{path}[{index}]")
            if found:
                return found
        return None
    if _scalar_same(want, got):
        return None
    return f"{path}: expected {json.dumps(want)[:100]}, got {json.dumps(got, default=repr)[:100]}"


def _scalar_same(want: Any, got: Any) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return want is got
    if isinstance(want, float) and isinstance(got, int):  # a recorded ``100.0`` is the integer 100
        return want == got
    return type(want) is type(got) and want == got


def renumbered(value: Any, ranks: dict[int, int]) -> Any:
    """``value`` with every ``eventId`` replaced by its rank (no-op for an empty ``ranks``)."""
    if not ranks:
        return value
    if isinstance(value, dict):
        return {
            k: ranks.get(v, v) if k == "eventId" and isinstance(v, int) else renumbered(v, ranks)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [renumbered(item, ranks) for item in value]
    return value


def outcome_difference(call: dict[str, Any], result: Any, error: BaseException | None) -> str | None:
    """How a call's outcome differs from the recorded one (``None``: identical)."""
    where = f"#{call['seq']} {call['op']}"
    if "error" in call:
        want = call["error"]["code"]
        if isinstance(error, SchedulerKernelError) and error.code == want:
            recorded = call["error"].get("details")
            if recorded is not None and first_difference(recorded, as_json(error.details)):
                return f"{where}: details {first_difference(recorded, as_json(error.details))}"
            return None
        if want == "SCHEDULER_INVALID_ARGUMENT" and _is_python_argument_error(error):
            return None
        return f"{where}: expected {want}, got {_describe(error) if error else 'a result'}"
    if error is not None:
        return f"{where}: unexpected {_describe(error)}"
    if isinstance(call["result"], dict) and call["result"].get("$js") == "undefined":
        return None
    found = first_difference(call["result"], result)
    return None if found is None else f"{where}: {found}"


def _is_python_argument_error(error: BaseException | None) -> bool:
    """Python's own TypeError for an unknown keyword or a missing positional (API.md §2)."""
    text = str(error)
    return isinstance(error, TypeError) and ("unexpected keyword" in text or "positional argument" in text)


def _describe(error: BaseException) -> str:
    if isinstance(error, SchedulerKernelError):
        return f"{error.code} ({error.message[:80]})"
    return repr(error)[:160]


# --------------------------------------------------------------------------- the replay


@dataclass
class ReplayReport:
    """What a replay found: counts, per-call differences and final-dump differences."""

    applicable: int = 0
    identical: int = 0
    not_applicable: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    dump_problems: list[str] = field(default_factory=list)


class _Session:
    """The trace's clock, UUID sequence and current store."""

    def __init__(self, trace: dict[str, Any], backend: ReplayBackend) -> None:
        self.backend = backend
        self.now: int = trace.get("start_now", trace["calls"][0]["now"])
        self.issued = 0
        self.store: SchedulerStore | None = None

    def clock(self) -> int:
        return self.now

    def uuid(self) -> str:
        self.issued += 1
        return f"00000000-0000-4000-8000-{self.issued:012x}"

    def open(self, recorded_args: list[Any]) -> Any:
        options = {snake_case(k): v for k, v in (decode(recorded_args[0]) if recorded_args else {}).items()}
        options.setdefault("clock", self.clock)
        self.close()
        self.store = self.backend.open(uuid_factory=self.uuid, **options)
        return {"opened": True}

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def run(self, call: dict[str, Any]) -> tuple[Any, BaseException | None]:
        """The call's JSON result and error (one of them ``None``); ``NotApplicable`` propagates."""
        self.now = call["now"]
        try:
            if call["op"] == "openSchedulerStore":
                return self.open(call["args"]), None
            if call["op"] == "close":
                self.close()
                return None, None
            perform = invocation(call["op"], call["args"])
            if self.store is None:
                raise NotApplicable("no store is open")
            return as_json(perform(self.store)), None
        except NotApplicable:
            raise
        except Exception as error:
            return None, error


def replay(trace_path: Path, backend: ReplayBackend) -> ReplayReport:
    """Replay the trace at ``trace_path`` on ``backend``; see :class:`ReplayReport`."""
    trace = json.loads(trace_path.read_text(encoding="utf-8"))
    report = ReplayReport()
    backend.prepare(trace)
    session = _Session(trace, backend)
    outcomes: list[tuple[dict[str, Any], Any, BaseException | None]] = []
    try:
        for call in trace["calls"]:
            try:
                outcomes.append((call, *session.run(call)))
            except NotApplicable as reason:
                report.not_applicable.append(f"#{call['seq']} {call['op']}: {reason}")
        session.close()
        ranks = _compare_final_dump(trace, session, report)
    finally:
        session.close()
        backend.cleanup()
    for call, result, error in outcomes:
        report.applicable += 1
        problem = outcome_difference(call, renumbered(result, ranks), error)
        if problem is None:
            report.identical += 1
        else:
            report.failures.append(problem)
    return report


def _compare_final_dump(trace: dict[str, Any], session: _Session, report: ReplayReport) -> dict[int, int]:
    """Reopen the database, compare ``dump_tables`` (and the header) with ``final_dump``."""
    backend = session.backend
    session.now = trace.get("start_now", session.now)
    with backend.open(clock=session.clock, uuid_factory=session.uuid) as store:
        tables = dump_tables(store)
    ranks = backend.event_ranks(tables)
    for row in tables.get("events", []):
        row["event_id"] = ranks.get(row["event_id"], row["event_id"])
    header = backend.header()
    recorded = trace["final_dump"]
    expected = {key: recorded[key] for key in header}
    expected["tables"] = backend.expected_tables(recorded["tables"])
    report.dump_problems = diff(expected, {**header, "tables": tables})
    return ranks
