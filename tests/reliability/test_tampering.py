"""Tampered catalogs, hostile files and hostile values.

A tampered or hostile database is refused with the documented code and left byte-identical
(sha256 before/after, no sidecar left behind). Hostile values are rejected with
SCHEDULER_INVALID_ARGUMENT or stored inertly; every value reaches SQLite as a bound parameter.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorded import copy_reference
from sqlalchemy import create_engine

from scheduler import SchedulerKernelError, open_store
from scheduler.schema.catalog import schema_fingerprint

from .conftest import T0, current_scale
from .invariants import dump_database, file_sha256

pytestmark = pytest.mark.reliability

CORRUPT, UNKNOWN, INSECURE = (
    "SCHEDULER_SCHEMA_CORRUPT",
    "SCHEDULER_SCHEMA_UNKNOWN",
    "SCHEDULER_STORAGE_INSECURE",
)
INVALID = "SCHEDULER_INVALID_ARGUMENT"
AUTHORITY = {"principal": {"type": "user", "id": "tamper"}, "requestedCapabilities": ["run"]}
NOBODY = 65534
_TALLY: dict[str, int] = {}


def _populate(path: Path) -> None:
    store = open_store(path, clock=lambda: T0)
    store.create_job(id="job-a", kind="agenda", authority=AUTHORITY, payload={"p": "x" * 3000})
    for n in range(20):
        store.enqueue_occurrence(job_id="job-a", scheduled_for=T0 + n, trigger_key=f"t-{n}")
    store.close()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "store" / "kernel.sqlite"
    _populate(path)
    return path


@pytest.fixture
def database(template: Path, tmp_path: Path) -> Path:
    target = tmp_path / "store" / "kernel.sqlite"
    target.parent.mkdir(mode=0o700)
    shutil.copy(template, target)
    return target


def _raw(path: Path, *statements: str) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    try:
        for sql in statements:
            con.execute(sql)
    finally:
        con.close()


def _edit_schema(path: Path, name: str, old: str, new: str) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    try:
        (sql,) = con.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
        assert old in sql, f"{old!r} not in {name}"
        version = con.execute("PRAGMA schema_version").fetchone()[0]
        con.execute("PRAGMA writable_schema = ON")
        con.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (sql.replace(old, new), name))
        con.execute(f"PRAGMA schema_version = {version + 1}")
        con.execute("PRAGMA writable_schema = OFF")
    finally:
        con.close()


def _corrupt_page(path: Path) -> None:
    con = sqlite3.connect(path)
    (root,) = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'occurrences'").fetchone()
    (page_size,) = con.execute("PRAGMA page_size").fetchone()
    con.close()
    with path.open("r+b") as handle:
        handle.seek((root - 1) * page_size)
        handle.write(b"\xff" * 64)


def _broken_foreign_key(path: Path) -> None:
    _raw(
        path,
        "PRAGMA foreign_keys = OFF",
        "INSERT INTO events (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json)"
        " VALUES ('no-such-job', NULL, 'job_created', 1, NULL, NULL, '{}')",
    )


TAMPERINGS: dict[str, tuple[Callable[[Path], None], str]] = {
    "added_trigger": (
        lambda p: _raw(p, "CREATE TRIGGER evil AFTER INSERT ON jobs BEGIN SELECT 1; END"),
        CORRUPT,
    ),
    "added_view": (lambda p: _raw(p, "CREATE VIEW evil AS SELECT * FROM jobs"), CORRUPT),
    "added_index": (lambda p: _raw(p, "CREATE INDEX evil ON jobs(kind)"), CORRUPT),
    "added_scheduler_index": (lambda p: _raw(p, "CREATE INDEX scheduler_evil ON jobs(kind)"), CORRUPT),
    "added_table": (lambda p: _raw(p, "CREATE TABLE evil (x TEXT)"), UNKNOWN),
    "modified_check": (lambda p: _edit_schema(p, "occurrences", "attempt >= 0", "attempt >= -1"), CORRUPT),
    "modified_column_type": (
        lambda p: _edit_schema(p, "jobs", "kind            TEXT", "kind            BLOB"),
        CORRUPT,
    ),
    "added_column": (lambda p: _raw(p, "ALTER TABLE jobs ADD COLUMN evil TEXT"), CORRUPT),
    "renamed_column": (lambda p: _raw(p, "ALTER TABLE jobs RENAME COLUMN kind TO kind2"), CORRUPT),
    "dropped_index": (lambda p: _raw(p, "DROP INDEX scheduler_events_job"), CORRUPT),
    "foreign_application_id": (lambda p: _raw(p, "PRAGMA application_id = 1"), UNKNOWN),
    "unknown_user_version_7": (lambda p: _raw(p, "PRAGMA user_version = 7"), UNKNOWN),
    "unknown_user_version_99": (lambda p: _raw(p, "PRAGMA user_version = 99"), UNKNOWN),
    "migration_row_deleted": (lambda p: _raw(p, "DELETE FROM migrations WHERE version = 6"), UNKNOWN),
    "migration_row_added": (
        lambda p: _raw(p, "INSERT INTO migrations VALUES (7, 'evil', 'abc', 0)"),
        UNKNOWN,
    ),
    "migration_checksum": (
        lambda p: _raw(p, "UPDATE migrations SET checksum = 'x' || checksum WHERE version = 3"),
        UNKNOWN,
    ),
    "migration_name": (lambda p: _raw(p, "UPDATE migrations SET name = 'evil' WHERE version = 1"), UNKNOWN),
    "broken_foreign_key": (_broken_foreign_key, CORRUPT),
    "corrupted_page": (_corrupt_page, CORRUPT),
}


def _sidecars(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


def assert_refused_untouched(path: Path, code: str, opener: Callable[[], Any] | None = None) -> None:
    """Opening raises ``code``; the file's bytes and the directory's contents are unchanged."""
    before, sidecars = file_sha256(path), _sidecars(path)
    with pytest.raises(SchedulerKernelError) as caught:
        (opener or (lambda: open_store(path)))()
    assert caught.value.code == code, f"{caught.value.code}: {caught.value}"
    assert file_sha256(path) == before, "refused database was modified"
    assert _sidecars(path) == sidecars, "refused open left files behind"


@pytest.mark.parametrize("case", sorted(TAMPERINGS))
def test_tampered_catalog_is_refused_untouched(database: Path, case: str, figures: dict[str, Any]) -> None:
    tamper, code = TAMPERINGS[case]
    tamper(database)
    assert_refused_untouched(database, code)
    _TALLY[case] = 1
    figures["tampering"] = {"refused_untouched": len(_TALLY), "cases": sorted(_TALLY)}


@pytest.mark.parametrize("version", [1, 3, 5])
def test_tampered_old_version_is_not_upgraded(tmp_path: Path, version: int, figures: dict[str, Any]) -> None:
    path = tmp_path / "store" / "kernel.sqlite"
    path.parent.mkdir(mode=0o700)
    copy_reference(path.parent, version, path.name)
    _raw(path, "CREATE TRIGGER evil AFTER INSERT ON jobs BEGIN SELECT 1; END")
    assert_refused_untouched(path, CORRUPT)
    _TALLY[f"v{version}_with_trigger"] = 1
    figures["tampering"] = {"refused_untouched": len(_TALLY), "cases": sorted(_TALLY)}


# ----------------------------------------------------------------------------- hostile files


def _symlinked_file(database: Path) -> Path:
    link = database.parent / "link.sqlite"
    link.symlink_to(database)
    return link


def _symlinked_directory(database: Path) -> Path:
    link = database.parent.parent / "linked-dir"
    link.symlink_to(database.parent, target_is_directory=True)
    return link / database.name


def _foreign_directory(database: Path) -> Path:
    os.chown(database.parent, NOBODY, NOBODY)
    return database


def _open_directory(database: Path) -> Path:
    database.parent.chmod(0o777)
    return database


def _foreign_file(database: Path) -> Path:
    os.chown(database, NOBODY, NOBODY)
    return database


def _symlinked_wal(database: Path) -> Path:
    decoy = database.parent.parent / "decoy"
    decoy.write_bytes(b"")
    Path(f"{database}-wal").symlink_to(decoy)
    return database


HOSTILE_FILES: dict[str, Callable[[Path], Path]] = {
    "database_is_symlink": _symlinked_file,
    "directory_is_symlink": _symlinked_directory,
    "directory_owned_by_nobody": _foreign_directory,
    "directory_world_writable": _open_directory,
    "database_owned_by_nobody": _foreign_file,
    "wal_sidecar_is_symlink": _symlinked_wal,
}


@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
def test_hostile_file_is_refused_untouched(database: Path, case: str, figures: dict[str, Any]) -> None:
    if os.geteuid() != 0 and "nobody" in case:
        pytest.skip("changing ownership needs root")
    target = HOSTILE_FILES[case](database)
    before = file_sha256(database)
    modes = (database.stat().st_mode, database.parent.stat().st_mode)
    with pytest.raises(SchedulerKernelError) as caught:
        open_store(target)
    assert caught.value.code == INSECURE, f"{caught.value.code}: {caught.value}"
    assert file_sha256(database) == before
    assert (database.stat().st_mode, database.parent.stat().st_mode) == modes
    _TALLY[case] = 1
    figures["tampering"] = {"refused_untouched": len(_TALLY), "cases": sorted(_TALLY)}


# ----------------------------------------------------------------------------- hostile values


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    path = tmp_path / "store" / "kernel.sqlite"
    _populate(path)
    opened = open_store(path, clock=lambda: T0 + 10)
    yield opened
    opened.close()


CONTROL_STRINGS = ["a\x00b", "\x01", "tab\tinside", "line\nbreak", "del\x7f", "unit\x1fsep", "  \x1c  "]


def _identifier_calls(bad: str) -> list[Callable[[Any], Any]]:
    return [
        lambda s: s.create_job(id=bad, kind="agenda", authority=AUTHORITY),
        lambda s: s.create_job(id="ok", kind=bad, authority=AUTHORITY),
        lambda s: s.create_job(id="ok", kind="agenda", authority={"principal": {"type": "user", "id": bad}}),
        lambda s: s.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key=bad),
        lambda s: s.claim_next(owner_id=bad, lease_ms=1000),
        lambda s: s.claim_next(owner_id="w", lease_ms=1000, job_kind=bad),
        lambda s: s.get_job(bad),
        lambda s: s.history(job_id=bad),
        lambda s: s.update_job(bad, 1, enabled=False),
    ]


@pytest.mark.parametrize("bad", CONTROL_STRINGS, ids=repr)
def test_control_characters_are_rejected(store: Any, bad: str) -> None:
    path = Path(store.connection.engine.url.database)
    before = dump_database(path)
    for index, call in enumerate(_identifier_calls(bad)):
        with pytest.raises(SchedulerKernelError) as caught:
            call(store)
        assert caught.value.code == INVALID, f"call {index}: {caught.value.code}"
    assert dump_database(path) == before


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


OVERSIZE = "x" * (1024 * 1024)  # plus the two quotes: one byte over 1 MiB... and more


@pytest.mark.parametrize(
    "value",
    [OVERSIZE, {"k": OVERSIZE}, _nested(65), _nested(500), {"a": float("nan")}, {1: "non-str key"}],
    ids=["oversize_string", "oversize_object", "depth_65", "depth_500", "nan", "int_key"],
)
def test_hostile_json_is_rejected(store: Any, value: Any) -> None:
    path = Path(store.connection.engine.url.database)
    before = dump_database(path)
    calls: list[Callable[[], Any]] = [
        lambda: store.create_job(id="big", kind="agenda", authority=AUTHORITY, payload=value),
        lambda: store.create_job(id="big", kind="agenda", authority=AUTHORITY, trigger=value),
        lambda: store.update_job("job-a", 1, payload=value),
        lambda: store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="big", payload=value),
    ]
    for call in calls:
        with pytest.raises(SchedulerKernelError) as caught:
            call()
        assert caught.value.code == INVALID
    assert dump_database(path) == before


def test_json_at_the_limits_is_accepted(store: Any) -> None:
    exact = "x" * (1024 * 1024 - 2)  # the quotes make exactly 1 MiB
    job = store.create_job(id="limit", kind="agenda", authority=AUTHORITY, payload=exact, trigger=_nested(64))
    assert store.get_job("limit") == job
    assert job.payload == exact


META = "'\";%_\\[]*?()-- /**/ ;\u2028\u00a0DROP TABLE jobs; SELECT * FROM sqlite_master WHERE 1=1 OR ''='"
hostile_text = st.text(
    alphabet=st.sampled_from([*META, "é", "😀", "a", "0", "\x00", "\x1f"]), min_size=1, max_size=40
)
JS_SPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def _expected_identifier(value: str, max_length: int = 256) -> str | None:
    """What ``normalize_identifier`` must return (``None`` = must be rejected), per CONTRACT.md."""
    trimmed = value.strip(JS_SPACE)
    units = len(trimmed.encode("utf-16-le", "surrogatepass")) // 2
    bad = any(ord(c) <= 31 or ord(c) == 127 for c in trimmed)
    return trimmed if trimmed and units <= max_length and not bad else None


@settings(
    max_examples=current_scale().hostile_examples,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(job_id=hostile_text, kind=hostile_text, trigger=hostile_text, text=hostile_text)
def test_sql_metacharacters_are_stored_inertly(
    store: Any, job_id: str, kind: str, trigger: str, text: str
) -> None:
    path = Path(store.connection.engine.url.database)
    fingerprint = schema_fingerprint(store.connection)
    store.connection.commit()
    before = dump_database(path)
    payload = {text: [text, {"nested": text}]}
    want_id, want_kind = _expected_identifier(job_id), _expected_identifier(kind, 128)
    try:
        job = store.create_job(id=job_id, kind=kind, authority=AUTHORITY, payload=payload)
    except SchedulerKernelError as error:
        assert (
            error.code == INVALID
            if want_id is None or want_kind is None
            else error.code == "SCHEDULER_CONFLICT"
        )
        assert dump_database(path) == before
        return
    assert (job.id, job.kind, job.payload) == (want_id, want_kind, payload)
    assert store.get_job(job.id) == job
    want_trigger = _expected_identifier(trigger)
    if want_trigger is not None:
        occurrence = store.enqueue_occurrence(job_id=job.id, scheduled_for=T0, trigger_key=trigger)
        assert occurrence.trigger_key == want_trigger
        found = store.list_occurrences_by_trigger(job_id=job.id, trigger_key=trigger)
        assert [o.id for o in found] == [occurrence.id]
    after = dump_database(path)
    assert set(after) == set(before)
    assert [j for j in after["jobs"] if j["job_id"] != job.id] == before["jobs"]
    assert after["occurrences"][: len(before["occurrences"])] == before["occurrences"]
    assert schema_fingerprint(store.connection) == fingerprint
    store.connection.commit()
    for probe in ("%", "_", "*", "' OR '1'='1"):  # LIKE/GLOB wildcards and quotes match only themselves
        found = store.get_job(probe)
        assert found is None or found.id == probe


# ----------------------------------------------------------------------------- every value is bound


def _workflow(store: Any, marker: str) -> None:
    """Every kind of call, with ``marker`` inside every string value."""
    authority = {
        "principal": {"type": f"svc{marker}", "id": f"p-{marker}"},
        "workspaceId": f"ws-{marker}",
        "requestedCapabilities": [f"cap-{marker}"],
    }
    job = store.create_job(
        id=f"job-{marker}",
        kind=f"kind-{marker}",
        authority=authority,
        trigger={"k": marker},
        payload={"p": marker},
    )
    store.update_job(job.id, 1, payload={"q": marker})
    policy = store.ensure_authority_policy(authority)
    occurrence = store.enqueue_occurrence(job_id=job.id, scheduled_for=T0, trigger_key=f"tk-{marker}")
    store.enqueue_occurrence_once_per_trigger(job_id=job.id, scheduled_for=T0, trigger_key=f"tk-{marker}")
    store.list_occurrences_by_trigger(job_id=job.id, trigger_key=f"tk-{marker}")
    assert store.claim_next(owner_id=f"w-{marker}", lease_ms=5000, job_kind=f"other-{marker}") is None
    claimed = store.claim_next(
        owner_id=f"w-{marker}", lease_ms=5000, job_kind=job.kind, workspace_id=f"ws-{marker}"
    )
    assert claimed is not None and claimed.id == occurrence.id
    store.renew(occurrence_id=claimed.id, owner_id=f"w-{marker}", fence=claimed.fence, lease_ms=5000)
    store.reserve_authority(occurrence_id=claimed.id, policy_revision=policy.revision)
    store.settle(
        occurrence_id=claimed.id,
        owner_id=f"w-{marker}",
        fence=claimed.fence,
        outcome="failed",
        error={"code": f"E_{marker}", "message": marker},
        retryable=False,
    )
    store.requeue_dead_letter(
        occurrence_id=claimed.id,
        expected_fence=claimed.fence,
        expected_error_code=f"E_{marker}",
        request_id=f"rq-{marker}",
    )
    again = store.claim_occurrence(occurrence_id=claimed.id, owner_id=f"w-{marker}", lease_ms=5000)
    control = store.request_occurrence_pause(
        occurrence_id=again.id,
        expected_fence=again.fence,
        request_id=f"pr-{marker}",
        capability={"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint"]},
    )
    paused = store.ack_occurrence_pause(
        occurrence_id=again.id,
        owner_id=f"w-{marker}",
        fence=again.fence,
        request_id=f"pr-{marker}",
        expected_revision=control.revision,
        safe_point="adapter_checkpoint",
        checkpoint={"c": marker},
    )
    store.resume_occurrence(
        occurrence_id=again.id, expected_revision=paused.control.revision, request_id=f"rs-{marker}"
    )
    store.history(occurrence_id=again.id)
    store.history(job_id=job.id)
    store.list_dead_letters(job_id=job.id)
    store.get_occurrence_control(again.id)
    store.get_authority_reservation(again.id)
    store.get_adjudication_case(again.id)


def _recording_driver(seen: list[tuple[str, Any]]) -> type[sqlite3.Connection]:
    """A ``sqlite3.Connection`` class recording every SQL text and its parameters it is given.

    It observes what the driver actually executes: the statements SQLAlchemy runs and those the
    store runs on the DBAPI connection directly (its compile-once fast path, its PRAGMAs), which
    SQLAlchemy's ``before_cursor_execute`` event does not see.
    """

    class Cursor(sqlite3.Cursor):
        def execute(self, sql: str, parameters: Any = (), /) -> Any:
            seen.append((sql, parameters))
            return super().execute(sql, parameters)

        def executemany(self, sql: str, parameters: Any, /) -> Any:
            rows = list(parameters)
            seen.extend((sql, row) for row in rows)
            return super().executemany(sql, rows)

        def executescript(self, script: str, /) -> Any:
            seen.append((script, ()))
            return super().executescript(script)

    class Connection(sqlite3.Connection):
        def cursor(self, factory: Any = Cursor) -> Any:
            return super().cursor(factory)

        def execute(self, sql: str, parameters: Any = (), /) -> Any:
            return self.cursor().execute(sql, parameters)

        def executemany(self, sql: str, parameters: Any, /) -> Any:
            return self.cursor().executemany(sql, parameters)

        def executescript(self, script: str, /) -> Any:
            return self.cursor().executescript(script)

    return Connection


def _statements(tmp: Path, marker: str) -> tuple[set[str], list[Any]]:
    """(SQL texts, parameters) the driver received while the workflow ran with ``marker``."""
    path = tmp / marker / "kernel.sqlite"
    seen: list[tuple[str, Any]] = []
    engine = create_engine(f"sqlite:///{path}", connect_args={"factory": _recording_driver(seen)})
    try:
        store = open_store(engine, clock=lambda: T0)
        try:
            _workflow(store, marker)
        finally:
            store.close()
    finally:
        engine.dispose()
    return {sql for sql, _ in seen}, [parameters for _, parameters in seen]


def test_every_value_is_bound(tmp_path: Path, figures: dict[str, Any]) -> None:
    first, first_parameters = _statements(tmp_path, "QZXJ1")
    second, second_parameters = _statements(tmp_path, "WVKP2")
    # the recorder saw the workflow's values, as bound parameters
    assert any("QZXJ1" in repr(parameters) for parameters in first_parameters)
    assert any("WVKP2" in repr(parameters) for parameters in second_parameters)
    leaked = [sql for sql in first if "QZXJ1" in sql] + [sql for sql in second if "WVKP2" in sql]
    assert not leaked, f"values were spliced into SQL text: {leaked[:3]}"
    assert first == second, "the SQL text depends on the values (not bound)"
    figures["bound_parameters"] = {"distinct_statements": len(first), "values_in_sql_text": 0}
