"""``scheduler --db postgresql+psycopg://… --schema NAME`` for init, upgrade, verify and info.

The read commands (jobs, occurrences, history, dead letters, adjudication, info) run on both
backends in ``test_cli``; here is what only a PostgreSQL schema has: created by ``init`` in one
transaction, upgraded from an older version, verified against ``SCHEMA_VN_PG_FINGERPRINT``, and
never created by a read command or by ``upgrade``. Each test gets a fresh schema (``pg_schema``).
"""

from __future__ import annotations

from typing import Any

import pytest
import typer.core
import typer.main
from cli_support import invoke, run_json
from cli_support import isolated_environment as isolated_environment
from sqlalchemy import Engine, text

from scheduler.cli import app
from scheduler.schema import SCHEMA_V6_PG_FINGERPRINT
from scheduler.schema.upgrade import apply_upgrade
from scheduler.testing import T0


@pytest.fixture
def url(pg_engine: Engine) -> str:
    return pg_engine.url.render_as_string(hide_password=False)


def schema_exists(engine: Engine, schema: str) -> bool:
    with engine.connect() as connection:
        found = connection.execute(text("SELECT 1 FROM pg_namespace WHERE nspname = :name"), {"name": schema})
        return found.first() is not None


def at(url: str, schema: str, *args: str) -> tuple[str, ...]:
    """``--db URL --schema NAME`` (global options) before the command's own arguments."""
    return ("--db", url, "--schema", schema, *args)


def test_init_creates_v6_in_the_schema_and_reports_the_pg_fingerprint(url: str, pg_schema: str) -> None:
    dry = run_json(*at(url, pg_schema, "init", "--dry-run"))
    assert (dry["fromVersion"], dry["dryRun"], dry["fingerprint"]) == (0, True, None)
    assert dry["database"].endswith(f"(schema {pg_schema})")
    created = run_json(*at(url, pg_schema, "init"))
    assert (created["fromVersion"], created["toVersion"]) == (0, 6)
    current = invoke(*at(url, pg_schema, "upgrade", "--sql"))
    assert current.exit_code == 0 and f"(schema {pg_schema}) is already at v6" in current.stdout
    assert [step["version"] for step in created["steps"]] == [1, 2, 3, 4, 5, 6]
    assert created["fingerprint"] == SCHEMA_V6_PG_FINGERPRINT
    again = run_json(*at(url, pg_schema, "upgrade"))
    assert (again["fromVersion"], again["steps"]) == (6, [])
    assert "v0 -> v6" not in invoke(*at(url, pg_schema, "init")).stdout


def test_dry_run_upgrade_and_read_commands_never_create_the_schema(
    url: str, pg_schema: str, pg_engine: Engine
) -> None:
    assert run_json(*at(url, pg_schema, "init", "--dry-run"))["steps"]
    missing = run_json(*at(url, pg_schema, "upgrade"), exit_code=1)["error"]
    assert missing["code"] == "SCHEDULER_NOT_FOUND"
    for command in (["jobs", "list"], ["history"], ["dead-letters"], ["stats"], ["controls", "list"]):
        error = run_json(*at(url, pg_schema, *command), exit_code=1)["error"]
        assert error["code"] == "SCHEDULER_SCHEMA_UNKNOWN", command
    prune = invoke(*at(url, pg_schema, "prune", "--older-than", "30d"))
    assert prune.exit_code == 1 and "SCHEDULER_NOT_FOUND" in prune.stderr
    assert not schema_exists(pg_engine, pg_schema)


def test_the_old_per_command_schema_spelling_still_works_and_wins(
    url: str, pg_schema: str, pg_engine: Engine
) -> None:
    created = run_json("--schema", "never_this_one", "init", "--db", url, "--schema", pg_schema)
    assert created["database"].endswith(f"(schema {pg_schema})")
    assert not schema_exists(pg_engine, "never_this_one")
    assert run_json(*at(url, pg_schema, "jobs", "list"))["count"] == 0


def test_upgrade_takes_a_v3_schema_to_v6(url: str, pg_schema: str, pg_engine: Engine) -> None:
    with pg_engine.begin() as connection:
        apply_upgrade(connection, 0, T0, to_version=3, schema=pg_schema)
    old = run_json(*at(url, pg_schema, "history"), exit_code=1)["error"]
    assert old["code"] == "SCHEDULER_SCHEMA_UNKNOWN" and "scheduler upgrade" in old["message"]
    pending = run_json(*at(url, pg_schema, "verify"))
    assert (pending["ok"], pending["schemaVersion"]) == (True, 3)
    dry = run_json(*at(url, pg_schema, "upgrade", "--dry-run"))
    assert [step["version"] for step in dry["steps"]] == [4, 5, 6]
    done = run_json(*at(url, pg_schema, "upgrade"))
    assert (done["fromVersion"], done["fingerprint"]) == (3, SCHEMA_V6_PG_FINGERPRINT)
    assert run_json(*at(url, pg_schema, "info"))["versions"]["schema"] == 6


def test_verify_reports_every_check_and_each_drift(url: str, pg_schema: str, pg_engine: Engine) -> None:
    empty = run_json(*at(url, pg_schema, "verify"), exit_code=1)
    assert [finding["check"] for finding in empty["findings"]] == ["tables"]
    run_json(*at(url, pg_schema, "init"))
    verified: dict[str, Any] = run_json(*at(url, pg_schema, "verify"))
    assert verified["ok"] is True and verified["schemaVersion"] == 6
    assert verified["fingerprint"] == verified["expectedFingerprint"] == SCHEMA_V6_PG_FINGERPRINT
    names = [check["name"] for check in verified["checks"]]
    assert {"tables", "migration-history", "fingerprint", "columns:occurrences"} <= set(names)
    assert "verified: ok" in invoke(*at(url, pg_schema, "verify")).stdout
    with pg_engine.begin() as connection:
        connection.exec_driver_sql(f'CREATE INDEX extra ON "{pg_schema}".jobs (kind)')
        connection.exec_driver_sql(f"UPDATE \"{pg_schema}\".migrations SET checksum = 'x' WHERE version = 3")
    drifted = run_json(*at(url, pg_schema, "verify"), exit_code=1)
    assert {(f["check"], f["code"]) for f in drifted["findings"]} == {
        ("fingerprint", "SCHEDULER_SCHEMA_CORRUPT"),
        ("migration-history", "SCHEDULER_SCHEMA_UNKNOWN"),
    }
    text_output = invoke(*at(url, pg_schema, "verify"))
    assert text_output.exit_code == 1 and "FAIL fingerprint" in text_output.stdout
    refused = run_json(*at(url, pg_schema, "upgrade"), exit_code=1)["error"]
    assert refused["code"] in ("SCHEDULER_SCHEMA_CORRUPT", "SCHEDULER_SCHEMA_UNKNOWN")


def test_another_driver_is_a_usage_error(pg_schema: str) -> None:
    result = invoke(*at("postgresql+asyncpg://localhost/x", pg_schema, "jobs", "list"), "--json")
    assert result.exit_code == 2
    assert "psycopg" in result.stdout


def test_demo_runs_in_the_schema_and_never_prints_a_password(
    pg_engine: Engine, pg_schema: str
) -> None:
    with_password = pg_engine.url.set(password="not-printed").render_as_string(hide_password=False)
    assert invoke(*at(with_password, pg_schema, "jobs", "list")).exit_code == 1  # no schema yet
    url = pg_engine.url.render_as_string(hide_password=False)
    report = run_json(*at(url, pg_schema, "demo"))
    assert report["database"].endswith(f"(schema {pg_schema})") and report["complete"] is True
    assert run_json(*at(url, pg_schema, "jobs", "list"))["count"] == 1
    text_output = invoke(*at(with_password, pg_schema, "demo")).stdout
    assert "not-printed" not in text_output
    # The closing hint names the same database and schema (the password hidden).
    hint = text_output.strip().splitlines()[-1]
    job = hint.rsplit(" ", 1)[-1]
    assert hint.startswith("see also: scheduler --db ") and f"--schema {pg_schema} history --job " in hint
    assert run_json(*at(url, pg_schema, "history", "--job", job))["count"] > 0


@pytest.mark.parametrize("command", [("info",), ("verify",), ("jobs", "list")])
def test_a_malformed_db_url_is_a_usage_error(command: tuple[str, ...]) -> None:
    result = invoke("--db", "postgresql+psycopg://postgres@127.0.0.1:abc/db", *command)
    assert result.exit_code == 2, result.output
    assert "CLI_USAGE" in result.output and "not a valid database URL" in result.output
    assert "Traceback" not in result.output


def _commands_taking_db() -> list[tuple[str, ...]]:
    """Every command of the CLI that has a ``--db`` option, as the words that name it."""
    found: list[tuple[str, ...]] = []

    def walk(group: Any, words: tuple[str, ...]) -> None:
        if isinstance(group, typer.core.TyperGroup):
            for name, child in group.commands.items():
                walk(child, (*words, name))
        elif any("--db" in parameter.opts for parameter in group.params):
            found.append(words)

    walk(typer.main.get_command(app), ())
    return found


def test_every_command_that_takes_db_also_takes_schema_after_it() -> None:
    """``scheduler history --db URL --schema S`` used to fail with "No such option". (``bench``
    measures in schemas of its own: its ``--db`` names only the server.)"""
    commands = [words for words in _commands_taking_db() if words != ("bench",)]
    assert {("history",), ("jobs", "list"), ("requeue",), ("worker",), ("verify",)} <= set(commands)
    for words in commands:
        result = invoke(*words, "--help")
        assert result.exit_code == 0 and "--schema" in result.stdout, words


def test_a_schema_given_after_the_command_is_the_one_read_and_written(
    url: str, pg_schema: str, pg_engine: Engine
) -> None:
    run_json(*at(url, pg_schema, "demo"))
    after = ("--db", url, "--schema", pg_schema)
    assert run_json("jobs", "list", *after)["count"] == 1
    history = run_json("--schema", "never_this_one", "history", *after)
    assert history["count"] > 0
    info = run_json("info", *after)
    assert info["database"].endswith(f"(schema {pg_schema})") and info["versions"]["schema"] == 6
    assert run_json("verify", *after)["ok"] is True
    # Another schema named after the command wins over the global one: it does not exist.
    missing = run_json(*at(url, pg_schema, "jobs", "list"), "--schema", "never_this_one", exit_code=1)
    assert missing["error"]["code"] == "SCHEDULER_SCHEMA_UNKNOWN"
    pruned = invoke("prune", "--older-than", "30d", *after)
    assert pruned.exit_code == 0, pruned.output
    assert not schema_exists(pg_engine, "never_this_one")
