"""End to end: N no-op jobs drained by each system's own worker, in interleaved rounds.

Every system runs in a process of its own, started with its own interpreter (the peers' from
their virtual environments) and driven through its public API as its users would
(``benchmarks/e2e_peers/``): it makes a fresh store, queues ``--jobs`` no-op jobs (timed apart:
the "enqueue" column) and builds its worker; then the driver says go and the worker drains the
queue. jobs/s is N over the wall time from the worker's start until all N were handled and their
outcomes committed: for the store, procrastinate and pgqueuer until the worker's run returned
(the store's worker is stopped by its N-th handler call, the other two drain and return), so
their shutdown is in it ("tail": from the last handler's return to the end); for huey and
APScheduler at the N-th completion (a huey job is done when its handler returned, an APScheduler
job at its ``JobReleased`` event), since their stop waits on timers. CPU per job: the worker
processes' CPU (``/proc/<pid>/stat``) over that drain; on PostgreSQL also the server's (its
postmaster and every child, exited backends included; other users of that server count too),
read when the server runs on this machine.

Each round runs every system once, in an order that rotates from round to round (and reverses
every other round), so all share the same disk and CPU weather. The report gives each system's
median jobs/s over rounds and, for the store, the median over rounds of the per-round ratio to
the best peer at the same concurrency (any database, and the same database).

Systems (the store's with the interpreter running this script, importing this checkout):

* the store's ``Worker`` and its ``Tasks`` worker at concurrency 1 and 8, and ``Worker`` as 4
  processes (``--procs-concurrency`` each, default 1), on SQLite and (``--pg-url``) PostgreSQL;
* procrastinate (``--venv-procrastinate``), pgqueuer (``--venv-pgqueuer``), PostgreSQL;
* huey (``--venv-huey``) and APScheduler 4 (``--venv-apscheduler``), SQLite;

each peer at concurrency 1 and 8. A peer whose virtual environment is not given is skipped (the
report says so); the PostgreSQL systems need ``--pg-url``, a database the driver may create
databases from (``e2e_<system>``, dropped afterwards). Example::

    python -m benchmarks.e2e_workers --rounds 3 --jobs 2000 \\
        --pg-url postgresql://postgres@127.0.0.1:55432/postgres \\
        --venv-procrastinate /path/venv-pg --venv-pgqueuer /path/venv-pgq \\
        --venv-huey /path/venv-huey --venv-apscheduler /path/venv-aps
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
REAP_S = 0.3
PEERS = {
    "procrastinate": "procrastinate_worker",
    "pgqueuer": "pgqueuer_worker",
    "huey": "huey_worker",
    "apscheduler": "apscheduler_worker",
}
PEER_DATABASE = {
    "procrastinate": "postgresql",
    "pgqueuer": "postgresql",
    "huey": "sqlite",
    "apscheduler": "sqlite",
}


@dataclass(frozen=True)
class System:
    key: str
    family: str  # "ours" or a key of PEERS
    database: str  # "sqlite" or "postgresql"
    concurrency: int
    processes: int = 1
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def ours(self) -> bool:
        return self.family == "ours"

    @property
    def module(self) -> str:
        return "benchmarks.e2e_peers." + ("ours" if self.ours else PEERS[self.family])


def all_systems(procs_concurrency: int) -> list[System]:
    systems = []
    for database in ("sqlite", "postgresql"):
        db = "pg" if database == "postgresql" else "sqlite"
        for api in ("worker", "tasks"):
            for concurrency in (1, 8):
                systems.append(
                    System(
                        f"ours-{api}-{db}-c{concurrency}", "ours", database, concurrency, options={"api": api}
                    )
                )
        systems.append(
            System(
                f"ours-worker-{db}-4x{procs_concurrency}",
                "ours",
                database,
                procs_concurrency,
                processes=4,
                options={"api": "worker"},
            )
        )
    for family, database in PEER_DATABASE.items():
        systems.extend(System(f"{family}-c{c}", family, database, c) for c in (1, 8))
    return systems


# ---------------------------------------------------------------------------------------- CPU


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
        return None


def process_ticks(pids: list[int]) -> int:
    """utime + stime of these processes (all their threads)."""
    total = 0
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total


def server_ticks(postmaster: int) -> int:
    """CPU of a PostgreSQL server: the postmaster's own and its reaped children's (backends that
    exited), plus every live child's."""
    fields = _stat(postmaster)
    if fields is None:
        return 0
    total = sum(int(value) for value in fields[11:15])
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            child = _stat(entry)
            if child is not None and child[1] == str(postmaster):
                total += sum(int(value) for value in child[11:15])
    return total


# ------------------------------------------------------------------------------- PostgreSQL


class Server:
    """The PostgreSQL server of ``--pg-url``: databases per system, and its postmaster's pid when
    it runs on this machine (else server CPU is not measured)."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        with psycopg.connect(admin_url, autocommit=True) as connection:
            row = connection.execute("SELECT pg_backend_pid()").fetchone()
            backend = _stat(row[0]) if row else None  # read while that backend is alive
        self.postmaster: int | None = int(backend[1]) if backend is not None else None

    def url(self, database: str) -> str:
        return urlsplit(self.admin_url)._replace(path="/" + database).geturl()

    def recreate(self, database: str, *, create: bool = True) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            if create:
                connection.execute(f'CREATE DATABASE "{database}"')

    def ticks(self) -> int | None:
        return None if self.postmaster is None else server_ticks(self.postmaster)


# ---------------------------------------------------------------------------------- adapters


class Adapter:
    """One adapter process: its protocol lines (``benchmarks/e2e_peers/protocol.py``) on stdout,
    its stderr in a log file."""

    def __init__(
        self, python: str, system: System, config: dict[str, Any], log: Path, timeout_s: float
    ) -> None:
        self.timeout_s = timeout_s
        self.log = log
        self._err = log.open("w")
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [python, "-m", system.module, json.dumps(config)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()

    def _read(self, stream: TextIO | None) -> None:
        assert stream is not None
        for line in stream:
            self._lines.put(line)
        self._lines.put("")

    def receive(self) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=self.timeout_s)
        except queue.Empty:
            raise RuntimeError(f"no answer in {self.timeout_s:.0f} s") from None
        if not line:
            raise RuntimeError(f"adapter exited {self.process.wait()}: {self.tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def send(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()

    def tail(self) -> str:
        self._err.flush()
        return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-3:])

    def close(self) -> None:
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()
        self._err.close()


@dataclass
class Bench:
    options: argparse.Namespace
    scratch: Path
    server: Server | None
    pythons: dict[str, str]

    def run_one(self, system: System, round_number: int) -> dict[str, Any]:
        jobs = self.options.jobs
        config: dict[str, Any] = {
            "jobs": jobs,
            "concurrency": system.concurrency,
            "processes": system.processes,
            **system.options,
        }
        database = f"e2e_{system.key.replace('-', '_')}"
        if system.database == "postgresql":
            assert self.server is not None
            self.server.recreate(database)
            config["target"] = self.server.url(database)
        else:
            path = self.scratch / f"{system.key}.sqlite"
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            config["target"] = str(path)
        log = self.scratch / "logs" / f"{system.key}-r{round_number}.log"
        adapter = Adapter(self.pythons[system.family], system, config, log, self.options.timeout_s)
        result: dict[str, Any] = {"system": system.key, "round": round_number}
        try:
            ready = adapter.receive()
            pids = ready["pids"]
            server = self.server.ticks() if self.server and system.database == "postgresql" else None
            client = process_ticks(pids)
            adapter.send("go")
            done = adapter.receive()
            client = process_ticks(pids) - client
            if server is not None and self.server is not None:
                time.sleep(REAP_S)  # a backend whose connection just closed counts once reaped
                server = (self.server.ticks() or 0) - server
            adapter.send("check")
            checked = adapter.receive()
            result.update(
                ok=True,
                enqueue_per_s=jobs / ready["enqueue_s"],
                wall_s=done["wall_s"],
                tail_s=done["tail_s"],
                handled=done["handled"],
                remaining=checked["remaining"],
                jobs_per_s=jobs / done["wall_s"],
                cpu_us=client / TICK / jobs * 1e6,
                server_us=None if server is None else server / TICK / jobs * 1e6,
            )
            if done["handled"] != jobs or checked["remaining"] != 0:
                result.update(
                    ok=False, error=f"handled {done['handled']}, {checked['remaining']} not completed"
                )
        except (RuntimeError, KeyError, json.JSONDecodeError) as error:
            os.killpg(adapter.process.pid, 9)
            result.update(ok=False, error=f"{error} (log {log})")
        finally:
            adapter.close()
            if system.database == "postgresql" and self.server is not None:
                self.server.recreate(database, create=False)
        return result


# ------------------------------------------------------------------------------------ report


def order_for(keys: list[str], round_number: int) -> list[str]:
    shift = round_number % len(keys)
    order = keys[shift:] + keys[:shift]
    return order if round_number % 2 == 0 else order[::-1]


def _median(values: Iterator[float | None] | list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def _compared_concurrency(system: System) -> int:
    """The peers' concurrency a system of the store is compared with: its own, or for several
    processes the largest the peers ran (8)."""
    return system.concurrency if system.processes == 1 else 8


def ratios(system: System, systems: list[System], runs: list[dict[str, Any]], same_db: bool) -> float | None:
    """Median over rounds of this system's jobs/s over the best peer's of that round (same
    concurrency; ``same_db``: the same database too)."""
    peers = [
        peer.key
        for peer in systems
        if not peer.ours
        and peer.concurrency == _compared_concurrency(system)
        and (not same_db or peer.database == system.database)
    ]
    per_round = []
    for round_number in sorted({run["round"] for run in runs}):
        rate = {
            run["system"]: run["jobs_per_s"] for run in runs if run["round"] == round_number and run["ok"]
        }
        best = max((rate[key] for key in peers if key in rate), default=None)
        if system.key in rate and best:
            per_round.append(rate[system.key] / best)
    return statistics.median(per_round) if per_round else None


def _cell(value: float | None, digits: int = 0, suffix: str = "") -> str:
    return "—" if value is None else f"{value:,.{digits}f}{suffix}"


def report(systems: list[System], runs: list[dict[str, Any]], skipped: dict[str, str]) -> str:
    lines = [
        "| system | db | concurrency | jobs/s (median) | min–max | CPU µs/job | server µs/job | tail ms"
        " | enqueue jobs/s | ÷ best peer, same concurrency | ÷ best peer, same db |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system in systems:
        mine = [run for run in runs if run["system"] == system.key and run["ok"]]
        failed = [run for run in runs if run["system"] == system.key and not run["ok"]]
        rates = [run["jobs_per_s"] for run in mine]
        concurrency = (
            str(system.concurrency) if system.processes == 1 else f"{system.processes} × {system.concurrency}"
        )
        any_db = same_db = "—"
        if system.ours:
            suffix = " (vs c8)" if system.processes > 1 else ""
            any_db = _cell(ratios(system, systems, runs, same_db=False), 2, " ×" + suffix)
            same_db = _cell(ratios(system, systems, runs, same_db=True), 2, " ×" + suffix)
        lines.append(
            f"| {system.key} | {system.database} | {concurrency} | {_cell(_median(rates))}"
            f" | {_cell(min(rates) if rates else None)}–{_cell(max(rates) if rates else None)}"
            f" | {_cell(_median([run['cpu_us'] for run in mine]))}"
            f" | {_cell(_median([run['server_us'] for run in mine]))}"
            f" | {_cell(_median([None if run['tail_s'] is None else run['tail_s'] * 1000 for run in mine]))}"
            f" | {_cell(_median([run['enqueue_per_s'] for run in mine]))}"
            f" | {any_db} | {same_db} |"
        )
        for run in failed:
            lines.append(f"|   ↳ round {run['round'] + 1} failed: {run.get('error', '?')[:200]} ||||||||||")
    if skipped:
        lines.append("")
    lines.extend(f"skipped: {key}: {reason}" for key, reason in skipped.items())
    return "\n".join(lines)


# -------------------------------------------------------------------------------------- main


def _select(systems: list[System], only: str, skip: str) -> list[System]:
    def matches(system: System, patterns: str) -> bool:
        return any(pattern and pattern in system.key for pattern in patterns.split(","))

    return [s for s in systems if (not only or matches(s, only)) and not (skip and matches(s, skip))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per drain (default 2000)")
    parser.add_argument(
        "--pg-url", default=None, help="libpq URL of a database to create the systems' databases from"
    )
    for family in PEERS:
        parser.add_argument(f"--venv-{family}", default=None, help=f"virtual environment with {family}")
    parser.add_argument(
        "--python-ours", default=sys.executable, help="interpreter for the store (default: this one)"
    )
    parser.add_argument(
        "--procs-concurrency", type=int, default=1, help="concurrency of each of the 4 processes"
    )
    parser.add_argument("--only", default="", help="comma-separated substrings of system keys to run")
    parser.add_argument("--skip", default="", help="comma-separated substrings of system keys to leave out")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the SQLite files and logs go (default: a temp dir)"
    )
    parser.add_argument("--timeout-s", type=float, default=300, help="longest wait for one adapter step")
    parser.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    options = parser.parse_args()

    systems = _select(all_systems(options.procs_concurrency), options.only, options.skip)
    pythons = {"ours": options.python_ours}
    skipped: dict[str, str] = {}
    for family in PEERS:
        venv = getattr(options, f"venv_{family}")
        if venv:
            pythons[family] = str(Path(venv) / "bin" / "python")
        elif any(system.family == family for system in systems):
            skipped[family] = "no --venv-" + family
    server = Server(options.pg_url) if options.pg_url else None
    if server is None and any(system.database == "postgresql" for system in systems):
        skipped["PostgreSQL systems"] = "no --pg-url"
    systems = [s for s in systems if s.family in pythons and (s.database == "sqlite" or server is not None)]
    if not systems:
        parser.error("no system to run")

    if options.dir is not None:
        options.dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="scheduler-e2e-", dir=options.dir))
    (scratch / "logs").mkdir()
    bench = Bench(options, scratch, server, pythons)
    runs: list[dict[str, Any]] = []
    keys = [system.key for system in systems]
    by_key = {system.key: system for system in systems}
    print(
        f"{len(systems)} systems, {options.rounds} rounds of {options.jobs} jobs; scratch {scratch}",
        file=sys.stderr,
    )
    try:
        for round_number in range(options.rounds):
            for key in order_for(keys, round_number):
                started = time.perf_counter()
                run = bench.run_one(by_key[key], round_number)
                runs.append(run)
                figure = f"{run['jobs_per_s']:,.0f} jobs/s" if run["ok"] else f"FAILED: {run['error']}"
                print(
                    f"round {round_number + 1} {key}: {figure} ({time.perf_counter() - started:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if options.json:
            options.json.write_text(
                json.dumps({"options": {k: str(v) for k, v in vars(options).items()}, "runs": runs}, indent=1)
            )
        if options.dir is None and all(run["ok"] for run in runs):
            shutil.rmtree(scratch, ignore_errors=True)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"{options.rounds} rounds × {options.jobs} jobs; load average at the end {' '.join(load)}\n")
    print(report(systems, runs, skipped))


if __name__ == "__main__":
    main()
