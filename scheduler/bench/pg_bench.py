"""``scheduler bench --backend postgresql --db URL``: the store on a PostgreSQL server.

Everything runs in a schema of its own (``scheduler_bench_<pid>``, plus ``…_floor`` for the
commit floor's scratch table, since the scheduler's schema must hold only its own tables); both
are dropped at the end. Each figure is measured in ``rounds`` rounds and reported as the median
(every round's value is kept in the JSON):

* the commit floor: a one-row ``INSERT`` + ``COMMIT`` on the scratch table, through the same
  driver, in the same run;
* ``enqueue_occurrence``/s; single-worker cycles/s, two-call (``claim_next`` + ``settle``) and
  one-commit (``settle_and_claim``), with client CPU (``process_time``) and server CPU (the
  backend's ``/proc/<pid>/stat``) per cycle;
* ``claim_next`` (and ``claim_next`` + ``settle``) latency at each queue depth; the depth is
  built with one set-based ``INSERT … SELECT generate_series`` (:mod:`scheduler.bench.pg_depth`),
  bypassing the API;
* 1, 2, 4 and 8 worker processes draining one queue (:mod:`scheduler.bench.pg_workers`): total
  cycles/s, CPU per cycle, and the exactly-once proof;
* ratios to the floor, N ÷ 1 workers (the median of each round's own ratio,
  :func:`_paired_ratio`), and one check: every occurrence settled exactly once.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Final

from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool

from scheduler.bench.context import BENCH_AUTHORITY, BENCH_JOB_ID, LEASE_MS
from scheduler.bench.pg_depth import fill_queue
from scheduler.bench.pg_server import backend_cpu_s, backend_pids, quoted
from scheduler.bench.pg_workers import enqueue_batches, run_workers, worker_engine

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class PgBenchConfig:
    """Sizes of one PostgreSQL run (``scale`` multiplies every count; depths are absolute)."""

    url: str
    rounds: int = 3
    floor_commits: int = 2_000
    enqueues: int = 1_000
    cycles: int = 1_000
    depths: tuple[int, ...] = (1_000, 1_000_000)
    depth_samples: int = 200
    workers: tuple[int, ...] = (1, 2, 4, 8)
    worker_occurrences: int = 1_000
    scale: float = 1.0

    def count(self, value: int) -> int:
        return max(10, int(value * self.scale))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def commit_floor(engine: Engine, table: str, count: int) -> float:
    """The commit floor: ``count`` one-row ``INSERT`` + ``COMMIT`` on ``table`` (quoted; a scratch
    table with a ``bigint`` column ``v``) through ``engine``'s driver, on a connection of its own;
    commits/s."""
    raw: Any = engine.raw_connection()
    try:
        cursor = raw.cursor()
        sql = f"INSERT INTO {table} (v) VALUES (%s)"
        started = time.perf_counter()
        for index in range(count):
            cursor.execute(sql, (index,))
            raw.commit()
        return count / (time.perf_counter() - started)
    finally:
        raw.close()


class _Bench:
    """One run: the engines, the bench schema's store and the collected rounds."""

    def __init__(self, config: PgBenchConfig, progress: Progress) -> None:
        self.config = config
        self.progress = progress
        self.schema = f"scheduler_bench_{os.getpid()}"
        self.floor_schema = f"{self.schema}_floor"
        self.admin = create_engine(config.url, poolclass=NullPool)
        self.tag = f"bench_single_{os.getpid()}"
        self.engine = worker_engine(config.url, self.tag)
        self.rounds: dict[str, list[float]] = {}
        self.workers: list[dict[str, Any]] = []

    def record(self, key: str, value: float) -> None:
        self.rounds.setdefault(key, []).append(round(value, 4))

    def open(self) -> Any:
        from scheduler import open_store

        self._drop()
        store = open_store(self.engine, schema=self.schema)
        store.create_job(id=BENCH_JOB_ID, kind="bench", authority=BENCH_AUTHORITY)
        with self.admin.begin() as connection:
            connection.exec_driver_sql(f"CREATE SCHEMA {quoted(self.admin, self.floor_schema)}")
            connection.exec_driver_sql(
                f"CREATE TABLE {quoted(self.admin, self.floor_schema)}.floor "
                "(id bigserial PRIMARY KEY, v bigint)"
            )
        return store

    def _drop(self) -> None:
        with self.admin.begin() as connection:
            for name in (self.schema, self.floor_schema):
                connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {quoted(self.admin, name)} CASCADE")

    def close(self, store: Any) -> None:
        store.close()
        self._drop()
        self.engine.dispose()
        self.admin.dispose()

    # --------------------------------------------------------------------- measurements

    def floor(self) -> None:
        count = self.config.count(self.config.floor_commits)
        table = f"{quoted(self.engine, self.floor_schema)}.floor"
        self.record("floor_commits_per_s", commit_floor(self.engine, table, count))

    def _server_cpu(self) -> float | None:
        return backend_cpu_s(backend_pids(self.admin, self.tag))

    def enqueue(self, store: Any, prefix: str) -> None:
        count = self.config.count(self.config.enqueues)
        base = int(time.time() * 1000) + 1_000_000_000  # not due: later phases never claim them
        started = time.perf_counter()
        for index in range(count):
            store.enqueue_occurrence(
                job_id=BENCH_JOB_ID, scheduled_for=base + index, trigger_key=f"{prefix}-{index}"
            )
        self.record("enqueue_per_s", count / (time.perf_counter() - started))

    def _queue(self, store: Any, prefix: str, count: int) -> None:
        enqueue_batches(store, prefix, count, int(time.time() * 1000) - 1_000_000_000)

    def cycles(self, store: Any, prefix: str, one_commit: bool) -> None:
        count = self.config.count(self.config.cycles)
        self._queue(store, prefix, count + 1)
        key = "settle_and_claim" if one_commit else "claim_settle"
        server_before, client_before = self._server_cpu(), time.process_time()
        started = time.perf_counter()
        held = store.claim_next(owner_id="bench", lease_ms=LEASE_MS)
        for _ in range(count):
            settle = {
                "occurrence_id": held.id,
                "owner_id": "bench",
                "fence": held.fence,
                "outcome": "succeeded",
            }
            if one_commit:
                held = store.settle_and_claim(**settle, lease_ms=LEASE_MS).claimed
            else:
                store.settle(**settle)
                held = store.claim_next(owner_id="bench", lease_ms=LEASE_MS)
        seconds = time.perf_counter() - started
        client, server_after = time.process_time() - client_before, self._server_cpu()
        store.settle(occurrence_id=held.id, owner_id="bench", fence=held.fence, outcome="succeeded")
        self.record(f"{key}_cycles_per_s", count / seconds)
        self.record(f"{key}_client_cpu_us", client / count * 1e6)
        if server_before is not None and server_after is not None:
            self.record(f"{key}_server_cpu_us", (server_after - server_before) / count * 1e6)

    def latency(self, store: Any, depth: int) -> None:
        samples = self.config.count(self.config.depth_samples)
        claim: list[float] = []
        cycle: list[float] = []
        for _ in range(samples):
            started = time.perf_counter()
            held = store.claim_next(owner_id="bench", lease_ms=LEASE_MS)
            claimed = time.perf_counter()
            store.settle(occurrence_id=held.id, owner_id="bench", fence=held.fence, outcome="succeeded")
            claim.append(claimed - started)
            cycle.append(time.perf_counter() - started)
        claim.sort()
        self.record(f"depth_{depth}_claim_next_median_ms", _median(claim) * 1000)
        self.record(f"depth_{depth}_claim_next_p99_ms", claim[max(0, int(len(claim) * 0.99) - 1)] * 1000)
        self.record(f"depth_{depth}_claim_settle_median_ms", _median(cycle) * 1000)

    def grow_to(self, depth: int, built: int) -> int:
        """Add queued rows (set-based) so the queue holds ``depth`` due rows; returns the new total."""
        started = time.perf_counter()
        with self.engine.begin() as connection:
            fill_queue(
                connection,
                self.schema,
                BENCH_JOB_ID,
                depth - built,
                due_at=int(time.time() * 1000),
                prefix=f"d{depth}",
            )
        self.progress(f"depth {depth}: {depth - built} rows in {time.perf_counter() - started:.1f} s")
        return depth

    def worker_runs(self, store: Any, round_index: int) -> None:
        for workers in self.config.workers:
            run = run_workers(
                self.config.url,
                self.schema,
                self.admin,
                store,
                workers,
                self.config.count(self.config.worker_occurrences),
                f"{os.getpid()}_{round_index}_{workers}",
            )
            self.progress(f"round {round_index + 1}: {workers} workers {run.cycles_per_s:.0f} cycles/s")
            self.workers.append({"round": round_index + 1, **asdict(run), "cycles_per_s": run.cycles_per_s})
            self.record(f"workers_{workers}_cycles_per_s", run.cycles_per_s)
            if run.cycles:
                self.record(f"workers_{workers}_client_cpu_us", run.client_cpu_s / run.cycles * 1e6)
                if run.server_cpu_s is not None:
                    self.record(f"workers_{workers}_server_cpu_us", run.server_cpu_s / run.cycles * 1e6)


def run_pg_bench(
    config: PgBenchConfig, progress: Progress = lambda _line: None, command: str = ""
) -> dict[str, Any]:
    """Run every PostgreSQL measurement ``config.rounds`` times; the result as a JSON-ready dict."""
    bench = _Bench(config, progress)
    store = bench.open()
    try:
        for index in range(config.rounds):
            bench.floor()
            bench.enqueue(store, f"e{index}")
            bench.cycles(store, f"c{index}", one_commit=False)
            bench.cycles(store, f"s{index}", one_commit=True)
            progress(f"round {index + 1}: floor {bench.rounds['floor_commits_per_s'][-1]:.0f} commits/s")
        for index in range(config.rounds):
            bench.worker_runs(store, index)
        built = 0
        for depth in config.depths:
            built = bench.grow_to(depth, built)
            for _ in range(config.rounds):
                bench.latency(store, depth)
    finally:
        bench.close(store)
    return summarize(config, bench.rounds, bench.workers, command)


def _paired_ratio(workers: list[dict[str, Any]], many: int, one: int) -> float | None:
    """The median over rounds of (``many`` workers' cycles/s ÷ ``one`` worker's, same round): the
    two runs of a round are minutes apart at most, so a machine that slows down or speeds up
    between rounds moves both sides of each ratio alike."""
    by_round: dict[int, dict[int, float]] = {}
    for run in workers:
        by_round.setdefault(run["round"], {})[run["workers"]] = run["cycles_per_s"]
    ratios = [runs[many] / runs[one] for runs in by_round.values() if runs.get(one) and many in runs]
    return _median(ratios) if ratios else None


def summarize(
    config: PgBenchConfig, rounds: dict[str, list[float]], workers: list[dict[str, Any]], command: str
) -> dict[str, Any]:
    medians = {key: _median(values) for key, values in rounds.items()}
    floor = medians["floor_commits_per_s"]
    ratios = {
        key.replace("_per_s", "_to_floor"): value / floor
        for key, value in medians.items()
        if key.endswith("cycles_per_s") or key == "enqueue_per_s"
    }
    scaling = {
        f"workers_{many}_to_1": _paired_ratio(workers, many, 1) for many in config.workers if many > 1
    }
    exactly_once = all(
        run["settled_exactly_once"] == run["occurrences"] == run["claimed_once"] for run in workers
    )
    targets = {
        "every_occurrence_settled_exactly_once": {"value": exactly_once, "target": True, "met": exactly_once}
    }
    config_dict = {
        key: list(value) if isinstance(value, tuple) else value for key, value in asdict(config).items()
    }
    config_dict["url"] = _without_password(config.url)
    return {
        "backend": "postgresql",
        "command": command,
        "config": config_dict,
        "medians": medians,
        "rounds": rounds,
        "ratios_to_floor": ratios,
        "scaling": scaling,
        "workers": workers,
        "targets": targets,
        "server_version": _server_version(config.url),
    }


def _without_password(url: str) -> str:
    from sqlalchemy import make_url

    return make_url(url).render_as_string(hide_password=True)


def _server_version(url: str) -> str | None:
    engine: Engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return str(connection.exec_driver_sql("SHOW server_version").scalar_one())
    except Exception:
        return None
    finally:
        engine.dispose()


_ROWS: Final = (
    ("floor_commits_per_s", "commit floor: one-row INSERT + COMMIT", "commits/s"),
    ("enqueue_per_s", "enqueue_occurrence", "ops/s"),
    ("claim_settle_cycles_per_s", "1 worker: claim_next + settle (two commits)", "cycles/s"),
    ("settle_and_claim_cycles_per_s", "1 worker: settle_and_claim (one commit)", "cycles/s"),
)


def _cell(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None or value != value else f"{value:,.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    """The run as Markdown tables (medians of the rounds; ratios to the commit floor)."""
    medians: dict[str, float] = result["medians"]
    floor = medians["floor_commits_per_s"]
    rounds = result["config"]["rounds"]
    lines = [
        f"PostgreSQL {result['server_version']}, medians of {rounds} rounds. Command: `{result['command']}`",
        "",
        "| figure | value | × floor | client CPU µs/cycle | server CPU µs/cycle |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label, unit in _ROWS:
        value = medians.get(key)
        stem = key.replace("_cycles_per_s", "")
        ratio = "" if key == "floor_commits_per_s" or value is None else f"{value / floor:.2f}"
        client = medians.get(f"{stem}_client_cpu_us") if "cycles" in key else None
        server = medians.get(f"{stem}_server_cpu_us") if "cycles" in key else None
        lines.append(f"| {label} | {_cell(value)} {unit} | {ratio} | {_cell(client)} | {_cell(server)} |")
    for workers in result["config"]["workers"]:
        value = medians.get(f"workers_{workers}_cycles_per_s")
        client = medians.get(f"workers_{workers}_client_cpu_us")
        server = medians.get(f"workers_{workers}_server_cpu_us")
        ratio = "" if value is None else f"{value / floor:.2f}"
        label = f"{workers} worker process{'es' if workers > 1 else ''}: settle_and_claim, total"
        lines.append(f"| {label} | {_cell(value)} cycles/s | {ratio} | {_cell(client)} | {_cell(server)} |")
    lines += [
        "",
        "| queue depth | claim_next median ms | claim_next p99 ms | claim_next + settle median ms |",
    ]
    lines.append("|---:|---:|---:|---:|")
    for depth in result["config"]["depths"]:
        cells = [
            medians.get(f"depth_{depth}_{name}")
            for name in ("claim_next_median_ms", "claim_next_p99_ms", "claim_settle_median_ms")
        ]
        lines.append(f"| {depth:,} | " + " | ".join(_cell(cell, 2) for cell in cells) + " |")
    runs = result["workers"]
    proven = sum(run["settled_exactly_once"] for run in runs)
    total = sum(run["occurrences"] for run in runs)
    lines += [
        "",
        f"Exactly once: {proven:,} of {total:,} occurrences in {len(runs)} worker runs settled exactly once "
        f"and claimed once (counted in `occurrences` and `events`).",
    ]
    if result["scaling"]:
        lines += ["", "| workers | cycles/s ÷ 1 worker's (median of each round's ratio) |", "|---:|---:|"]
        for name, ratio in result["scaling"].items():
            lines.append(f"| {name.split('_')[1]} | {_cell(ratio, 2)} |")
    return "\n".join(lines) + "\n"
