"""``scheduler bench --backend postgresql``: a tiny run on the test server (structure, exactly once).

Sizes are scaled to a few dozen operations, one round, depths of 50 and 500 rows and 1 and 2
worker processes, so the run takes seconds; the figures themselves mean nothing here.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from backends import PostgresServer
from process_support import bench_stopped_with_sigterm
from typer.testing import CliRunner

from scheduler.bench.context import BENCH_JOB_ID
from scheduler.bench.pg_bench import PgBenchConfig, markdown, run_pg_bench
from scheduler.bench.pg_workers import WARM_UP_CYCLES, WARM_UP_MIN_ROUNDS, WARM_UP_ROUNDS, run_workers

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def result(postgres_server: PostgresServer) -> dict[str, Any]:
    url = postgres_server.url.render_as_string(hide_password=False)
    config = PgBenchConfig(
        url=url,
        rounds=1,
        floor_commits=40,
        enqueues=20,
        cycles=20,
        depths=(50, 500),
        depth_samples=10,
        workers=(1, 2),
        worker_occurrences=40,
    )
    return run_pg_bench(config, command="test")


def test_the_run_reports_every_figure(result: dict[str, Any]) -> None:
    medians = result["medians"]
    for key in (
        "floor_commits_per_s",
        "enqueue_per_s",
        "claim_settle_cycles_per_s",
        "settle_and_claim_cycles_per_s",
        "claim_settle_client_cpu_us",
        "settle_and_claim_client_cpu_us",
        "depth_50_claim_next_median_ms",
        "depth_500_claim_next_p99_ms",
        "workers_1_cycles_per_s",
        "workers_2_cycles_per_s",
        "workers_2_client_cpu_us",
    ):
        assert medians[key] > 0, key
    assert set(result["ratios_to_floor"]) >= {"enqueue_to_floor", "settle_and_claim_cycles_to_floor"}
    assert result["backend"] == "postgresql" and result["server_version"]
    assert "password" not in result["config"]["url"]
    table = markdown(result)
    assert "commit floor" in table and "| 500 |" in table and "2 worker processes" in table
    assert "cycles/s ÷ 1 worker's" in table


def test_every_worker_run_settled_each_occurrence_exactly_once(result: dict[str, Any]) -> None:
    runs = result["workers"]
    assert [run["workers"] for run in runs] == [1, 2]
    for run in runs:
        assert run["settled_exactly_once"] == run["claimed_once"] == run["occurrences"] == 40
        assert run["cycles"] == 40  # the warm-up cycles are not counted
        assert run["warmed_least"] >= WARM_UP_CYCLES  # every worker was warmed up
        # ... over rounds enough that the run's first claim met the state a round leaves
        assert WARM_UP_MIN_ROUNDS <= run["warm_up_rounds"] <= WARM_UP_ROUNDS
    assert result["targets"]["every_occurrence_settled_exactly_once"]["met"] is True
    # The one check: no rate is a target, the ratio of N workers to one is a figure.
    assert set(result["targets"]) == {"every_occurrence_settled_exactly_once"}
    assert set(result["scaling"]) == {"workers_2_to_1"} and result["scaling"]["workers_2_to_1"] > 0


def test_the_bench_schemas_are_dropped(result: dict[str, Any], postgres_server: PostgresServer) -> None:
    mine = f"scheduler_bench_{os.getpid()}"
    with postgres_server.engine.connect() as connection:
        names = {row[0] for row in connection.exec_driver_sql("SELECT nspname FROM pg_namespace")}
    assert {mine, f"{mine}_floor"} & names == set()


def test_the_command_needs_a_url() -> None:
    import typer

    from scheduler.bench import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    outcome = CliRunner().invoke(app, ["bench", "--backend", "postgresql"])
    assert outcome.exit_code == 2
    assert "--db" in outcome.output


def test_the_scaling_ratio_pairs_the_runs_of_each_round() -> None:
    """4 workers ÷ 1 worker is taken round by round (runs minutes apart at most), then the median."""
    from scheduler.bench.pg_bench import _paired_ratio

    runs = [
        {"round": 1, "workers": 1, "cycles_per_s": 400.0},  # a slow round: the machine was busy
        {"round": 1, "workers": 4, "cycles_per_s": 600.0},
        {"round": 2, "workers": 1, "cycles_per_s": 800.0},
        {"round": 2, "workers": 4, "cycles_per_s": 1600.0},
        {"round": 3, "workers": 4, "cycles_per_s": 1000.0},
        {"round": 3, "workers": 1, "cycles_per_s": 800.0},
        {"round": 4, "workers": 4, "cycles_per_s": 900.0},  # no 1-worker run: not paired
    ]
    assert _paired_ratio(runs, 4, 1) == 1.5  # median of 1.5, 2.0, 1.25 (ratio of medians: 1.19)
    assert _paired_ratio(runs, 8, 1) is None


def test_a_worker_that_fails_fails_the_run_at_once_with_its_error(postgres_server: PostgresServer) -> None:
    """A worker that cannot connect (a database that does not exist) fails the run with its own
    error, without waiting out the start or run timeouts."""
    from scheduler import open_store

    engine = postgres_server.engine
    schema = f"bench_failing_{os.getpid()}"
    bad_url = postgres_server.url.set(database="no_such_database_here").render_as_string(hide_password=False)
    store = open_store(engine, schema=schema)
    try:
        store.create_job(
            id=BENCH_JOB_ID, kind="bench", authority={"principal": {"type": "service", "id": "b"}}
        )
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"a bench worker failed: .*SCHEDULER_STORAGE_UNAVAILABLE"):
            run_workers(bad_url, schema, engine, store, 2, 10, "failing")
        assert time.monotonic() - started < 60
    finally:
        store.close()
        with engine.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')


def test_each_worker_run_starts_on_a_vacuumed_analyzed_queue(postgres_server: PostgresServer) -> None:
    """Before its workers are released, a run ``VACUUM (ANALYZE)``s ``occurrences`` (as autovacuum
    would; the test server runs without it), so no run reads the dead entries of the runs before."""
    from scheduler import open_store

    engine = postgres_server.engine
    url = postgres_server.url.render_as_string(hide_password=False)
    schema = f"bench_vacuumed_{os.getpid()}"
    store = open_store(engine, schema=schema)
    try:
        store.create_job(
            id=BENCH_JOB_ID, kind="bench", authority={"principal": {"type": "service", "id": "b"}}
        )
        run = run_workers(url, schema, engine, store, 1, 10, "vacuumed")
        assert run.settled_exactly_once == 10
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            counts = connection.exec_driver_sql(
                "SELECT vacuum_count, analyze_count FROM pg_stat_user_tables "
                "WHERE schemaname = %(schema)s AND relname = 'occurrences'",
                {"schema": schema},
            ).one()
        assert tuple(counts) == (1, 1)
    finally:
        store.close()
        with engine.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')


def test_a_run_stopped_with_sigterm_drops_its_schemas(postgres_server: PostgresServer) -> None:
    """``kill`` (SIGTERM) of a running ``scheduler bench --backend postgresql``, while its worker
    processes drain the queue, exits with 143 through the run's cleanup: its schemas are dropped
    and none of its connections (its own or its workers') is left."""
    url = postgres_server.url.render_as_string(hide_password=False)

    def reached(run: subprocess.Popen[bytes]) -> bool:
        if _connections(postgres_server, f"^bench_worker_{run.pid}_") == 0:
            return False
        assert _bench_schemas(postgres_server, _schemas(run.pid)) == _schemas(run.pid)
        return True

    pid = bench_stopped_with_sigterm(
        ["--backend", "postgresql", "--db", url, "--rounds", "1", "--scale", "0.5"], reached
    )
    mine = _schemas(pid)
    its_connections = f"^bench_(single|worker)_{pid}(_|$)"
    assert _bench_schemas(postgres_server, mine) == set()
    deadline = time.monotonic() + 10  # a backend exits just after its client has gone
    while _connections(postgres_server, its_connections) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _connections(postgres_server, its_connections) == 0


def _schemas(pid: int) -> set[str]:
    """The schemas of the bench run ``pid``."""
    return {f"scheduler_bench_{pid}", f"scheduler_bench_{pid}_floor"}


def _connections(server: PostgresServer, application_name: str) -> int:
    """Connections whose ``application_name`` matches the regular expression."""
    with server.engine.connect() as connection:
        count: int = connection.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name ~ %(name)s",
            {"name": application_name},
        ).scalar_one()
        return count


def _bench_schemas(server: PostgresServer, names: set[str]) -> set[str]:
    with server.engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%(names)s)", {"names": sorted(names)}
        )
        return {row[0] for row in rows}
