"""Adversarial queues: states a new user can reach, where a claim or a listing must not slow down
with the number of rows it is not asked for.

The states (:mod:`scheduler.bench.adversarial_states`) are built through the public API. Each
case times one call again and again (median, p99, process CPU) on its state, kept steady: a
claimed occurrence is handed back with ``release_lease`` (untimed), and what a cycle settles is
replaced by new work and pruned once the case ran. The target is <= 2 ms per call at any size.

``scheduler bench`` runs them on SQLite at ``adversarial_rows`` (with 8 fresh worker processes on
the dead fleet: the cycles they complete and the ``SQLITE_BUSY`` failures they see);
``scheduler bench --adversarial --rows N`` runs them alone, on either backend (:func:`run_adversarial`).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from scheduler.bench import adversarial_states as states
from scheduler.bench.context import BenchConfig, Context
from scheduler.bench.model import GROUP_ADVERSARIAL, Spec
from scheduler.bench.timing import Record, median_ms, percentile_ms, stop_processes

OWNER: Final = "bench-adversarial"
WARMUP: Final = 5
BATCH_LIMIT: Final = 10
BOUND_MS: Final = 2.0
FLEET_WORKERS: Final = 8
FLEET_SECONDS: Final = 10.0
LEASE_MS: Final = states.LEASE_MS

Timed = tuple[float, float]
"""(wall seconds, CPU seconds) of the timed part of one call."""


@dataclass(frozen=True, slots=True)
class Timer:
    """One case's call on its store, and what restores the state once the case ran (untimed)."""

    call: Callable[[], Timed]
    finish: Callable[[], None] = lambda: None


@dataclass(frozen=True, slots=True)
class Case:
    key: str
    label: str
    state: str
    start: Callable[[Any], Timer]


def _timed(call: Callable[[], Any]) -> tuple[Any, Timed]:
    started, cpu_started = time.perf_counter(), time.process_time()
    result = call()
    return result, (time.perf_counter() - started, time.process_time() - cpu_started)


def _hand_back(store: Any, occurrences: list[Any], settle: bool) -> None:
    """Release (the state stays as it was) or settle (a dead fleet's lease: released, it would be
    queued at the head) the occurrences a timed call claimed."""
    for occurrence in occurrences:
        if settle:
            store.settle(
                occurrence_id=occurrence.id, owner_id=OWNER, fence=occurrence.fence, outcome="succeeded"
            )
        else:
            store.release_lease(occurrence_id=occurrence.id, owner_id=OWNER, fence=occurrence.fence)


def _claims(limit: int | None = None, settle: bool = False, **filters: Any) -> Callable[[Any], Timer]:
    """``claim_next`` (or ``claim_batch(limit)``), which must claim, timed alone."""

    def start(store: Any) -> Timer:
        def claim() -> list[Any]:
            if limit is None:
                claimed = store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS, **filters)
                return [] if claimed is None else [claimed]
            return list(store.claim_batch(owner_id=OWNER, lease_ms=LEASE_MS, limit=limit, **filters))

        def call() -> Timed:
            claimed, timing = _timed(claim)
            if len(claimed) < (limit or 1):
                raise RuntimeError("the state's eligible work ran out")
            _hand_back(store, claimed, settle)
            return timing

        return Timer(call, lambda: _replenish(store))

    return start


def _nothing(**filters: Any) -> Callable[[Any], Timer]:
    """``claim_next`` that must find nothing."""

    def start(store: Any) -> Timer:
        def call() -> Timed:
            claimed, timing = _timed(lambda: store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS, **filters))
            if claimed is not None:
                raise RuntimeError("a filter that matches nothing claimed an occurrence")
            return timing

        return Timer(call)

    return start


def _cycles(**filters: Any) -> Callable[[Any], Timer]:
    """``settle_and_claim`` of the held occurrence, timed; each settles one and claims the next."""

    def start(store: Any) -> Timer:
        held = [store.claim_next(owner_id=OWNER, lease_ms=LEASE_MS, **filters)]

        def call() -> Timed:
            occurrence = held[0]
            cycle, timing = _timed(
                lambda: store.settle_and_claim(
                    occurrence_id=occurrence.id,
                    owner_id=OWNER,
                    fence=occurrence.fence,
                    outcome="succeeded",
                    lease_ms=LEASE_MS,
                    **filters,
                )
            )
            if cycle.claimed is None:
                raise RuntimeError("the state's eligible work ran out")
            held[0] = cycle.claimed
            return timing

        def finish() -> None:
            _hand_back(store, held, settle=True)
            _replenish(store)

        return Timer(call, finish)

    return start


def _replenish(store: Any) -> None:
    """New work for each occurrence the case settled, and the settled ones pruned: the eligible
    jobs hold what they held before the case."""
    pruned = store.prune(older_than_ms=0, statuses=["succeeded"])
    for job_id in (states.ENABLED_JOB, states.KIND_B_JOB):
        if store.get_job(job_id) is not None and pruned.occurrences:
            states.add_work(store, job_id, pruned.occurrences)
            return


def _read(call: Callable[[Any], Any]) -> Callable[[Any], Timer]:
    return lambda store: Timer(lambda: _timed(lambda: call(store))[1])


CASES: Final = (
    Case("plain_claim_next", "reference: claim_next on a queue of its work alone", "plain", _claims()),
    Case("plain_claim_batch", "reference: claim_batch(10) on it", "plain", _claims(BATCH_LIMIT)),
    Case("plain_settle_and_claim", "reference: settle_and_claim on it", "plain", _cycles()),
    Case("disabled_claim_next", "claim_next behind N due rows of a disabled job", "disabled", _claims()),
    Case("disabled_claim_batch", "claim_batch(10) behind them", "disabled", _claims(BATCH_LIMIT)),
    Case("disabled_settle_and_claim", "settle_and_claim behind them", "disabled", _cycles()),
    Case(
        "kind_claim_next",
        'claim_next(job_kind="b") behind N due rows of kind a',
        "kinds",
        _claims(job_kind="b"),
    ),
    Case(
        "kind_claim_batch",
        'claim_batch(10, job_kind="b") behind them',
        "kinds",
        _claims(BATCH_LIMIT, job_kind="b"),
    ),
    Case(
        "kind_settle_and_claim", 'settle_and_claim(job_kind="b") behind them', "kinds", _cycles(job_kind="b")
    ),
    Case(
        "no_workspace_claim_next",
        "claim_next(workspace_id=<no match>) over them",
        "kinds",
        _nothing(workspace_id="nowhere"),
    ),
    Case(
        "no_workspace_claim_batch",
        "claim_batch(10, workspace_id=<no match>) over them",
        "kinds",
        lambda store: Timer(
            lambda: _timed(
                lambda: store.claim_batch(
                    owner_id=OWNER, lease_ms=LEASE_MS, limit=BATCH_LIMIT, workspace_id="nowhere"
                )
            )[1]
        ),
    ),
    Case(
        "workspace_claim_next",
        "claim_next(workspace_id=<a few rows behind them>)",
        "kinds",
        _claims(workspace_id=states.WS_B),
    ),
    Case(
        "dead_letters",
        "list_dead_letters(limit=50) over N dead letters",
        "dead",
        _read(lambda s: s.list_dead_letters(limit=50)),
    ),
    Case(
        "dead_letters_job",
        "list_dead_letters(job_id=<theirs>, limit=50)",
        "dead",
        _read(lambda s: s.list_dead_letters(job_id=states.DEAD_JOB, limit=50)),
    ),
    Case(
        "dead_letters_other_job",
        "list_dead_letters(job_id=<60 older ones>, limit=50)",
        "dead",
        _read(lambda s: s.list_dead_letters(job_id=states.FEW_DEAD_JOB, limit=50)),
    ),
    Case(
        "adjudication",
        "list_adjudication_cases(limit=50) over them",
        "dead",
        _read(lambda s: s.list_adjudication_cases(limit=50)),
    ),
    Case(
        "fleet_claim_next", "claim_next over N expired leases (a dead fleet's)", "fleet", _claims(settle=True)
    ),
    Case("fleet_claim_batch", "claim_batch(10) over them", "fleet", _claims(BATCH_LIMIT, settle=True)),
    Case("fleet_settle_and_claim", "settle_and_claim over them", "fleet", _cycles()),
)
STATES: Final = tuple(dict.fromkeys(case.state for case in CASES))


def _label(case: Case, rows: int) -> str:
    return case.label.replace("N ", f"{rows:,} ")


def work_for(calls: int) -> int:
    """Due occurrences a claim state's eligible job holds: every call of a case, and spare ones."""
    return calls + WARMUP + BATCH_LIMIT + 1


def time_case(store: Any, case: Case, calls: int) -> dict[str, Any]:
    """``calls`` timed calls of ``case`` (after :data:`WARMUP`) on its built state."""
    timer = case.start(store)
    try:
        for _ in range(WARMUP):
            timer.call()
        timings = [timer.call() for _ in range(calls)]
    finally:
        timer.finish()
    samples = [wall for wall, _ in timings]
    median = median_ms(samples)
    return {
        "value": median,
        "p99_ms": round(percentile_ms(samples, 0.99), 3),
        "cpu_us_per_call": round(sum(cpu for _, cpu in timings) / calls * 1e6, 1),
        "calls": calls,
        "bound_ms": BOUND_MS,
        "within_bound": median <= BOUND_MS,
    }


def ready(store: Any, state: str, rows: int, calls: int) -> dict[str, Any]:
    """The state on ``store``: reused when a complete one of that size is there, else built."""
    record = states.built(store)
    if record is not None and record.get("rows") == rows and record.get("state") == state:
        return {**record, "reused": True}
    if record is not None or store.get_job(states.FIRST_JOBS[state]) is not None:
        raise RuntimeError(
            f"the {state} state's database holds another size or an unfinished build: remove it"
        )
    return {**states.build(store, state, rows, work_for(calls)), "reused": False}


# ------------------------------------------------------------------ within `scheduler bench` (SQLite)


def adversarial_specs(config: BenchConfig) -> list[Spec]:
    rows = config.adversarial_rows
    specs = [
        Spec(f"adv_{case.key}_ms", _label(case, rows), "ms", "latency", GROUP_ADVERSARIAL) for case in CASES
    ]
    return [*specs, FLEET_CYCLES, FLEET_BUSY]


FLEET_CYCLES = Spec(
    "adv_fleet_workers_cycles",
    f"{FLEET_WORKERS} fresh workers on the fleet: cycles in {FLEET_SECONDS:g} s",
    "cycles",
    "count",
    GROUP_ADVERSARIAL,
)
FLEET_BUSY = Spec(
    "adv_fleet_workers_busy",
    f"{FLEET_WORKERS} fresh workers on the fleet: SQLITE_BUSY failures",
    "calls",
    "count",
    GROUP_ADVERSARIAL,
)


def measure_adversarial(ctx: Context, record: Record) -> None:
    """Every case on SQLite files in the run's directory, then the fleet's fresh workers."""
    from scheduler.store.opening import open_store

    rows, calls = ctx.config.adversarial_rows, ctx.config.adversarial_calls
    for state in STATES:
        path = ctx.path(f"adversarial-{state}.sqlite")
        store = open_store(path)
        try:
            task = ctx.progress.task(f"adversarial: {state} ({rows:,} rows)", 1)
            built = ready(store, state, rows, calls)
            task.finish()
            for case in CASES:
                if case.state == state:
                    detail = time_case(store, case, calls)
                    record(
                        f"adv_{case.key}_ms",
                        detail.pop("value"),
                        rows=rows,
                        build_s=built["build_s"],
                        **detail,
                    )
        finally:
            store.close()
    cycles, busy = measure_fleet_workers(ctx.path("adversarial-fleet.sqlite"), ctx.config.budget_s)
    record(FLEET_CYCLES.key, cycles, workers=FLEET_WORKERS, seconds=FLEET_SECONDS)
    record(FLEET_BUSY.key, busy, workers=FLEET_WORKERS)


def _fleet_worker(path: str, owner: str, seconds: float, start: Any, results: Any) -> None:
    from scheduler.store.opening import open_store

    store = open_store(path)
    cycles = busy = 0
    start.wait()
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline:
            try:
                occurrence = store.claim_next(owner_id=owner, lease_ms=LEASE_MS)
                if occurrence is None:
                    break
                store.settle(
                    occurrence_id=occurrence.id, owner_id=owner, fence=occurrence.fence, outcome="succeeded"
                )
                cycles += 1
            except Exception as error:
                if (getattr(error, "details", None) or {}).get("storageCode") not in (
                    "SQLITE_BUSY",
                    "SQLITE_LOCKED",
                ):
                    raise
                busy += 1
    finally:
        store.close()
        results.put((cycles, busy))


def measure_fleet_workers(path: Path, budget_s: float | None) -> tuple[int, int]:
    """8 fresh processes on the fleet state's expired leases for a fixed time: (cycles, busy failures)."""
    spawn = multiprocessing.get_context("spawn")
    start, results = spawn.Event(), spawn.Queue()
    seconds = FLEET_SECONDS if budget_s is None else min(FLEET_SECONDS, budget_s)
    processes = [
        spawn.Process(
            target=_fleet_worker, args=(str(path), f"fresh-{i}", seconds, start, results), daemon=True
        )
        for i in range(FLEET_WORKERS)
    ]
    finished = False
    try:
        for process in processes:
            process.start()
        time.sleep(2.0)  # let every process import and open its store
        start.set()
        totals = [results.get(timeout=seconds + 120) for _ in processes]
        finished = True
    finally:
        stop_processes(processes, finished=finished)
    return sum(cycles for cycles, _ in totals), sum(busy for _, busy in totals)


# ------------------------------------------------------------------ `scheduler bench --adversarial`


@dataclass(slots=True)
class AdversarialRun:
    """``scheduler bench --adversarial``: every case on one backend at one size."""

    backend: str
    rows: int
    calls: int
    command: str
    states: list[dict[str, Any]] = field(default_factory=list)
    cases: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "scheduler-bench-adversarial/1",
            "backend": self.backend,
            "rows": self.rows,
            "calls": self.calls,
            "command": self.command,
            "states": self.states,
            "cases": self.cases,
        }


StoreOpener = Callable[[str], Any]
"""A state's name -> a store holding it (its own SQLite file or PostgreSQL schema)."""


def run_adversarial(
    backend: str,
    opener: StoreOpener,
    rows: int,
    calls: int,
    *,
    command: str,
    progress: Callable[[str], None] = lambda _: None,
) -> AdversarialRun:
    """Build (or reuse) each state through the public API with ``opener``'s stores and time every case."""
    run = AdversarialRun(backend, rows, calls, command)
    for state in STATES:
        with _opened(opener, state) as store:
            progress(f"{state}: building or reusing {rows:,} rows")
            record = ready(store, state, rows, calls)
            run.states.append(record)
            progress(
                f"{state}: {'reused' if record['reused'] else 'built in ' + str(record['build_s']) + ' s'}"
            )
            for case in CASES:
                if case.state != state:
                    continue
                detail = time_case(store, case, calls)
                median = detail.pop("value")
                run.cases.append(
                    {"case": case.key, "label": _label(case, rows), "median_ms": round(median, 3), **detail}
                )
                progress(f"  {case.key}: median {median:.3f} ms, p99 {detail['p99_ms']:.3f} ms")
    return run


@contextmanager
def _opened(opener: StoreOpener, state: str) -> Iterator[Any]:
    store = opener(state)
    try:
        yield store
    finally:
        store.close()


def adversarial_markdown(run: AdversarialRun) -> str:
    """The run as Markdown: the states (how long each took to build) and the cases."""
    lines = [
        f"Adversarial queues on {run.backend}, {run.rows:,} rows, {run.calls} calls per case",
        f"(`{run.command}`)",
        "",
        "| state | build s | reused |",
        "|---|---:|---|",
    ]
    lines += [
        f"| {state['state']} | {state['build_s']} | {'yes' if state['reused'] else 'no'} |"
        for state in run.states
    ]
    lines += [
        "",
        "| case | median ms | p99 ms | CPU µs/call | bound ms | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for case in run.cases:
        verdict = "met" if case["within_bound"] else "NOT met"
        lines.append(
            f"| {case['label']} | {case['median_ms']:.3f} | {case['p99_ms']:.3f} | "
            f"{case['cpu_us_per_call']:.0f} | {case['bound_ms']:g} | {verdict} |"
        )
    return "\n".join(lines) + "\n"
