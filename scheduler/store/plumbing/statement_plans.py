"""Hot statements (:class:`Prepared`) and their plans: each compiled once per dialect, schema and
set of parameter names into the SQL text and binds SQLAlchemy itself would execute (:func:`compile_plan`),
or refused where only SQLAlchemy's own execution is exact. :mod:`scheduler.store.plumbing.fastpath` runs
the plans on a store's connection.
"""

from __future__ import annotations

import re
import threading
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Final, TypeAlias

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import UpdateBase

from scheduler.store.plumbing import library_internals as internals
from scheduler.store.plumbing.library_internals import InternalsUnavailable

# Compiling a shared module-level statement in several threads at once can see another thread's
# half-built lazy attributes on SQLAlchemy 2.0 ("All selectables passed to CompoundSelect must
# have identical numbers of columns … has 0"): plans are compiled one at a time (once each), and
# statements built from shared ones (``write_batch.combined``, ``cycle_read``, ``cycle_statement``)
# are built under the same lock, since copying a statement reads the same lazy attributes.
STATEMENTS_LOCK: Final = threading.Lock()

Arguments = Callable[[Mapping[str, Any]], Any]
"""A parameter dict -> the driver's arguments: a tuple (positional) or a dict (named)."""
SchemaMap = Mapping[str | None, str]
"""A ``schema_translate_map``: the scheduler's schema-less tables -> the store's schema."""
StoredRow: TypeAlias = Any
"""A result row: a SQLAlchemy ``Row`` or a fast-path row (attribute access, indexing, ``_mapping``)."""


class Prepared:
    """A module-level Core statement that may run through the compile-once fast path."""

    __slots__ = ("dml", "ignores_kept_writes", "locks", "passes_kept_writes", "planned_per_call", "statement")

    def __init__(
        self,
        statement: Executable,
        *,
        passes_kept_writes: bool = False,
        locks: bool = False,
        ignores_kept_writes: bool = False,
        planned_per_call: bool = False,
    ) -> None:
        """``locks``: the statement writes or locks rows where its top level does not show it
        (inside a ``WITH``); ``ignores_kept_writes``: it reads nothing that a write
        ``Tx.write_later`` keeps changes (those are occurrence updates, which never change an
        occurrence's ``job_id``, and event rows): e.g. ``jobs``, the controls, ``job_id``;
        ``planned_per_call``: never a named server-side statement, so the server plans it for
        each call's values and table size (a named statement's generic plan, made while a table
        was small and kept while no statistics change, may scan it whole)."""
        self.statement = statement
        self.planned_per_call = planned_per_call
        self.ignores_kept_writes = ignores_kept_writes
        self.passes_kept_writes = passes_kept_writes
        """A claim read that may run before writes ``Tx.write_later`` keeps (it reads only rows
        claimable or sweepable at the call's ``now``, and rows it locks itself)."""
        # INSERT/UPDATE/DELETE compile per set of parameter names (like SQLAlchemy's cache key).
        self.dml = isinstance(statement, UpdateBase)
        self.locks = locks or self.dml or _locks_rows(statement)
        """Running it changes what a rollback to an earlier savepoint would undo (a write or a
        row lock); a plain read does not."""


_PER_BACKEND: dict[tuple[str, ...], Prepared] = {}


def per_backend(key: tuple[str, ...], build: Callable[[], Prepared]) -> Prepared:
    """``build()``'s statement, built once per ``key``: for statements built from a ``Backend``'s
    methods, whose key names the backend (``functools.cache`` cannot key on the protocol, and a
    capability imports no backend registry)."""
    found = _PER_BACKEND.get(key)
    if found is None:
        found = _PER_BACKEND.setdefault(key, build())
    return found


def _locks_rows(statement: Executable) -> bool:
    """Whether a statement locks rows at its top level (``FOR UPDATE``); unknown counts as yes."""
    try:
        return internals.locks_rows(statement)
    except InternalsUnavailable:
        return True


def _row_type(names: Sequence[str]) -> Any:
    """A tuple class with an attribute per column and ``_mapping`` (a dict of the row)."""
    base: Any = namedtuple("FastRow", names)  # type: ignore[misc]
    return type("FastRow", (base,), {"__slots__": (), "_mapping": property(base._asdict)})


class Plan:
    """One statement compiled for one dialect.

    ``arguments`` turns a parameter dict into the positional arguments of ``sql``; a statement
    with an expanding ``IN`` keeps its ``compiled`` form, whose SQL depends on the list lengths.
    """

    __slots__ = ("arguments", "compiled", "constants", "expanded", "expanding", "literal", "row_type", "sql")

    def __init__(
        self,
        sql: str,
        arguments: Arguments,
        row_type: Any,
        compiled: SQLCompiler | None,
        constants: dict[str, Any] | None = None,
    ) -> None:
        self.sql = sql
        self.arguments = arguments
        self.row_type = row_type
        self.compiled = compiled
        self.constants = constants or {}
        self.expanding: tuple[str, ...] = ()
        self.literal: tuple[str, ...] = ()
        if compiled is not None:
            self.literal = tuple(sorted({bind.key for bind in compiled.literal_execute_params}))
            self.expanding = tuple(
                sorted({bind.key for bind in compiled.post_compile_params if bind.key not in self.literal})
            )
        self.expanded: dict[tuple[Any, ...], tuple[str, tuple[str, ...] | None]] = {}
        """Per list lengths and rendered values: the expanded SQL and (positional) its bind order,
        once SQLAlchemy's own expansion was seen to bind exactly what :func:`_expand` binds."""

    def bind(self, parameters: Mapping[str, Any]) -> tuple[str, Any]:
        """(SQL, arguments) of an expanding statement: SQLAlchemy's own post-compile step the
        first time for each list length, then its SQL again with :func:`_expand`'s binds."""
        compiled = self.compiled
        assert compiled is not None
        values = {**self.constants, **parameters}
        key = (*(len(values[name]) for name in self.expanding), *(values[name] for name in self.literal))
        values = _expand(values, self.expanding)
        for name in self.literal:
            del values[name]  # rendered into the SQL
        cached = self.expanded.get(key)
        if cached is not None:
            sql, bind_order = cached
            return sql, values if bind_order is None else tuple(values[name] for name in bind_order)
        state = compiled.construct_expanded_state(dict(parameters))
        if state.processors:
            raise KeyError("bind processors")
        if compiled.positional:
            order: tuple[str, ...] | None = tuple(state.positiontup or ())
            arguments: Any = tuple(state.positional_parameters)
            same = tuple(values.get(name, _MISSING) for name in order or ()) == arguments
        else:
            order, arguments = None, dict(state.parameters)
            same = all(values.get(name, _MISSING) == value for name, value in arguments.items())
        if same and len(self.expanded) < _EXPANSIONS_KEPT:
            self.expanded[key] = (state.statement, order)
        return state.statement, arguments


_MISSING: Final = object()
_EXPANSIONS_KEPT: Final = 256
"""Expanded statements kept per plan (list lengths × rendered limits seen); beyond, SQLAlchemy
expands each call."""


def _expand(values: dict[str, Any], expanding: Sequence[str]) -> dict[str, Any]:
    """``values`` with each expanding list bound element by element, named as SQLAlchemy names
    them (``name_1`` …, or ``name_1_1`` … for tuples; :meth:`Plan.bind` checks it is so)."""
    for name in expanding:
        items = values.pop(name)
        for row, item in enumerate(items, 1):
            if isinstance(item, tuple):
                for column, element in enumerate(item, 1):
                    values[f"{name}_{row}_{column}"] = element
            else:
                values[f"{name}_{row}"] = item
    return values


def _named_arguments(names: Sequence[str], constants: dict[str, Any]) -> Arguments:
    """Named arguments (psycopg's ``%(name)s``) from a parameter dict: every bind the SQL names,
    a given value before a constant (a missing required name raises ``KeyError``)."""
    required = [name for name in names if name not in constants]
    if not constants:
        return lambda parameters: {name: parameters[name] for name in required}

    def arguments(parameters: Mapping[str, Any]) -> dict[str, Any]:
        values = {name: parameters.get(name, value) for name, value in constants.items()}
        for name in required:
            values[name] = parameters[name]
        return values

    return arguments


def _arguments(names: Sequence[str], constants: dict[str, Any]) -> Arguments:
    """Positional arguments from a parameter dict (a missing required name raises ``KeyError``)."""
    if not names:
        return lambda _parameters: ()
    getter = itemgetter(*names)
    single = len(names) == 1
    if constants:
        if single:
            return lambda parameters: (getter({**constants, **parameters}),)
        return lambda parameters: getter({**constants, **parameters})
    if single:
        return lambda parameters: (getter(parameters),)
    return getter


def _unsupported(prepared: Prepared, compiled: SQLCompiler, dialect: Dialect, many: bool) -> bool:
    """Whether executing ``compiled`` could differ from SQLAlchemy's execution of it (raises
    ``InternalsUnavailable`` where that cannot be known: :mod:`.library_internals`)."""
    return bool(
        (compiled.positiontup is None) == bool(dialect.positional)
        or any(_processes(processor) for processor in internals.bind_processors(compiled).values())
        or compiled.escaped_bind_names
        or (many and (compiled.post_compile_params or compiled.literal_execute_params))
        or compiled.insert_prefetch
        or compiled.update_prefetch
        or internals.collects_params(compiled)
        or prepared.statement.get_execution_options()
        or (many and (compiled.returning or internals.inserts_many_values(compiled)))
        or any(
            bind.callable is not None or (bind.required and bind.key != name)
            for bind, name in compiled.bind_names.items()
        )
        or any(
            internals.result_processor(column_type, dialect) is not None
            for _key, column_type in internals.result_columns(compiled)
        )
    )


_NAMED_PLACEHOLDER: Final = re.compile(r"%\((\w+)\)s|__\[POSTCOMPILE_(\w+)\]")


def _processes(processor: Any) -> bool:
    """Whether a bind processor entry converts values (a tuple bind has one entry per element)."""
    if isinstance(processor, tuple):
        return any(element is not None for element in processor)
    return processor is not None


def placeholders_match(sql: str, names: Sequence[str], positional: bool) -> bool:
    """One ``?`` (or expanding ``__[POSTCOMPILE_…]``) per positional name, or exactly the named
    binds as ``%(name)s`` placeholders, as this module assumes.

    A guard against a SQLAlchemy release whose compiled form means something else: the plan
    is then not used and SQLAlchemy executes the statement itself.
    """
    if positional:
        return sql.count("?") + sql.count("__[POSTCOMPILE_") == len(names)
    rendered = {plain or expanding for plain, expanding in _NAMED_PLACEHOLDER.findall(sql)}
    return rendered == set(names) and sql.replace("%%", "").count("%") == sql.count("%(")


def compile_plan(
    prepared: Prepared,
    dialect: Dialect,
    keys: tuple[str, ...] | None,
    many: bool,
    translate_map: SchemaMap | None = None,
) -> Plan | None:
    """The plan of a statement, or ``None`` if only SQLAlchemy's execution is exact for it.

    With a ``translate_map`` the schema names are rendered into the SQL, as SQLAlchemy renders
    them at execution time for its ``schema_translate_map`` option.
    """
    statement: Any = prepared.statement
    schema_options: dict[str, Any] = {}
    if translate_map is not None:
        schema_options = {"schema_translate_map": translate_map, "render_schema_translate": True}
    compiled = statement.compile(
        dialect=dialect,
        column_keys=None if keys is None else sorted(keys),
        for_executemany=many,
        **schema_options,
    )
    assert isinstance(compiled, SQLCompiler)
    try:
        if _unsupported(prepared, compiled, dialect, many):
            return None
        columns = [key for key, _type in internals.result_columns(compiled)]
    except (AttributeError, InternalsUnavailable):  # SQLAlchemy's own execution (library_internals)
        return None
    positional = bool(dialect.positional)
    if positional:
        names = list(compiled.positiontup or [])
    else:
        names = list(dict.fromkeys(compiled.bind_names.values()))
    if not placeholders_match(compiled.string, names, positional):
        return None
    constants = {
        name: bind.effective_value
        for bind, name in compiled.bind_names.items()
        if not bind.required and name in names
    }
    row_type = None
    if columns:
        if len(set(columns)) != len(columns) or not all(c.isidentifier() and c[0] != "_" for c in columns):
            return None
        row_type = _row_type(columns)
    expanding = compiled if compiled.post_compile_params or compiled.literal_execute_params else None
    build = _arguments if positional else _named_arguments
    return Plan(compiled.string, build(names, constants), row_type, expanding, constants)
