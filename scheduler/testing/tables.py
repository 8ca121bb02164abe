"""``dump_tables``: every scheduler table's rows, for tests that compare whole databases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Column, Integer, MetaData, Table, Text, select

from scheduler.schema import tables as t

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore
    from scheduler.store.plumbing.tx import Tx

SQLITE_SEQUENCE = Table("sqlite_sequence", MetaData(), Column("name", Text), Column("seq", Integer))
"""SQLite's own AUTOINCREMENT table (the ``events`` counter); it exists only on SQLite. A ``Table``
(not a ``table()`` clause) so that schema translation addresses it too (an attached database)."""


def dump_tables(store: SchedulerStore) -> dict[str, list[dict[str, Any]]]:
    """Every scheduler table's rows, in the layout of the fixtures' ``final_dump["tables"]``.

    Returns ``{table name: [row, …]}`` for the 12 tables of ``scheduler.schema.metadata``
    (plus ``sqlite_sequence`` on SQLite), each row a ``{column name: value}`` dict, rows ordered
    by primary key (code-point order for text keys, like the recorded dumps). The rows are read
    in one read transaction of ``store`` (one snapshot), with Core selects over the schema's
    tables run like the store's own statements, so they address the store's schema
    (``open_store(schema=…)``, or a ``schema_translate_map`` on a caller's connection) and the
    same call serves every backend.
    Raises ``SCHEDULER_STORE_CLOSED`` on a closed store and whatever the store's reads raise
    (e.g. ``SCHEDULER_STORAGE_UNAVAILABLE``).
    """
    return store._read(_dump_in)


def _dump_in(tx: Tx) -> dict[str, list[dict[str, Any]]]:
    dumped = {
        schema_table.name: _rows(tx, select(schema_table).order_by(*schema_table.primary_key))
        for schema_table in t.ALL_TABLES
    }
    if tx.conn.dialect.name == "sqlite":
        sequence = SQLITE_SEQUENCE
        dumped[sequence.name] = _rows(tx, select(sequence).order_by(sequence.c.name))
    return dict(sorted(dumped.items()))


def _rows(tx: Tx, statement: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in tx.execute(statement).mappings()]
