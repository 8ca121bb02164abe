"""Typed source locators (schema v5): shapes per domain, canonical paths, binding, stored validation.

Every test with a store runs on both backends (``place``).

API §5 Domain migration journal (v5).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from migration_fixtures import (
    AGENDA_LOCATOR,
    AGENDA_SCOPE,
    COWORK_LOCATOR,
    Harness,
    agenda_entry,
    cowork_entry,
    harness_in,
    plan,
    raises,
    target_job,
)
from store_places import StorePlace

from scheduler.contract.canonical import canonical_json, sha256_payload_digest
from scheduler.contract.digests import scheduler_migration_scope_digest
from scheduler.store.capabilities.domain_migrations.locators import (
    assert_non_sensitive_source_locator,
    normalize_source_locator,
)

INVALID = "SCHEDULER_INVALID_ARGUMENT"
CORRUPT = "SCHEDULER_DATA_CORRUPT"
PATH_MESSAGE = (
    "must be an absolute path in canonical form; Windows paths require a fully-qualified drive or UNC share"
)
posix_only = pytest.mark.skipif(
    sys.platform == "win32", reason="the store checks paths with host rules (POSIX)"
)


@pytest.fixture
def h(place: StorePlace) -> Iterator[Harness]:
    yield from harness_in(place)


def scope(store: str, key: str, value: str) -> str:
    return scheduler_migration_scope_digest({"store": store, key: value})


DOMAIN_CASES = [
    ("agenda", {"type": "agenda-store", "directory": "/a/b"}, scope("agent-schedule", "directory", "/a/b")),
    (
        "cowork-cron",
        {"type": "cowork-workspace", "workspace": "/srv/w"},
        scope("cowork-schedules", "workspace", "/srv/w"),
    ),
    ("routine", {"type": "routine-store", "directory": "/r"}, scope("routines", "directory", "/r")),
    (
        "automation",
        {"type": "automation-database", "database": "/db.sqlite"},
        scope("automation-engine", "database", "/db.sqlite"),
    ),
    (
        "automation",
        {"type": "automation-database", "database": "memory:main"},
        scope("automation-engine", "database", "memory:main"),
    ),
    (
        "loop-iteration",
        {"type": "jsonl-session", "sessionId": "s 42", "directory": "/sessions"},
        scope("jsonl-session", "sessionId", "s 42"),
    ),
]


def locate(value: Any, domain: str = "agenda", digest: str | None = None, **kwargs: Any) -> Any:
    scope_digest = digest if digest is not None else scheduler_migration_scope_digest(AGENDA_SCOPE)
    return normalize_source_locator(value, domain, scope_digest, "loc", **kwargs)


def loop_entry(directory: str) -> dict[str, Any]:
    return {
        "domain": "loop-iteration",
        "sourceId": "session-42:iteration-3",
        "sourceScope": {"store": "jsonl-session", "sessionId": "session-42"},
        "source": {"i": 3},
        "targetJob": target_job("loop-42", "loop-iteration"),
        "sourceLocator": {
            "schemaVersion": 1,
            "type": "jsonl-session",
            "sessionId": "session-42",
            "directory": directory,
        },
    }


# --------------------------------------------------------------------------- pure rules


@posix_only
@pytest.mark.parametrize(("domain", "fields", "digest"), DOMAIN_CASES)
def test_each_domain_has_its_locator_type_and_keys(domain: str, fields: dict[str, Any], digest: str) -> None:
    normalized = locate({**fields, "schemaVersion": 1}, domain, digest)
    assert normalized == {"schemaVersion": 1, **fields}
    assert list(normalized)[:2] == ["schemaVersion", "type"]
    others = {case[1]["type"]: case[1] for case in DOMAIN_CASES if case[1]["type"] != fields["type"]}
    for other in others.values():
        error = raises(INVALID, lambda other=other: locate({**other, "schemaVersion": 1}, domain, digest))
        assert error.message == "loc.type does not match migration domain"


def test_absent_locator_is_none() -> None:
    assert locate(None) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("agenda-store:/a", "loc must be an object"),
        ([AGENDA_LOCATOR], "loc must be an object"),
        ({**AGENDA_LOCATOR, "schemaVersion": 2}, "loc.schemaVersion must be 1"),
        ({**AGENDA_LOCATOR, "schemaVersion": "1"}, "loc.schemaVersion must be 1"),
        ({**AGENDA_LOCATOR, "schemaVersion": True}, "loc.schemaVersion must be 1"),
        ({"type": "agenda-store", "directory": "/a"}, "loc.schemaVersion must be 1"),
        ({**AGENDA_LOCATOR, "type": " "}, "loc.type is not a valid identifier"),
        ({**AGENDA_LOCATOR, "type": "x" * 129}, "loc.type is not a valid identifier"),
        ({**AGENDA_LOCATOR, "directory": 7}, "loc.directory must be a string"),
        ({**AGENDA_LOCATOR, "directory": "/" + "a" * 4096}, "loc.directory is not a valid identifier"),
        ({**AGENDA_LOCATOR, "directory": float("nan")}, "loc.directory contains a non-finite number"),
        ({"schemaVersion": 1, "type": "agenda-store"}, "loc.directory must be a string"),
    ],
)
def test_shape_errors(value: Any, message: str) -> None:
    error = raises(INVALID, lambda: locate(value))
    assert error.message == message


def test_integral_float_schema_version_is_the_number_one() -> None:
    assert locate({**AGENDA_LOCATOR, "schemaVersion": 1.0}) == AGENDA_LOCATOR


def test_unknown_fields_are_listed_and_refused_before_sensitivity() -> None:
    error = raises(INVALID, lambda: locate({**AGENDA_LOCATOR, "zone": 1, "password": "x", "Token": 2}))
    assert error.message == "loc contains unknown fields"
    assert error.details == {"fields": ["Token", "password", "zone"]}


@posix_only
@pytest.mark.parametrize(
    "path",
    [
        "home/alice",
        "/home/alice/",
        "/home//alice",
        "/home/./alice",
        "/home/bob/../alice",
        "c:\\users\\alice\\agenda",
        "C:/users",
        "\\\\server\\share\\x",
        "memory:agenda",
        "~/agenda",
    ],
)
def test_paths_must_be_canonical_and_absolute(path: str) -> None:
    digest = scope("agent-schedule", "directory", path)
    error = raises(INVALID, lambda: locate({**AGENDA_LOCATOR, "directory": path}, digest=digest))
    assert error.message == f"loc.directory {PATH_MESSAGE}"


@posix_only
def test_canonical_paths_pass_and_surrounding_whitespace_is_trimmed() -> None:
    assert locate({**AGENDA_LOCATOR, "directory": " /home/alice/.chainlesschain/agenda\n"}) == AGENDA_LOCATOR
    root = scope("agent-schedule", "directory", "/")
    assert locate({**AGENDA_LOCATOR, "directory": "/"}, digest=root)["directory"] == "/"


@posix_only
def test_loop_iteration_directory_is_a_path_but_session_id_is_not() -> None:
    digest = scope("jsonl-session", "sessionId", "s:1/..")
    ok = {"schemaVersion": 1, "type": "jsonl-session", "sessionId": "s:1/..", "directory": "/d"}
    assert locate(ok, "loop-iteration", digest) == ok
    error = raises(INVALID, lambda: locate({**ok, "directory": "d/"}, "loop-iteration", digest))
    assert error.message == f"loc.directory {PATH_MESSAGE}"
    raises(
        INVALID, lambda: locate({k: v for k, v in ok.items() if k != "directory"}, "loop-iteration", digest)
    )


def test_locator_must_resolve_to_the_scope() -> None:
    elsewhere = scope("agent-schedule", "directory", "/elsewhere")
    error = raises(INVALID, lambda: locate(AGENDA_LOCATOR, digest=elsewhere))
    assert error.message == "loc must resolve to sourceScope"
    wrong_store = scope("routines", "directory", AGENDA_LOCATOR["directory"])
    raises(INVALID, lambda: locate(AGENDA_LOCATOR, digest=wrong_store))


@posix_only
def test_legacy_automation_current_scope_only_when_allowed() -> None:
    current = scheduler_migration_scope_digest({"store": "automation-engine", "database": "current"})
    locator = {"schemaVersion": 1, "type": "automation-database", "database": "/var/lib/automation.db"}
    raises(INVALID, lambda: locate(locator, "automation", current))
    assert locate(locator, "automation", current, allow_legacy_automation_current=True) == locator
    raises(INVALID, lambda: locate(AGENDA_LOCATOR, "agenda", current, allow_legacy_automation_current=True))


@pytest.mark.parametrize(
    ("value", "field", "path"),
    [
        ({"password": 1}, "password", "x"),
        ({"a": {"apiKey": 1}}, "apiKey", "x.a"),
        ({"a": [{"ok": 1}, {"Private-Key": 1}]}, "Private-Key", "x.a[1]"),
        ([{"clientSecret": 1}], "clientSecret", "x[0]"),
        ({"API_KEY": 1}, "API_KEY", "x"),
        ({"passage": 1}, "passage", "x"),
        ({"userCredentials": 1}, "userCredentials", "x"),
        ({"refresh_token": 1}, "refresh_token", "x"),
    ],
)
def test_sensitive_field_names_are_refused_anywhere(value: Any, field: str, path: str) -> None:
    error = raises(INVALID, lambda: assert_non_sensitive_source_locator(value, "x"))
    assert error.message == f"{path} must not contain sensitive fields"
    assert error.details == {"field": field}


def test_non_sensitive_values_pass() -> None:
    for value in ({"sessionId": "password", "directory": ["token"], "apiary": None}, "password", [1, None]):
        assert_non_sensitive_source_locator(value, "x")  # raises nothing


# --------------------------------------------------------------------------- in plans


@posix_only
def test_plan_locators_are_stored_canonically(h: Harness) -> None:
    reordered = {"directory": AGENDA_LOCATOR["directory"], "type": "agenda-store", "schemaVersion": 1}
    migration = h.store.prepare_domain_migration(plan(agenda_entry(sourceLocator=reordered)))
    entry = migration.entries[0]
    assert entry.source_locator == AGENDA_LOCATOR
    assert entry.source_locator_digest == sha256_payload_digest(AGENDA_LOCATOR)
    assert h.rows("SELECT source_locator_json FROM scheduler_domain_migration_entries") == [
        (canonical_json(AGENDA_LOCATOR),)
    ]
    assert entry.to_dict()["sourceLocator"] == AGENDA_LOCATOR


@posix_only
def test_plan_locator_errors_name_the_entry(h: Harness) -> None:
    bad = agenda_entry(sourceLocator={**AGENDA_LOCATOR, "directory": "/home/alice/.chainlesschain/agenda/"})
    error = raises(INVALID, lambda: h.store.prepare_domain_migration(plan(cowork_entry(), bad)))
    assert error.message == f"entries[1].sourceLocator.directory {PATH_MESSAGE}"
    current = {"store": "automation-engine", "database": "current"}
    automation = {
        "domain": "automation",
        "sourceId": "auto-1",
        "sourceScope": current,
        "source": {},
        "targetJob": target_job("automation-1", "automation"),
        "sourceLocator": {"schemaVersion": 1, "type": "automation-database", "database": "/db"},
    }
    error = raises(INVALID, lambda: h.store.prepare_domain_migration(plan(automation)))
    assert error.message == "entries[0].sourceLocator must resolve to sourceScope"
    assert h.store.list_domain_migrations() == []


@posix_only
def test_repeated_prepare_backfills_missing_locators_and_refuses_different_ones(h: Harness) -> None:
    first = h.store.prepare_domain_migration(plan(agenda_entry(), cowork_entry()))
    h.tick()
    with_locator = plan(agenda_entry(sourceLocator=AGENDA_LOCATOR), cowork_entry())
    again = h.store.prepare_domain_migration(with_locator)
    assert again.id == first.id and again.deduplicated is True and again.updated_at == h.now
    by_domain = {e.domain: e for e in again.entries}
    assert by_domain["agenda"].source_locator == AGENDA_LOCATOR and by_domain["agenda"].updated_at == h.now
    assert (
        by_domain["cowork-cron"].source_locator is None
        and by_domain["cowork-cron"].updated_at == first.updated_at
    )
    h.tick()
    without = h.store.prepare_domain_migration(
        plan(agenda_entry(), cowork_entry())
    )  # a missing locator agrees
    assert without.deduplicated is True and without.updated_at == h.now - 1000


@posix_only
def test_repeated_prepare_with_a_different_locator_is_a_conflict(h: Harness) -> None:
    first = h.store.prepare_domain_migration(plan(loop_entry("/a")))
    error = raises(
        "SCHEDULER_MIGRATION_CONFLICT", lambda: h.store.prepare_domain_migration(plan(loop_entry("/b")))
    )
    assert error.details["active"] == error.details["requested"]  # the comparison omits locators
    assert h.store.get_domain_migration(first.id).entries[0].source_locator["directory"] == "/a"


# --------------------------------------------------------------------------- binding


@pytest.fixture
def bindable(h: Harness) -> Any:
    return h.store.prepare_domain_migration(plan(agenda_entry(), cowork_entry()))


def bind(h: Harness, migration: Any, domain: str, locator: Any, **overrides: Any) -> Any:
    entry = next(e for e in migration.entries if e.domain == domain)
    args = {
        "migration_id": migration.id,
        "entry_id": entry.entry_id,
        "source_locator": locator,
        "expected_source_digest": entry.source_digest,
        "expected_target_job_id": entry.target_job_id,
    }
    args.update(overrides)
    return h.store.bind_domain_migration_source_locator(**args)


@posix_only
def test_bind_then_repeat_then_conflict(h: Harness, bindable: Any) -> None:
    h.tick()
    bound = bind(h, bindable, "cowork-cron", COWORK_LOCATOR)
    assert bound.deduplicated is False and bound.source_locator == COWORK_LOCATOR
    assert bound.updated_at == h.now and h.store.get_domain_migration(bindable.id).updated_at == h.now
    h.tick()
    reordered = {"workspace": "/srv/cowork/alpha", "type": "cowork-workspace", "schemaVersion": 1}
    repeat = bind(h, bindable, "cowork-cron", reordered)
    assert repeat.deduplicated is True and repeat.updated_at == h.now - 1000
    # a different workspace cannot even resolve to this entry's scope
    error = raises(
        INVALID, lambda: bind(h, bindable, "cowork-cron", {**COWORK_LOCATOR, "workspace": "/srv/cowork/beta"})
    )
    assert error.message == "sourceLocator must resolve to sourceScope"


@posix_only
def test_bind_conflicts_with_a_differently_bound_locator(h: Harness) -> None:
    migration = h.store.prepare_domain_migration(plan(loop_entry("/a")))
    moved = {"schemaVersion": 1, "type": "jsonl-session", "sessionId": "session-42", "directory": "/b"}
    error = raises(
        "SCHEDULER_MIGRATION_LOCATOR_CONFLICT", lambda: bind(h, migration, "loop-iteration", moved)
    )
    assert error.message == "Scheduler migration source locator is already bound differently"


@posix_only
def test_bind_evidence_and_argument_rules(h: Harness, bindable: Any) -> None:
    before = h.snapshot()
    error = raises(
        "SCHEDULER_MIGRATION_SOURCE_MISMATCH",
        lambda: bind(h, bindable, "agenda", AGENDA_LOCATOR, expected_source_digest="sha256:" + "0" * 64),
    )
    assert error.message == "Scheduler migration locator evidence does not match the journal"
    raises(
        "SCHEDULER_MIGRATION_SOURCE_MISMATCH",
        lambda: bind(h, bindable, "agenda", AGENDA_LOCATOR, expected_target_job_id="cowork-cron-migrated-7"),
    )
    error = raises(
        "SCHEDULER_MIGRATION_NOT_FOUND", lambda: bind(h, bindable, "agenda", AGENDA_LOCATOR, entry_id="nope")
    )
    assert error.message == "Scheduler migration entry does not exist: nope"
    error = raises(INVALID, lambda: bind(h, bindable, "agenda", None))
    assert error.message == "sourceLocator is required"
    error = raises(
        INVALID, lambda: bind(h, bindable, "agenda", AGENDA_LOCATOR, expected_source_digest="sha256:XYZ")
    )
    assert error.message == "expectedSourceDigest must be a sha256 payload digest"
    raises(INVALID, lambda: bind(h, bindable, "agenda", AGENDA_LOCATOR, expected_target_job_id=""))
    raises(INVALID, lambda: bind(h, bindable, "agenda", COWORK_LOCATOR))
    assert h.snapshot() == before
    h.store.close()
    raises(INVALID, lambda: bind(h, bindable, "agenda", AGENDA_LOCATOR, migration_id=""))
    raises("SCHEDULER_STORE_CLOSED", lambda: bind(h, bindable, "agenda", AGENDA_LOCATOR))
    h.store = h.open()


@posix_only
def test_bind_accepts_the_legacy_automation_current_scope(h: Harness) -> None:
    entry = {
        "domain": "automation",
        "sourceId": "auto-18",
        "sourceScope": {"store": "automation-engine", "database": "current"},
        "source": {"id": "auto-18"},
        "targetJob": target_job("automation-auto-18", "automation"),
    }
    migration = h.store.prepare_domain_migration(plan(entry))
    locator = {"schemaVersion": 1, "type": "automation-database", "database": "/var/lib/automation.db"}
    bound = bind(h, migration, "automation", locator)
    assert bound.source_locator == locator
    assert h.store.get_domain_migration(migration.id).entries[0].source_locator == locator  # valid when read


# --------------------------------------------------------------------------- stored locators are re-validated


@posix_only
@pytest.mark.parametrize(
    "stored",
    [
        '{"schemaVersion":1,"type":"agenda-store","directory":"/elsewhere"}',
        '{"schemaVersion":1,"type":"routine-store","directory":"/home/alice/.chainlesschain/agenda"}',
        '{"schemaVersion":2,"type":"agenda-store","directory":"/home/alice/.chainlesschain/agenda"}',
        '{"schemaVersion":1,"type":"agenda-store","directory":"/home/alice/.chainlesschain/agenda","secret":1}',
        '{"schemaVersion":1,"type":"agenda-store","directory":"/home/alice/.chainlesschain/agenda/"}',
        '"agenda-store"',
        "[]",
    ],
)
def test_damaged_stored_locator_is_data_corrupt(h: Harness, stored: str) -> None:
    migration = h.store.prepare_domain_migration(plan(agenda_entry(sourceLocator=AGENDA_LOCATOR)))
    h.execute("UPDATE scheduler_domain_migration_entries SET source_locator_json = ?", stored)
    error = raises(CORRUPT, lambda: h.store.get_domain_migration(migration.id))
    assert error.message == "Stored scheduler migration source locator is invalid or unbound"
    assert error.__cause__ is not None
    raises(
        CORRUPT,
        lambda: h.store.get_active_domain_migration_by_source(
            domain="agenda", source_scope=AGENDA_SCOPE, source_id="legacy-agenda-42"
        ),
    )
    raises(CORRUPT, lambda: h.store.apply_domain_migration(migration.id))
    assert h.rows("SELECT state FROM scheduler_domain_migrations") == [("prepared",)]
    assert [m.id for m in h.store.list_domain_migrations()] == [migration.id]  # lists carry no entries
