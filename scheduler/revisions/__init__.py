"""The scheduler's Alembic revisions, shipped in the package and mountable as a branch.

``versions/`` holds revisions ``v1`` … ``v6`` (branch label ``scheduler``). Each runs one step
of ``scheduler.schema.upgrade`` through :func:`upgrade_to`, so ``alembic upgrade`` gives the
same database as ``open_store``. A host application mounts them with one line in its own
``alembic.ini``::

    version_locations = %(here)s/migrations/versions scheduler:revisions/versions

(or ``scheduler.alembic_version_location()`` in ``env.py``), then ``alembic upgrade heads``.

Where the tables go, for a mounted revision (API §8):

* schema: ``config.attributes["scheduler.schema"]``, else ``-x scheduler_schema=NAME``, else the
  default (SQLite ``main``; PostgreSQL ``scheduler``);
* exclusive (SQLite): ``config.attributes["scheduler.exclusive"]``, else
  ``-x scheduler_exclusive=true|false``, else ``False`` for ``main`` (the host's own
  ``alembic_version`` and tables share the file) and ``True`` for an attached database;
* ``now`` (epoch ms for ``migrations.applied_at`` and the v2 backfill): the repository
  environment's ``-x now=``, else ``config.attributes["scheduler.now"]``, else
  ``-x scheduler_now=``, else the wall clock.

The ``migrations`` table is the record of truth: revision vN on a database whose history
already records vN does nothing; on one whose history is not v(N-1) or later (``alembic_version``
and ``migrations`` disagree) it is refused with a message saying both. Downgrades are refused
(the original has none). Offline (``--sql``) a revision prints its step as
``scheduler.schema.offline`` scripts it, with run-time guards, or refuses what a script cannot do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from alembic import op
from alembic.runtime.migration import MigrationContext, MigrationInfo
from alembic.util import CommandError
from sqlalchemy import Connection

from scheduler.backends import backend_for, backend_named, is_supported
from scheduler.contract.errors import SchedulerKernelError
from scheduler.schema import offline, pg_ddl
from scheduler.schema.catalog import verify_catalog
from scheduler.schema.target import SchemaTarget, schema_target
from scheduler.schema.upgrade import (
    LATEST_VERSION,
    apply_step,
    inspect_database,
    validate_now,
    wall_clock_ms,
)

BRANCH_LABEL: Final = "scheduler"
SCHEMA_ATTRIBUTE: Final = "scheduler.schema"
EXCLUSIVE_ATTRIBUTE: Final = "scheduler.exclusive"
NOW_ATTRIBUTE: Final = "scheduler.now"
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})

log = logging.getLogger("scheduler.revisions")


def version_location() -> str:
    """The directory of the revisions ``v1`` … ``v6`` (for ``version_locations``)."""
    return str(Path(__file__).resolve().parent / "versions")


@dataclass(frozen=True)
class RevisionSettings:
    """Where and when a revision runs: ``schema``/``exclusive`` as for ``open_store``, ``now`` in ms."""

    schema: str | None
    exclusive: bool | None
    now: int

    def resolve_exclusive(self, dialect: str) -> bool:
        """As given, else: a backend whose store lives in a schema of its own is always exclusive;
        SQLite's is unless the store lives in an attached database (``schema`` other than ``main``)."""
        if self.exclusive is not None:
            return self.exclusive
        if is_supported(dialect) and not backend_named(dialect).own_schema:
            return self.schema is not None and self.schema.lower() != "main"
        return True


def _parse_bool(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise CommandError(f"{name} must be true or false, not {value!r}")


def _parse_now(value: object, name: str) -> int:
    try:
        if isinstance(value, str):
            if not (value.isascii() and value.isdigit()):
                raise ValueError(value)
            value = int(value)
        return validate_now(value)
    except (ValueError, SchedulerKernelError) as cause:
        raise CommandError(
            f"{name} must be a non-negative integer epoch in milliseconds: {value!r}"
        ) from cause


def settings_from(
    attributes: dict[str, Any], x_arguments: dict[str, str], arguments: dict[str, Any]
) -> RevisionSettings:
    """Resolve the settings from ``run_migrations`` keyword ``arguments``, ``config.attributes``
    and ``-x`` arguments (see the module docstring for the precedence)."""
    schema = attributes.get(SCHEMA_ATTRIBUTE) or x_arguments.get("scheduler_schema") or None
    exclusive: bool | None = None
    for source, value in (
        ("exclusive", arguments.get("exclusive")),
        (EXCLUSIVE_ATTRIBUTE, attributes.get(EXCLUSIVE_ATTRIBUTE)),
        ("-x scheduler_exclusive", x_arguments.get("scheduler_exclusive")),
    ):
        if value is not None:
            exclusive = _parse_bool(value, source)
            break
    now = wall_clock_ms()
    for source, value in (
        ("now", arguments.get("now")),
        (NOW_ATTRIBUTE, attributes.get(NOW_ATTRIBUTE)),
        ("-x scheduler_now", x_arguments.get("scheduler_now")),
    ):
        if value is not None:
            now = _parse_now(value, source)
            break
    return RevisionSettings(None if schema is None else str(schema), exclusive, now)


def settings_for(context: MigrationContext, arguments: dict[str, Any]) -> RevisionSettings:
    """The settings of the revision running in ``context``."""
    attributes: dict[str, Any] = context.config.attributes if context.config is not None else {}
    environment = context.environment_context
    x_arguments: dict[str, str] = (
        environment.get_x_argument(as_dictionary=True) if environment is not None else {}
    )
    return settings_from(attributes, x_arguments, arguments)


def _command_error(error: SchedulerKernelError) -> CommandError:
    failure = CommandError(f"{error.code}: {error.message}")
    failure.__cause__ = error
    return failure


# ----------------------------------------------------------------- online


def begin_write_transaction(connection: Connection, target: SchemaTarget) -> None:
    """SQLite: make sure a real transaction is open, taking the write lock up front.

    Alembic's SQLite environments run DDL with pysqlite's default handling, which opens no
    transaction before DDL; the step (and Alembic's ``alembic_version`` row after it) then runs
    inside this ``BEGIN IMMEDIATE`` and commits with Alembic's own commit.
    """
    if backend_for(connection).lazy_read_begin is None:
        return  # the driver's transactions begin with its first statement, DDL too
    driver: Any = connection.connection.dbapi_connection
    if getattr(driver, "in_transaction", True) is False:
        driver.execute("BEGIN IMMEDIATE").close()


def _mismatch(version: int, recorded: int) -> CommandError:
    return CommandError(
        f"The scheduler's alembic_version and its migrations table disagree: Alembic is about to "
        f"run revision v{version} (so it believes the database is at v{version - 1}), but the "
        f"migrations table records v{recorded}. The migrations table is the record of truth; "
        f"nothing was changed. Restore the matching backup, or point alembic_version at "
        f"v{recorded} (`alembic stamp scheduler@{'base' if recorded == 0 else f'v{recorded}'}`) "
        "and upgrade again."
    )


def apply_online(connection: Connection, version: int, settings: RevisionSettings) -> bool:
    """Run step ``version`` unless the ``migrations`` history already records it; True if applied."""
    try:
        target = schema_target(
            connection, settings.schema, settings.resolve_exclusive(connection.dialect.name)
        )
        begin_write_transaction(connection, target)
        if target.own_schema:
            pg_ddl.lock_schema(connection, target)
        recorded = inspect_database(connection, schema=target.schema, exclusive=target.exclusive)
        if recorded >= version:
            if recorded == LATEST_VERSION:
                verify_catalog(connection, LATEST_VERSION, schema=target.schema, exclusive=target.exclusive)
            log.info("scheduler v%d is already recorded in the migrations table: nothing to do", version)
            return False
        if recorded != version - 1:
            raise _mismatch(version, recorded)
        apply_step(connection, version, settings.now, schema=target.schema, exclusive=target.exclusive)
        verify_catalog(connection, version, schema=target.schema, exclusive=target.exclusive)
        return True
    except SchedulerKernelError as error:
        raise _command_error(error) from error


# ----------------------------------------------------------------- offline


def _sqlite_wraps_itself(context: MigrationContext) -> bool:
    """Whether Alembic emits BEGIN/COMMIT around this revision's output on its own."""
    return bool(context.impl.transactional_ddl)


def emit_offline(context: MigrationContext, version: int, settings: RevisionSettings) -> None:
    """Print step ``version`` as guarded SQL (no database is read), or refuse with nothing printed."""
    dialect = context.dialect.name
    try:
        target = offline.offline_target(dialect, settings.schema, settings.resolve_exclusive(dialect))
        statements = offline.upgrade_statements(target, version - 1, settings.now, version)
    except SchedulerKernelError as error:
        raise _command_error(error) from error
    impl = context.impl
    own_transaction = not target.own_schema and not _sqlite_wraps_itself(context)
    lines = [target.flavour.script_preamble]
    if own_transaction:
        lines.append("BEGIN IMMEDIATE" + impl.command_terminator)
    lines += [statement + impl.command_terminator for statement in statements]
    if own_transaction:
        lines.append("COMMIT" + impl.command_terminator)
    for line in lines:
        impl.static_output(line)


# ----------------------------------------------------------------- revision entry points


def upgrade_to(version: int, **arguments: Any) -> None:
    """Body of revision ``v<version>``'s ``upgrade()`` (online or offline)."""
    context = op.get_context()
    settings = settings_for(context, arguments)
    if context.as_sql:
        emit_offline(context, version, settings)
    else:
        apply_online(op.get_bind(), version, settings)


def refuse_downgrade(version: int) -> None:
    """Body of every ``downgrade()``: the original has no downgrades."""
    raise CommandError(
        f"The scheduler schema is forward-only: v{version} cannot be downgraded (the original has "
        "no downgrades; restore a backup instead). Nothing was changed."
    )


VERSIONS_DIRECTORY: Final = Path(__file__).resolve().parent / "versions"
_OWN_IDS: Final = frozenset(f"v{n}" for n in range(1, LATEST_VERSION + 1))


def _scheduler_lineage(script: Any, revision_ids: tuple[str, ...]) -> frozenset[str]:
    """The scheduler's revisions among ``revision_ids`` and everything they descend from or
    depend on (a host revision that merges or depends on ``scheduler@v6`` carries v1…v6)."""
    found: set[str] = set()
    for revision_id in revision_ids:
        for revision in script.iterate_revisions(revision_id, "base"):
            if Path(revision.path).resolve().parent == VERSIONS_DIRECTORY:
                found.add(revision.revision)
    return frozenset(found)


def refuse_stamp(
    ctx: MigrationContext, step: MigrationInfo, heads: set[str], run_args: dict[str, Any]
) -> None:
    """An ``on_version_apply`` hook refusing an ``alembic stamp`` that moves the scheduler branch.

    A stamp would change only ``alembic_version``; the scheduler's version is its
    ``migrations`` table. The stamp is judged on the scheduler's revisions only: it is refused
    when the scheduler revisions it records (the stamped revisions and what they descend from or
    depend on) differ from those it replaces. So ``stamp scheduler@v3`` is refused, while
    stamping a host revision is allowed, including one that merges or depends on the scheduler's
    head already recorded. (``stamp --purge`` empties ``alembic_version`` before any step and
    is not seen; the ``migrations`` table still holds the truth.) The repository environment
    installs it; a host environment may pass it to ``context.configure(on_version_apply=[...])``.
    """
    if not step.is_stamp:
        return
    script = getattr(ctx, "script", None)
    if script is None:  # no script directory to ask: judge by the scheduler's revision ids
        moved = bool((set(step.up_revision_ids) | set(step.down_revision_ids)) & _OWN_IDS)
    else:
        before = _scheduler_lineage(script, tuple(step.down_revision_ids))
        after = _scheduler_lineage(script, tuple(step.up_revision_ids))
        moved = before != after
    if moved:
        raise CommandError(
            "alembic stamp is refused for the scheduler's revisions: the scheduler's version is "
            "its migrations table, which a stamp would not change. Use `alembic upgrade` (a "
            "revision already recorded in migrations is a no-op). Nothing was changed."
        )


__all__ = [
    "BRANCH_LABEL",
    "EXCLUSIVE_ATTRIBUTE",
    "NOW_ATTRIBUTE",
    "SCHEMA_ATTRIBUTE",
    "RevisionSettings",
    "apply_online",
    "emit_offline",
    "refuse_downgrade",
    "refuse_stamp",
    "settings_for",
    "settings_from",
    "upgrade_to",
    "version_location",
]
