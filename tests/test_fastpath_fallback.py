"""The fast path relies on SQLAlchemy internals; when one is missing or changed it steps aside.

Each test removes or alters an internal the fast path reads, then runs the hot paths and checks
that (a) no fast-path plan is used and (b) the results and the stored rows are exactly those of
an unaltered run: SQLAlchemy executed every statement itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, select, tuple_

from scheduler import SchedulerStore, open_store
from scheduler.schema import tables as t
from scheduler.store.plumbing import library_internals, statement_plans

T0 = 1767225600000
AUTHORITY = {"principal": {"type": "user", "id": "u"}}


def workload(store: SchedulerStore) -> list[Any]:
    """Enqueue, claim (one and a batch, with a kind sequence), settle, settle_and_claim, list."""
    store.create_job(id="job", kind="k", authority=AUTHORITY)
    store.enqueue_many([{"job_id": "job", "scheduled_for": T0 + i, "trigger_key": f"t{i}"} for i in range(6)])
    first = store.claim_next(owner_id="w", lease_ms=5000)
    assert first is not None
    cycle = store.settle_and_claim(
        occurrence_id=first.id,
        owner_id="w",
        fence=first.fence,
        outcome="failed",
        retryable=False,
        lease_ms=5000,
    )
    batch = store.claim_batch(owner_id="w", lease_ms=5000, limit=3, job_kind=["k", "other"])
    settled = store.settle_many(
        [{"occurrence_id": o.id, "owner_id": "w", "fence": o.fence, "outcome": "succeeded"} for o in batch]
    )
    return [
        first.to_dict(),
        cycle.to_dict(),
        [o.to_dict() for o in settled],
        [o.to_dict() for o in store.list_dead_letters(limit=10)],
        [e.to_dict() for e in store.history(job_id="job", limit=50)],
    ]


def run(tmp_path: Path, name: str) -> tuple[list[Any], dict[Any, Any]]:
    clock = iter(range(T0 + 10_000, T0 + 1_000_000, 7))
    ids = iter(f"uuid-{i}" for i in range(1000))
    store = open_store(tmp_path / name, clock=lambda: next(clock), uuid_factory=lambda: next(ids))
    try:
        results = workload(store)
        fast = store._runner.fastpath  # type: ignore[attr-defined]
        plans = {} if fast is None else dict(fast._plans)
        return results, plans
    finally:
        store.close()


@pytest.fixture
def reference(tmp_path: Path) -> list[Any]:
    results, plans = run(tmp_path, "reference.sqlite")
    assert plans and all(plan is not None for plan in plans.values())  # the fast path was used
    return results


def renamed_internal(*_args: Any) -> Any:
    """What reading an internal that a later SQLAlchemy renamed does."""
    raise AttributeError("'SQLCompiler' object has no attribute 'an_internal'")


def altered(monkeypatch: pytest.MonkeyPatch, change: Callable[[pytest.MonkeyPatch], None]) -> None:
    change(monkeypatch)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda mp: mp.setattr(statement_plans, "_unsupported", renamed_internal),
            id="compiler-attr-renamed",
        ),
        pytest.param(
            lambda mp: mp.setattr(statement_plans, "placeholders_match", lambda *_args: False),
            id="bind-order-changed",
        ),
    ],
)
def test_a_changed_compiler_internal_falls_back_to_sqlalchemy(
    tmp_path: Path, reference: list[Any], monkeypatch: pytest.MonkeyPatch, change: Any
) -> None:
    altered(monkeypatch, change)
    results, plans = run(tmp_path, "altered.sqlite")
    assert plans and all(plan is None for plan in plans.values())
    assert results == reference


def test_a_missing_connection_internal_turns_the_fast_path_off(
    tmp_path: Path, reference: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    internals = (*library_internals.CONNECTION_INTERNALS, "_an_attribute_a_future_release_renamed")
    monkeypatch.setattr(library_internals, "CONNECTION_INTERNALS", internals)
    results, plans = run(tmp_path, "no-connection-internal.sqlite")
    assert plans == {}
    assert results == reference


def test_the_placeholder_guard_counts_each_positional_bind() -> None:
    match = statement_plans.placeholders_match
    assert match("SELECT ? , ? WHERE x IN (__[POSTCOMPILE_ids])", ["a", "b", "ids"], True)
    assert not match("SELECT ?, ?", ["a"], True)
    assert not match("SELECT :a", ["a"], True)


def test_the_placeholder_guard_matches_each_named_bind() -> None:
    """psycopg's ``%(name)s``: exactly the named binds (a name may repeat); a stray ``%`` or a
    placeholder of another style means the compiled form is not what the fast path expects."""
    match = statement_plans.placeholders_match
    assert match("SELECT %(a)s, %(a)s WHERE x IN (__[POSTCOMPILE_ids]) AND y LIKE 'z%%'", ["a", "ids"], False)
    assert not match("SELECT %(a)s", ["a", "b"], False)
    assert not match("SELECT %(a)s, %(b)s", ["a"], False)
    assert not match("SELECT %s", [], False)
    assert not match("SELECT :a", ["a"], False)


OCCURRENCES_BY_ID = statement_plans.Prepared(
    select(t.occurrences.c.occurrence_id, t.occurrences.c.fence).where(
        t.occurrences.c.occurrence_id.in_(bindparam("p_ids", expanding=True)),
        t.occurrences.c.status != "succeeded",
    )
)
OCCURRENCES_BY_KEY = statement_plans.Prepared(
    select(t.occurrences.c.occurrence_id).where(
        tuple_(t.occurrences.c.occurrence_id, t.occurrences.c.fence, t.occurrences.c.status).in_(
            bindparam("p_keys", expanding=True)
        )
    )
)
EXPANDING = [
    pytest.param("p_keys", [("a", 1, "queued")], id="tuples-1"),
    pytest.param("p_keys", [("a", 1, "queued"), ("b", 2, "running"), ("c", 3, "queued")], id="tuples-3"),
    pytest.param("p_ids", ["x"], id="ids-1"),
    pytest.param("p_ids", ["x", "y", "z", "w"], id="ids-4"),
]


@pytest.mark.parametrize("dialect_name", ["sqlite", "postgresql"])
@pytest.mark.parametrize(("name", "values"), EXPANDING)
def test_an_expanding_statement_binds_what_sqlalchemy_binds_for_each_length(
    dialect_name: str, name: str, values: list[Any]
) -> None:
    """The expanded SQL of each list length is SQLAlchemy's (kept after its first expansion) and
    every later call binds exactly what SQLAlchemy's post-compile step binds."""
    from sqlalchemy.dialects import postgresql, sqlite

    dialect = sqlite.dialect() if dialect_name == "sqlite" else postgresql.psycopg.dialect()  # type: ignore[attr-defined]
    statement = OCCURRENCES_BY_KEY if name == "p_keys" else OCCURRENCES_BY_ID
    plan = statement_plans.compile_plan(statement, dialect, None, False)
    assert plan is not None and plan.compiled is not None
    for round_ in range(2):
        parameters = {name: [*values]} if round_ == 0 else {name: list(reversed(values))}
        state = plan.compiled.construct_expanded_state(dict(parameters))
        expected = (
            tuple(state.positional_parameters) if plan.compiled.positional else dict(state.parameters)
        )
        assert plan.bind(parameters) == (state.statement, expected)
        assert list(plan.expanded) == [(len(values),)]


def test_an_expansion_named_otherwise_is_never_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """If a SQLAlchemy release named expanded binds differently, every call keeps using its own
    post-compile step (nothing is cached) and binds stay right."""
    from sqlalchemy.dialects import sqlite

    monkeypatch.setattr(
        statement_plans, "_expand", lambda values, expanding: {f"other_{i}": v for i, v in enumerate(values)}
    )
    plan = statement_plans.compile_plan(OCCURRENCES_BY_ID, sqlite.dialect(), None, False)
    assert plan is not None
    for _ in range(2):
        assert plan.bind({"p_ids": ["x", "y"]})[1] == ("x", "y", "succeeded")
    assert plan.expanded == {}


@pytest.mark.parametrize("dialect_name", ["sqlite", "postgresql"])
def test_a_limit_rendered_into_the_sql_gets_one_statement_per_value(dialect_name: str) -> None:
    """A literal-execute bind (the claim's ``LIMIT``/``OFFSET``): each value has its own SQL,
    SQLAlchemy's rendering, kept per value; the other binds stay parameters."""
    from sqlalchemy import Integer
    from sqlalchemy.dialects import postgresql, sqlite

    limit = bindparam("n", type_=Integer(), literal_execute=True)
    statement = statement_plans.Prepared(
        select(t.occurrences.c.occurrence_id).where(t.occurrences.c.job_id == bindparam("job")).limit(limit)
    )
    dialect = sqlite.dialect() if dialect_name == "sqlite" else postgresql.psycopg.dialect()  # type: ignore[attr-defined]
    plan = statement_plans.compile_plan(statement, dialect, None, False)
    assert plan is not None and plan.compiled is not None and plan.literal == ("n",)
    for n in (3, 7, 3):
        state = plan.compiled.construct_expanded_state({"job": "a", "n": n})
        expected = tuple(state.positional_parameters) if plan.compiled.positional else dict(state.parameters)
        sql, arguments = plan.bind({"job": "a", "n": n})
        assert (sql, arguments) == (state.statement, expected)
        assert f"LIMIT {n}" in sql
    assert sorted(plan.expanded) == [(3,), (7,)]
