"""``scheduler verify``: the catalog checks of ``scheduler.schema.catalog``, each run on its own.

``open_store`` stops at the first failed check; an operator wants every finding at once, so
the same check functions are run one by one and their errors collected. Every check is a read.
On PostgreSQL the checks are ``pg_catalog.verify_catalog``'s (tables, the ``migrations`` shape,
history, column shapes, the ``SCHEMA_VN_PG_FINGERPRINT``); the server keeps integrity and foreign
keys itself, so there is no ``quick_check``/``foreign_key_check`` step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from scheduler.backends import backend_named
from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema import catalog, pg_catalog
from scheduler.schema.ddl import PG_SCHEMA_FINGERPRINTS, SCHEDULER_STORE_SCHEMA_VERSION, SCHEMA_FINGERPRINTS
from scheduler.schema.sqlite_file import NOT_A_DATABASE, database_path, is_stray_file
from scheduler.schema.target import SchemaTarget, schema_target

Check = Callable[[Connection], object]


@dataclass(frozen=True)
class Finding:
    """One failed check: the check's name and the error it raised."""

    check: str
    code: str
    message: str
    details: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "code": self.code, "message": self.message, "details": self.details}


@dataclass(frozen=True)
class Verification:
    """Everything ``scheduler verify`` reports.

    ``version`` is the schema version the checks compared the file with; ``user_version`` is what
    the file itself says (``None``: SQLite could not read it at all). On PostgreSQL
    (``backend="postgresql"``) ``user_version`` is the version the ``migrations`` history
    records (``None``: the history could not be read).
    """

    version: int
    user_version: int | None
    fingerprint: str | None
    expected_fingerprint: str | None
    checks: list[str]
    findings: list[Finding]
    empty: bool = False
    backend: str = "sqlite"

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def schema_version(self) -> int | None:
        """The file's schema version when it is one the store knows (1..6), else ``None``."""
        return self.user_version if self.user_version in SCHEMA_FINGERPRINTS else None

    def describe(self) -> str:
        """What the file is, in a few words (the first line of the report)."""
        if self.user_version is None:
            return f"not a readable {backend_named(self.backend).place_description}"
        if self.schema_version is not None:
            return f"schema v{self.schema_version}"
        if self.empty:
            return "an empty database"
        known = f"not a scheduler schema version, checked as v{self.version}"
        return f"user_version {self.user_version} is {known}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "schemaVersion": self.schema_version,
            "userVersion": self.user_version,
            "checkedAs": None if self.user_version is None else self.version,
            "latestVersion": SCHEDULER_STORE_SCHEMA_VERSION,
            "fingerprint": self.fingerprint,
            "expectedFingerprint": self.expected_fingerprint,
            "checks": [
                {"name": name, "ok": all(finding.check != name for finding in self.findings)}
                for name in self.checks
            ],
            "findings": [finding.to_dict() for finding in self.findings],
        }


def _user_version(connection: Connection) -> int | None:
    """``PRAGMA user_version``, or ``None`` when SQLite cannot read the file's header."""
    try:
        return catalog.read_pragma_int(connection, "user_version")
    except DBAPIError:
        return None


def _version_to_verify(user_version: int | None) -> int:
    """The database's own version when it is a known one (1..6), else the current one."""
    return user_version if user_version in SCHEMA_FINGERPRINTS else SCHEDULER_STORE_SCHEMA_VERSION


def _shape_check(table: str, version: int, target: SchemaTarget) -> Check:
    return lambda connection: catalog._verify_table_shapes(connection, [table], version, target)


def _checks(version: int, present: list[str], target: SchemaTarget) -> list[tuple[str, Check]]:
    # The step functions are the ones verify_schema runs, in its order (see catalog.verify_schema).
    checks: list[tuple[str, Check]] = [
        ("integrity", lambda c: catalog.assert_database_integrity(c, target)),
        ("tables", lambda c: catalog._verify_tables(c, version, target)),
        ("identity", lambda c: catalog._verify_identity(c, version, target)),
    ]
    for name in (table for table in catalog.expected_tables(version) if table in present):
        checks.append((f"columns:{name}", _shape_check(name, version, target)))
    checks += [
        ("fingerprint", lambda c: catalog._verify_fingerprint(c, version, target)),
        ("migration-history", lambda c: catalog._verify_history(c, version, target)),
        ("indexes", lambda c: catalog._verify_indexes(c, version, target)),
        ("foreign-keys", lambda c: catalog._verify_foreign_keys(c, target)),
    ]
    return checks


def _run(name: str, check: Check, connection: Connection) -> Finding | None:
    try:
        check(connection)
    except SchedulerKernelError as error:
        return Finding(name, error.code, error.message, error.details)
    except DBAPIError as error:
        return Finding(name, catalog.SCHEMA_CORRUPT, f"check could not run: {error.orig}")
    return None


def _unreadable(version: int, reason: object) -> Verification:
    finding = Finding("integrity", catalog.SCHEMA_CORRUPT, f"not a readable SQLite database: {reason}")
    return Verification(version, None, None, SCHEMA_FINGERPRINTS.get(version), ["integrity"], [finding])


def _shared_version(connection: Connection, target: SchemaTarget) -> int | None:
    """A shared file's version: its ``migrations`` history (``None``: unreadable or unknown)."""
    try:
        return catalog.read_shared_version(connection, target)
    except SchedulerKernelError:
        return None


def verify_database(connection: Connection, *, exclusive: bool = True) -> Verification:
    """Run every catalog check against the version the database claims; collect the findings.

    An empty database gets only the integrity check and one finding saying it is empty; a file
    SQLite cannot read at all gets one integrity finding. A shared file (``exclusive=False``)
    claims the version its ``migrations`` history records, and only the scheduler's objects
    are checked (``scheduler.schema.catalog``).
    """
    target = schema_target(connection, None, exclusive)  # main: no query
    user_version = _user_version(connection) if exclusive else None
    path = database_path(connection, target)
    if path is not None and is_stray_file(path):  # SQLite reads it as an empty database
        return _unreadable(_version_to_verify(user_version), NOT_A_DATABASE)
    try:
        if not exclusive:
            user_version = _shared_version(connection, target)
        present = catalog.list_user_tables(connection, target)
        fingerprint = catalog.schema_fingerprint(connection, target)
    except DBAPIError as error:
        return _unreadable(_version_to_verify(user_version), error.orig)
    version = _version_to_verify(user_version)
    empty = not present
    checks = _checks(version, present, target)
    checks = checks[:1] if empty else checks
    names = [name for name, _ in checks]
    findings = [finding for name, check in checks if (finding := _run(name, check, connection))]
    if empty:
        names.append("tables")
        findings.append(
            Finding("tables", catalog.SCHEMA_UNKNOWN, "the database is empty (run `scheduler init`)")
        )
    return Verification(
        version=version,
        user_version=user_version,
        fingerprint=fingerprint,
        expected_fingerprint=SCHEMA_FINGERPRINTS.get(version),
        checks=names,
        findings=findings,
        empty=empty,
    )


def _pg_checks(version: int, present: list[str], where: SchemaTarget) -> list[tuple[str, Check]]:
    # pg_catalog.verify_catalog's steps, in its order.
    checks: list[tuple[str, Check]] = [
        ("tables", lambda c: pg_catalog.verify_tables(c, version, where)),
        ("columns:migrations", lambda c: pg_catalog.verify_shapes(c, ["migrations"], version, where)),
        ("migration-history", lambda c: pg_catalog.verify_history(c, version, where)),
    ]
    for name in catalog.expected_tables(version):
        if name in present and name != "migrations":
            checks.append((f"columns:{name}", _pg_shape_check(name, version, where)))
    checks.append(("fingerprint", lambda c: pg_catalog.verify_fingerprint(c, version, where)))
    return checks


def _pg_shape_check(table: str, version: int, where: SchemaTarget) -> Check:
    return lambda connection: pg_catalog.verify_shapes(connection, [table], version, where)


def verify_postgresql(connection: Connection, where: SchemaTarget) -> Verification:
    """:func:`verify_database` for a PostgreSQL schema: the version its history records (an
    unreadable or unknown history is one finding), then every check of that version."""
    try:
        recorded: int | None = pg_catalog.recorded_version(connection, where)
        history_finding = None
    except SchedulerKernelError as error:
        recorded = None
        history_finding = Finding("migration-history", error.code, error.message, error.details)
    version = _version_to_verify(recorded)
    present = pg_catalog.list_tables(connection, where)
    fingerprint = pg_catalog.fingerprint(connection, where)
    empty = recorded == 0 and not present
    if empty:
        checks: list[tuple[str, Check]] = []
        empty_message = "the schema is empty or absent (run `scheduler init`)"
        findings = [Finding("tables", catalog.SCHEMA_UNKNOWN, empty_message)]
    else:
        checks = _pg_checks(version, present, where)
        findings = [finding for name, check in checks if (finding := _run(name, check, connection))]
        if history_finding is not None and all(f.check != "migration-history" for f in findings):
            findings.append(history_finding)
    names = [name for name, _ in checks] or ["tables"]
    return Verification(
        version=version,
        user_version=recorded,
        fingerprint=fingerprint,
        expected_fingerprint=PG_SCHEMA_FINGERPRINTS.get(version),
        checks=names,
        findings=findings,
        empty=empty,
        backend="postgresql",
    )
