"""Alembic autogenerate in a host application: leave the scheduler's tables out of the comparison.

A host's ``env.py`` compares the database with *its own* ``target_metadata``; the scheduler's
tables are not in it, so without a filter ``alembic revision --autogenerate`` proposes dropping
every one of them (and ``alembic check`` fails), in whichever layout they live:

* a SQLite file shared with the host (the tables in ``main``, beside the host's);
* an attached SQLite database or a PostgreSQL schema, once the host compares more than its default
  schema (``include_schemas=True``).

:func:`alembic_filters` returns ``include_name`` and ``include_object`` hooks for
``context.configure`` that skip exactly the scheduler's tables (and with them their indexes and
constraints) and, when it has one, the scheduler's own schema. The host's tables, including one
named like a scheduler table in another schema (a PostgreSQL ``public.events``), are compared as
usual. The scheduler's schema is changed only by its own revisions (the ``scheduler`` branch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Connection

from scheduler.schema.target import schema_target
from scheduler.schema.versions import SCHEDULER_TABLE_NAMES

IncludeName = Callable[[str | None, str, Mapping[str, str | None]], bool]
IncludeObject = Callable[[Any, str | None, str, bool, Any], bool]


def alembic_filters(
    connection: Connection,
    *,
    schema: str | None = None,
    include_name: IncludeName | None = None,
    include_object: IncludeObject | None = None,
) -> dict[str, Any]:
    """``{"include_name": …, "include_object": …}`` for ``context.configure(**…)`` in a host's
    ``env.py``, so that autogenerate never proposes creating, changing or dropping the scheduler's
    tables.

    ``connection`` is the one ``env.py`` migrates (it tells the backend, and on SQLite which
    databases are attached); ``schema`` is where the scheduler's tables live, as given to
    ``open_store`` or ``config.attributes["scheduler.schema"]`` (default: SQLite ``main``, the
    shared file; PostgreSQL ``scheduler``). ``include_name``/``include_object`` are the host's own
    hooks, consulted for everything the scheduler's filter keeps. Raises
    ``SCHEDULER_INVALID_ARGUMENT`` for a bad schema name (on SQLite: not an attached database).

    Example (``env.py``)::

        with engine.connect() as connection:
            context.configure(connection=connection, target_metadata=Base.metadata,
                              include_schemas=True, **scheduler.alembic_filters(connection))
    """
    began = not connection.in_transaction()
    try:
        target = schema_target(connection, schema)  # on SQLite it may read PRAGMA database_list
    finally:
        if began and connection.in_transaction():
            connection.rollback()  # end the read it began: Alembic's own transaction comes next
    own_schema = None if target.is_default_sqlite else target.schema
    default_names = (None, "main")

    def scheduler_table(name: str | None, schema_name: str | None) -> bool:
        if name not in SCHEDULER_TABLE_NAMES:
            return False
        if own_schema is None:  # a shared SQLite file: the scheduler's names are reserved in main
            return schema_name in default_names
        return schema_name == own_schema

    def filter_name(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
        if type_ == "schema" and own_schema is not None and name == own_schema:
            return False
        if type_ == "table" and scheduler_table(name, parent_names.get("schema_name")):
            return False
        return include_name is None or include_name(name, type_, parent_names)

    def filter_object(item: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        if type_ == "table" and scheduler_table(name, getattr(item, "schema", None)):
            return False
        return include_object is None or include_object(item, name, type_, reflected, compare_to)

    return {"include_name": filter_name, "include_object": filter_object}


__all__ = ["alembic_filters"]
