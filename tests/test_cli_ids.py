"""Short ids and unique prefixes on the command line (``scheduler.cli.ids``), on both backends.

Tables show each generated id as its shortest unique prefix (at least 8 characters past
``occ_``); ``--json`` shows whole ids; every command that takes an id takes a unique prefix; an
ambiguous one is a usage error (exit 2) listing the candidates; an unknown one keeps the
command's not-found answer. Two occurrences whose ids share 14 characters are written with
crafted ids (a derived id never would), so the shortening past the minimum is exercised.
The range queries are checked to be primary-key index scans on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_support import invoke, run_json
from cli_support import isolated_environment as isolated_environment
from hypothesis import given
from hypothesis import strategies as st
from recorded import copy_reference, reference_dump
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool
from store_places import PostgresSchemaPlace, SqliteFilePlace, StorePlace

from scheduler.cli import ids
from scheduler.schema import tables as t
from scheduler.testing import T0, SchedulerClock

AUTHORITY = {"principal": {"type": "service", "id": "cli-ids"}}
TWIN_A = "occ_" + "5" * 10 + "a" * 54
TWIN_B = "occ_" + "5" * 10 + "b" * 54


@dataclass(frozen=True)
class Db:
    place: StorePlace
    opts: tuple[str, ...]
    queued: str
    dead: str


@pytest.fixture
def db(place: StorePlace) -> Db:
    """Jobs ``report``, ``report-daily`` and ``mail``; one queued and one outcome-unknown dead
    letter of ``mail``, and the twins ``TWIN_A``/``TWIN_B`` (copies of the queued row)."""
    clock = SchedulerClock()
    with place.open(clock=clock) as store:
        for job_id in ("report", "report-daily", "mail"):
            store.create_job(id=job_id, kind="email", authority=AUTHORITY, max_attempts=1)
        queued = store.enqueue_occurrence(job_id="mail", scheduled_for=T0, trigger_key="queued").id
        dead = store.enqueue_occurrence(job_id="mail", scheduled_for=T0, trigger_key="dead").id
        claimed = store.claim_occurrence(occurrence_id=dead, owner_id="w", lease_ms=60_000)
        assert claimed is not None
        store.settle(
            occurrence_id=dead,
            owner_id="w",
            fence=claimed.fence,
            outcome="failed",
            error={"code": "REMOTE_OUTCOME_UNKNOWN", "message": "reset"},
            retryable=False,
        )
    [row] = [row for row in place.dump()["tables"]["occurrences"] if row["occurrence_id"] == queued]
    for twin, key in ((TWIN_A, "twin-a"), (TWIN_B, "twin-b")):
        place.insert(
            t.occurrences, **{**row, "occurrence_id": twin, "trigger_key": key, "idempotency_key": key}
        )
    if isinstance(place, PostgresSchemaPlace):
        url = place.server.url.render_as_string(hide_password=False)
        return Db(place, ("--db", url, "--schema", place.schema), queued, dead)
    assert isinstance(place, SqliteFilePlace)
    return Db(place, ("--db", str(place.path)), queued, dead)


def text(db: Db, *args: str, exit_code: int = 0) -> str:
    result = invoke(*db.opts, *args)
    assert result.exit_code == exit_code, result.output
    return result.stdout


def test_tables_show_shortest_unique_prefixes_and_json_whole_ids(db: Db) -> None:
    listing = text(db, "occurrences", "list")
    assert db.queued[:12] in listing and db.queued not in listing  # occ_ + 8 characters
    assert TWIN_A[:15] in listing and TWIN_B[:15] in listing  # they share 14 characters
    assert TWIN_A[:16] not in listing
    assert {item["id"] for item in run_json(*db.opts, "occurrences", "list")["occurrences"]} == {
        db.queued,
        db.dead,
        TWIN_A,
        TWIN_B,
    }
    history = text(db, "history", "--job", "mail")
    assert db.dead[:12] in history and db.dead not in history
    dead_letters = text(db, "dead-letters")
    assert db.dead[:12] in dead_letters and db.dead not in dead_letters
    assert db.dead[:12] in text(db, "adjudication", "list")
    assert run_json(*db.opts, "dead-letters")["deadLetters"][0]["id"] == db.dead


def test_a_shown_short_id_and_any_unique_prefix_name_the_occurrence(db: Db) -> None:
    for prefix in (db.queued[:12], db.queued[:6], TWIN_A[:15]):
        shown = run_json(*db.opts, "occurrences", "show", prefix)["occurrence"]
        assert shown["id"] == (TWIN_A if prefix == TWIN_A[:15] else db.queued)
    events = run_json(*db.opts, "history", "--occurrence", db.dead[:10])["events"]
    assert {event["occurrenceId"] for event in events} == {db.dead} and len(events) == 3
    case = run_json(*db.opts, "adjudication", "show", db.dead[:10])["case"]
    assert case["occurrenceId"] == db.dead
    hint = text(db, "adjudication", "show", db.dead[:10])
    assert f"adjudication decide {db.dead[:12]} " in hint


def test_write_commands_take_a_prefix(db: Db) -> None:
    requeued = run_json(*db.opts, "requeue", db.dead[:9])
    assert requeued["occurrence"]["id"] == db.dead and requeued["occurrence"]["status"] == "retry_wait"
    shown = text(db, "requeue", db.dead[:9])  # again: deduplicated, a table with the short id
    assert "requeued (already)" in shown and db.dead[:12] in shown and db.dead not in shown
    with db.place.open() as store:
        claimed = store.claim_occurrence(occurrence_id=db.queued, owner_id="w", lease_ms=60_000)
        assert claimed is not None
    control = run_json(*db.opts, "pause", db.queued[:9])["control"]
    assert control["occurrenceId"] == db.queued and control["state"] == "pause_requested"
    refused = run_json(*db.opts, "resume", db.queued[:9], exit_code=1)["error"]
    assert refused["code"] != "SCHEDULER_NOT_FOUND"  # found, and refused for its state
    cancelled = run_json(*db.opts, "cancel", TWIN_B[:15], "--reason", "not needed")["occurrence"]
    assert cancelled["id"] == TWIN_B and cancelled["lastError"]["code"] == "CANCELLED"
    shown = text(db, "cancel", TWIN_B[:15])
    assert "cancelled (already)" in shown and TWIN_B[:15] in shown and TWIN_B not in shown


def test_an_ambiguous_prefix_is_a_usage_error_listing_the_candidates(db: Db) -> None:
    prefix = TWIN_A[:14]
    for command in (
        ("occurrences", "show", prefix),
        ("history", "--occurrence", prefix),
        ("requeue", prefix),
        ("cancel", prefix),
        ("pause", prefix),
        ("adjudication", "show", prefix),
    ):
        error = run_json(*db.opts, *command, exit_code=2)["error"]
        assert error["code"] == "CLI_AMBIGUOUS_ID", command
        assert error["details"] == {"prefix": prefix, "candidates": [TWIN_A, TWIN_B], "more": False}
    result = invoke(*db.opts, "occurrences", "show", prefix)
    assert result.exit_code == 2 and TWIN_A in result.stderr and TWIN_B in result.stderr
    jobs = run_json(*db.opts, "jobs", "show", "repo", exit_code=2)["error"]
    assert jobs["details"]["candidates"] == ["report", "report-daily"]
    assert run_json(*db.opts, "occurrences", "list", "--job", "repo", exit_code=2)["error"]["code"] == (
        "CLI_AMBIGUOUS_ID"
    )


def test_a_whole_job_id_wins_and_short_or_unknown_values_keep_not_found(db: Db) -> None:
    assert run_json(*db.opts, "jobs", "show", "report")["job"]["id"] == "report"
    assert run_json(*db.opts, "jobs", "show", "report-d")["job"]["id"] == "report-daily"
    assert "report-daily" in text(db, "jobs", "list")  # job ids are names: shown whole
    by_job = run_json(*db.opts, "occurrences", "list", "--job", "mai")  # 3 < MIN_PREFIX: a whole id
    assert by_job["count"] == 0
    for command in (("occurrences", "show", "occ_zzzz"), ("requeue", "occ_zzzz"), ("jobs", "show", "rep")):
        assert run_json(*db.opts, *command, exit_code=1)["error"]["code"] == "SCHEDULER_NOT_FOUND", command
    assert run_json(*db.opts, "dead-letters", "--job", "nojob")["deadLetters"] == []


def _plan(connection: Any, statement: Any) -> str:
    compiled = statement.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True})
    if connection.dialect.name == "sqlite":
        rows = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}").fetchall()
        return "\n".join(str(row[-1]) for row in rows)
    # A tiny table: prove the index serves it, in its order. Without these the planner may pick a
    # bitmap scan plus a sort (it did whenever autovacuum had not yet set the visibility map).
    connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
    connection.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
    connection.exec_driver_sql("SET LOCAL enable_sort = off")
    return "\n".join(str(row[0]) for row in connection.exec_driver_sql(f"EXPLAIN {compiled}"))


def test_prefix_and_neighbour_lookups_are_primary_key_index_scans(db: Db) -> None:
    if isinstance(db.place, PostgresSchemaPlace):
        engine = create_engine(db.place.server.url, poolclass=NullPool)
    else:
        engine = create_engine(f"sqlite:///{db.place.path}", poolclass=NullPool)
    with engine.connect() as connection, connection.begin():
        dialect = connection.dialect.name
        if isinstance(db.place, PostgresSchemaPlace):
            connection.exec_driver_sql(f'SET LOCAL search_path TO "{db.place.schema}"')
        prefix = _plan(connection, ids.prefix_query(ids.OCCURRENCE, "occ_55", 11))
        wanted: Any = [TWIN_A, db.queued] if dialect == "postgresql" else json.dumps([TWIN_A, db.queued])
        neighbours = _plan(connection, ids.neighbour_query(ids.OCCURRENCE, dialect).params(ids=wanted))
        if dialect == "sqlite":
            index = "USING COVERING INDEX sqlite_autoindex_occurrences_1"
            assert f"{index} (occurrence_id>? AND occurrence_id<?)" in prefix, prefix
            assert f"{index} (occurrence_id<?)" in neighbours and f"{index} (occurrence_id>?)" in neighbours
            assert "SCAN occurrences" not in prefix + neighbours
        else:
            # Index Only Scan once the visibility map is set, Index Scan before: both read the key order.
            assert re.search(r"Index (Only )?Scan using occurrences_pkey", prefix), prefix
            assert "(occurrence_id <" in prefix and "Sort" not in prefix, prefix
            assert re.search(r"Index (Only )?Scan Backward using occurrences_pkey", neighbours), neighbours
            assert (
                "(occurrence_id < wanted.value)" in neighbours
                and "(occurrence_id > wanted.value)" in neighbours
            )
            assert "Seq Scan" not in prefix + neighbours
        assert ids.candidates(connection, ids.OCCURRENCE, "occ_5555", 5) == [TWIN_A, TWIN_B]
        short = ids.shortener(connection, ids.OCCURRENCE, [TWIN_A, db.queued, None])
        assert (short(TWIN_A), short(db.queued), short(None)) == (TWIN_A[:15], db.queued[:12], "-")
    engine.dispose()


@given(prefix=st.text(min_size=1, max_size=6), tail=st.text(max_size=4), other=st.text(max_size=8))
def test_the_successor_bounds_exactly_the_strings_with_the_prefix(prefix: str, tail: str, other: str) -> None:
    def key(value: str) -> bytes:  # code-point order, as SQLite BINARY and PostgreSQL "C" compare
        return value.encode("utf-8", "surrogatepass")

    upper = ids.successor(prefix)
    candidate = prefix + tail
    assert key(prefix) <= key(candidate) and (upper is None or key(candidate) < key(upper))
    inside = key(prefix) <= key(other) and (upper is None or key(other) < key(upper))
    assert inside == other.startswith(prefix)


def test_successor_edges() -> None:
    assert ids.successor("occ_1") == "occ_2"
    assert ids.successor("a\U0010ffff") == "b"
    assert ids.successor("\ud7ff") == "\ue000"
    assert ids.successor("\U0010ffff") is None


def test_domain_migrations_by_prefix_with_short_ids(tmp_path: Path) -> None:
    path = copy_reference(tmp_path, 6)
    migration_ids = sorted(
        row["migration_id"] for row in reference_dump(6)["tables"]["scheduler_domain_migrations"]
    )
    namespace = "scheduler-domain-migration-"
    listing = invoke("migrations", "list", "--db", str(path))
    assert listing.exit_code == 0
    for migration_id in migration_ids:
        assert migration_id[: len(namespace) + 8] in listing.stdout and migration_id not in listing.stdout
    shown = run_json("migrations", "show", migration_ids[0][: len(namespace) + 6], "--db", str(path))
    assert shown["migration"]["id"] == migration_ids[0]
    if len(migration_ids) > 1:
        error = run_json("migrations", "show", namespace, "--db", str(path), exit_code=2)["error"]
        assert error["code"] == "CLI_AMBIGUOUS_ID"
    unknown = invoke("migrations", "show", "nope", "--db", str(path), "--json")
    assert unknown.exit_code == 1 and json.loads(unknown.stdout)["error"]["code"].endswith("NOT_FOUND")
