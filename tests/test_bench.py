"""The benchmark suite: a tiny end-to-end run, its JSON, the depth builder's rows, degradation."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from process_support import bench_stopped_with_sigterm, group_members
from typer.testing import CliRunner

from scheduler import open_store
from scheduler.bench import register, schema_floor
from scheduler.bench.adversarial import CASES
from scheduler.bench.context import LEASE_MS, NullProgress, make_config
from scheduler.bench.depth import DepthBuilder, depth_job
from scheduler.bench.latency import depth_label
from scheduler.bench.model import GROUP_THROUGHPUT, Spec, Unavailable
from scheduler.bench.runner import run_scenario
from scheduler.bench.scenarios import Scenario
from scheduler.bench.stores import open_bench_store

REPO = Path(__file__).resolve().parents[1]
EXPECTED_FIGURES = {
    "floor_commits_per_s",
    "enqueue_occurrence_per_s",
    "enqueue_many_items_per_s",
    "claim_settle_cycles_per_s",
    "settle_and_claim_cycles_per_s",
    "claim_batch_settle_items_per_s",
    "claim_batch_items_per_s",
    "workers_cycles_per_s",
    "workers_settled_exactly_once",
    "rss_worker_peak_mb",
    "history_limit50_ms",
    "history_limit50_peak_kib",
    "rss_at_max_depth_mb",
    "rss_bench_peak_mb",
    *(f"adv_{case.key}_ms" for case in CASES),
    "adv_fleet_workers_cycles",
    "adv_fleet_workers_busy",
}
DEPTH_METRICS = (
    "claim_settle_median_ms",
    "claim_settle_p99_ms",
    "claim_next_median_ms",
    "claim_next_p99_ms",
    "claim_occurrence_median_ms",
    "rss_mb",
)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``python -m scheduler.bench --quick --json out.json`` at 1 % of the quick sizes."""
    workdir = tmp_path_factory.mktemp("bench")
    out = workdir / "out.json"
    env = {**os.environ, "SCHEDULER_BENCH_SCALE": "0.01", "PYTHONPATH": str(REPO), "COLUMNS": "160"}
    command = [sys.executable, "-m", "scheduler.bench", "--quick", "--json", str(out), "--dir", str(workdir)]
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "Targets" in completed.stdout
    data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    data["_workdir"] = workdir
    return data


def test_json_has_the_run_description(quick_run: dict[str, Any]) -> None:
    assert quick_run["schema"] == "scheduler-bench/1"
    assert quick_run["command"].startswith("python -m scheduler.bench --quick --json ")
    assert quick_run["mode"] == "quick, scale 0.01"
    machine = quick_run["machine"]
    assert machine["nproc"] >= 1
    assert machine["python"] == sys.version.split()[0]
    assert machine["sqlite"] == sqlite3.sqlite_version
    assert quick_run["config"]["quick"] is True
    assert quick_run["floor_commits_per_s"] > 0
    assert quick_run["elapsed_s"] > 0


def test_every_figure_is_measured_and_positive(quick_run: dict[str, Any]) -> None:
    figures = {figure["key"]: figure for figure in quick_run["figures"]}
    depths = quick_run["config"]["depths"]
    assert len(depths) >= 2
    expected = EXPECTED_FIGURES | {f"depth_{depth}_{metric}" for depth in depths for metric in DEPTH_METRICS}
    assert set(figures) == expected
    for key, figure in figures.items():
        assert figure["na"] is None, (key, figure["na"])
        if key == "adv_fleet_workers_busy":  # a count of failures: zero is the goal
            assert figure["value"] == 0, figure
            continue
        assert isinstance(figure["value"], float) and figure["value"] > 0, key
        if figure["kind"] in ("rate", "latency"):
            assert figure["ratio_to_floor"] > 0, key
    assert figures["floor_commits_per_s"]["ratio_to_floor"] == 1.0
    assert len(figures["floor_commits_per_s"]["detail"]["samples_commits_per_s"]) == 2


def test_workers_proved_exactly_once(quick_run: dict[str, Any]) -> None:
    figures = {figure["key"]: figure for figure in quick_run["figures"]}
    items = quick_run["config"]["worker_items"]
    proof = figures["workers_settled_exactly_once"]
    settled = sum(figures["workers_cycles_per_s"]["detail"]["per_worker"])
    assert proof["value"] == settled > 0
    assert proof["detail"]["occurrences"] == items
    assert proof["detail"]["succeeded"] == settled
    assert proof["detail"]["untouched"] == items - settled  # --quick may stop the workers early
    assert proof["detail"]["settled_not_once"] == 0
    assert proof["detail"]["claim_events"] == settled
    targets = {target["name"]: target for target in quick_run["targets"]}
    assert targets["4 processes: exactly once"]["met"] is True


def test_the_targets_are_the_machine_independent_checks(quick_run: dict[str, Any]) -> None:
    """No rate is a target (rates depend on the machine's disk); the checks are exactly once,
    claims independent of the depth, and bounded memory, each with its observation."""
    targets = {target["name"]: target for target in quick_run["targets"]}
    label = depth_label(max(quick_run["config"]["depths"]))
    assert set(targets) == {
        "4 processes: exactly once",
        "depth-independent claim_next",
        "depth-independent claim_occurrence",
        f"memory at {label} depth",
        "history(limit=50) stays bounded",
    }
    for target in targets.values():
        assert target["observed"] and not target["observed"].startswith("n/a"), target


def test_temporary_databases_are_removed(quick_run: dict[str, Any]) -> None:
    assert list(quick_run["_workdir"].glob("scheduler-bench-*")) == []


def test_depth_rows_are_what_enqueue_writes(tmp_path: Path) -> None:
    path = tmp_path / "depth.sqlite"
    store = open_bench_store(path)
    try:
        builder = DepthBuilder(path, depth_job(store))
        builder.add(3)
        built = store.get_occurrence(builder.occurrence_id(1))
        assert built is not None and built.status == "queued" and built.trigger_key == "depth-00000001"
        again = store.enqueue_occurrence(
            job_id="bench", scheduled_for=builder.base + 1, trigger_key=builder.trigger_key(1)
        )
        assert again.deduplicated is True
        assert again.replace(deduplicated=None) == built
        fresh = store.enqueue_occurrence(job_id="bench", scheduled_for=builder.base + 3, trigger_key="other")
        same = ("job_revision", "status", "attempt", "max_attempts", "fence", "authority", "payload")
        assert all(getattr(fresh, name) == getattr(built, name) for name in same)
        events = store.history(occurrence_id=built.id)
        assert [(event.type, event.data) for event in events] == [
            (
                "occurrence_enqueued",
                {"jobRevision": 1, "scheduledFor": builder.base + 1, "triggerKey": "depth-00000001"},
            )
        ]
    finally:
        store.close()


def test_the_schema_floor_makes_the_row_changes_the_store_makes(tmp_path: Path) -> None:
    path = tmp_path / "floor.sqlite"
    store = open_bench_store(path)
    try:
        builder = DepthBuilder(path, depth_job(store))
        builder.add(2)
        raw = schema_floor.connect(path)
        try:
            schema_floor.cycle(raw)  # claims and settles the head: index 0
        finally:
            raw.close()
        claimed = store.claim_next(owner_id=schema_floor.OWNER, lease_ms=LEASE_MS)
        assert claimed is not None and claimed.id == builder.occurrence_id(1)
        store.settle(
            occurrence_id=claimed.id, owner_id=schema_floor.OWNER, fence=claimed.fence, outcome="succeeded"
        )

        def written(index: int) -> tuple[Any, ...]:
            occurrence = store.get_occurrence(builder.occurrence_id(index))
            assert occurrence is not None and occurrence.settled_at is not None
            events = store.history(occurrence_id=occurrence.id)  # newest first; the enqueue's is last
            return (
                occurrence.status,
                occurrence.attempt,
                occurrence.fence,
                occurrence.lease_owner,
                occurrence.lease_expires_at,
                [(event.type, event.owner_id, event.fence, event.data) for event in events[:-1]],
            )

        assert written(0) == written(1)
        assert written(0)[0] == "succeeded"
        assert [row[0] for row in written(0)[-1]] == ["occurrence_succeeded", "occurrence_claimed"]
    finally:
        store.close()


def test_missing_store_methods_become_na_figures(tmp_path: Path) -> None:
    spec = Spec("stand_in_per_s", "stand-in", "ops/s", "rate", GROUP_THROUGHPUT)

    def missing(_ctx: Any, _record: Any) -> None:
        raise Unavailable("SchedulerStore.enqueue_many is not implemented yet")

    from scheduler.bench.context import Context

    ctx = Context(make_config(quick=True, scale=0.01), tmp_path, NullProgress())
    (figure,) = run_scenario(Scenario("stand-in", lambda _config: [spec], missing), ctx)
    assert figure.value is None
    assert figure.na == "n/a: SchedulerStore.enqueue_many is not implemented yet"


def test_register_adds_the_bench_command() -> None:
    app = typer.Typer()
    register(app)

    @app.command("other")
    def other() -> None:  # a second command so Typer keeps command names
        """Nothing."""

    result = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for option in ("--quick", "--json", "--scale", "--depths", "--workers", "--markdown", "--backend"):
        assert option in result.output


def test_open_store_is_the_benchmarked_store(tmp_path: Path) -> None:
    # The bench opens stores exactly as users do: WAL and synchronous=FULL on the file.
    store = open_bench_store(tmp_path / "pragmas.sqlite")
    store.close()
    with open_store(tmp_path / "pragmas.sqlite") as reopened:
        assert reopened.get_job("bench") is not None
        journal = reopened.connection.exec_driver_sql("PRAGMA journal_mode").scalar()
        synchronous = reopened.connection.exec_driver_sql("PRAGMA synchronous").scalar()
    assert journal == "wal"
    assert synchronous == 2


@pytest.mark.parametrize("when", ["first-database", "worker-processes"])
def test_a_run_stopped_with_sigterm_removes_its_databases(tmp_path: Path, when: str) -> None:
    """``kill`` (SIGTERM) of a running ``scheduler bench``, once it wrote its first database or
    while its worker processes run, exits with 143 after stopping those processes (none outlives
    the run) and removing its temporary databases."""

    def reached(run: subprocess.Popen[bytes]) -> bool:
        if when == "first-database":
            return bool(list(tmp_path.glob("scheduler-bench-*/*")))
        return bool(group_members(run.pid, "spawn_main"))

    bench_stopped_with_sigterm(
        ["--quick", "--dir", str(tmp_path)],
        reached,
        environment={"SCHEDULER_BENCH_SCALE": "0.05"},
        timeout_s=90,
    )
    assert list(tmp_path.glob("scheduler-bench-*")) == []
