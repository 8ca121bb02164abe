"""``dump_tables``: every scheduler table's rows, for tests that compare whole databases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from scheduler.schema import tables as t

if TYPE_CHECKING:
    from scheduler.store.facade import SchedulerStore
    from scheduler.store.plumbing.tx import Tx



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
    for own in tx.backend.bookkeeping_tables:  # SQLite's sqlite_sequence
        dumped[own.name] = _rows(tx, select(own).order_by(*own.columns))
    return dict(sorted(dumped.items()))


def _rows(tx: Tx, statement: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in tx.execute(statement).mappings()]
