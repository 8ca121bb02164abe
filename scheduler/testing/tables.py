"""``dump_tables``: every scheduler table's rows, for tests that compare whole databases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import column, select, table

from scheduler.schema import tables as t

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore
    from scheduler.store.session import Tx

SQLITE_SEQUENCE = "sqlite_sequence"
"""SQLite's own AUTOINCREMENT table (the ``events`` counter); it exists only on SQLite."""


def dump_tables(store: SchedulerStore) -> dict[str, list[dict[str, Any]]]:
    """Every scheduler table's rows, in the layout of the fixtures' ``final_dump["tables"]``.

    Returns ``{table name: [row, …]}`` for the 12 tables of ``scheduler.schema.metadata``
    (plus ``sqlite_sequence`` on SQLite), each row a ``{column name: value}`` dict, rows ordered
    by primary key (code-point order for text keys, like the recorded dumps). The rows are read
    in one read transaction of ``store`` (one snapshot), with Core selects over the schema's
    tables, so the same call serves every backend. Raises ``SCHEDULER_STORE_CLOSED`` on a closed
    store and whatever the store's reads raise (e.g. ``SCHEDULER_STORAGE_UNAVAILABLE``).
    """
    return store._read(_dump_in)


def _dump_in(tx: Tx) -> dict[str, list[dict[str, Any]]]:
    dumped = {
        schema_table.name: _rows(tx, select(schema_table).order_by(*schema_table.primary_key))
        for schema_table in t.ALL_TABLES
    }
    if tx.conn.dialect.name == "sqlite":
        sequence = table(SQLITE_SEQUENCE, column("name"), column("seq"))
        dumped[SQLITE_SEQUENCE] = _rows(tx, select(sequence).order_by(sequence.c.name))
    return dict(sorted(dumped.items()))


def _rows(tx: Tx, statement: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in tx.execute(statement).mappings()]
