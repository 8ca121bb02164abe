"""Full disk: SQLITE_FULL at every page allocation of every write method.

The recorded traces (and a scenario for the methods they do not call) are replayed on a
database with 512-byte pages. Before each write call the database is copied; the call is then
repeated on the copy with ``PRAGMA max_page_count`` (on the store's own connection) set so that
its (r+1)-th new page fails, for r = 0 … g-1 (g = pages the call really allocates). Each
injected failure must be SCHEDULER_STORAGE_UNAVAILABLE / SQLITE_FULL with a truthful
``commitState``; the copy must reopen cleanly (v6 catalog, quick_check) and hold either the whole
call (the reference run's dump) or none of it (the dump before).
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from recorded import FIXTURES, TRACES, copy_reference
from replay import NotApplicable, invocation

from scheduler import (
    SchedulerKernelError,
    open_store,
    scheduler_adjudication_operator_digest,
    scheduler_adjudication_reason_digest,
)
from scheduler.schema.catalog import verify_schema
from scheduler.store import SchedulerStore

from .conftest import T0, Scale
from .invariants import Dump, assert_invariants, dump_database, quick_check

pytestmark = pytest.mark.reliability

# fmt: off
WRITE_OPS = frozenset([  # the recorded (JavaScript) names of every write method
    "createJob", "updateJob", "enqueueOccurrence", "enqueueOccurrenceOncePerTrigger", "claimNext",
    "claimOccurrence", "renew", "settle", "setAuthorityPolicy", "ensureAuthorityPolicy",
    "reserveAuthority", "adjudicateOccurrence", "prepareDomainMigration", "applyDomainMigration",
    "verifyDomainMigration", "beginDomainMigrationRetirement", "confirmDomainMigrationEntryRetired",
    "beginDomainMigrationRollback", "rollbackDomainMigrationTargets", "restoreDomainMigrationEntrySource",
    "confirmDomainMigrationEntrySourceRestored", "bindDomainMigrationSourceLocator",
    "requestOccurrencePause", "ackOccurrencePause", "resumeOccurrence", "requeueDeadLetter",
])
# fmt: on
PAGE_SIZE = 512


@dataclass
class Call:
    """One write call of a trace or scenario: how to run it on a store, and its clock."""

    label: str  # method name
    where: str  # trace/scenario and step
    now: int
    run: Callable[[SchedulerStore], Any]
    live: Callable[[SchedulerStore], Any] | None = None  # the reference run, if it differs from ``run``


Pad = Callable[[SchedulerStore, int], Any]


@dataclass
class Tally:
    faults: Counter[str] = field(default_factory=Counter)
    not_committed: Counter[str] = field(default_factory=Counter)
    committed_unknown: Counter[str] = field(default_factory=Counter)
    unknown_but_unchanged: int = 0
    calls_faulted: int = 0
    calls_without_growth: Counter[str] = field(default_factory=Counter)


class Harness:
    """Replays calls on a live database and faults selected calls on copies of it."""

    def __init__(self, root: Path, initial: Path | None, tally: Tally, now: int = T0) -> None:
        self.root, self.tally = root, tally
        self.live = root / "live" / "kernel.sqlite"
        self.live.parent.mkdir(mode=0o700, parents=True)
        if initial is not None:
            shutil.copy(initial, self.live)
        con = sqlite3.connect(self.live, isolation_level=None)
        con.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        con.execute("VACUUM")
        con.close()
        open_store(self.live, clock=lambda: now).close()  # create or upgrade before the first call
        self.uuids = 0
        self.copies = 0

    def _uuid_factory(self, start: int) -> tuple[Callable[[], str], list[int]]:
        counter = [start]

        def next_uuid() -> str:
            counter[0] += 1
            return f"00000000-0000-4000-8000-{counter[0]:012x}"

        return next_uuid, counter

    def _open(self, path: Path, now: int, start: int) -> tuple[SchedulerStore, list[int]]:
        factory, counter = self._uuid_factory(start)
        return open_store(path, clock=lambda: now, uuid_factory=factory), counter

    def _execute(self, path: Path, call: Call, run: Callable[[SchedulerStore], Any]) -> tuple[Any, int, int]:
        """(outcome or error, pages grown, uuid counter after) of one call on ``path``."""
        store, counter = self._open(path, call.now, self.uuids)
        pages = _page_count(store)
        try:
            outcome: Any = run(store)
        except SchedulerKernelError as error:
            outcome = error
        growth = _page_count(store) - pages
        store.close()
        return outcome, growth, counter[0]

    def run(self, call: Call, points: int | None, rng: random.Random, pad: Pad | None = None) -> Any:
        """Run ``call`` on the live database; first fault it on copies if ``points`` is not None.

        ``pad(store, k)`` adds unrelated rows before a call that would not grow the file, so
        that page boundaries move until it does (at most eight times).
        """
        if points is None:
            outcome, _, self.uuids = self._execute(self.live, call, call.live or call.run)
            return outcome
        for attempt in range(9 if pad else 1):
            _vacuum(self.live)  # no free pages: every page the call needs must grow the file
            snapshot, probe = self._copy(self.live), self._copy(self.live)
            outcome, growth, uuids = self._execute(probe, call, call.live or call.run)
            if growth or pad is None or isinstance(outcome, SchedulerKernelError) or attempt == 8:
                break
            store, _ = self._open(self.live, call.now, self.uuids)
            pad(store, attempt)
            store.close()
        before, after = dump_database(snapshot), dump_database(probe)
        shutil.copy(probe, self.live)  # the probe run is the reference run
        if not isinstance(outcome, SchedulerKernelError):
            if growth == 0:
                self.tally.calls_without_growth[call.label] += 1
            chosen = range(growth) if not points else sorted(rng.sample(range(growth), min(points, growth)))
            for extra in chosen:
                self._fault(call, snapshot, extra, before, after)
            self.tally.calls_faulted += 1 if growth else 0
        self.uuids = uuids
        shutil.rmtree(snapshot.parent)
        shutil.rmtree(probe.parent)
        return outcome

    def _copy(self, source: Path) -> Path:
        self.copies += 1
        target = self.root / f"copy-{self.copies}" / "kernel.sqlite"
        target.parent.mkdir(mode=0o700)
        shutil.copy(source, target)
        return target

    def _fault(self, call: Call, snapshot: Path, extra: int, before: Dump, after: Dump) -> None:
        work = self._copy(snapshot)
        store, _ = self._open(work, call.now, self.uuids)
        cap = _page_count(store) + extra
        store.connection.exec_driver_sql(f"PRAGMA max_page_count = {cap}")
        store.connection.commit()
        context = f"{call.where} {call.label} failing at new page {extra + 1}"
        try:
            call.run(store)
        except SchedulerKernelError as error:
            state = _check_storage_error(error, context)
        else:
            raise AssertionError(f"{context}: no SQLITE_FULL although the call needs more pages")
        finally:
            store.close()
        self.tally.faults[call.label] += 1
        reopened = open_store(work)
        verify_schema(reopened.connection, 6)
        reopened.close()
        assert quick_check(work) == ["ok"], context
        dump = dump_database(work)
        if state == "not_committed":
            self.tally.not_committed[call.label] += 1
            assert dump == before, f"{context}: commitState not_committed but the database changed"
        else:
            self.tally.committed_unknown[call.label] += 1
            self.tally.unknown_but_unchanged += dump == before
            assert dump in (before, after), f"{context}: the database holds part of the operation"
        assert_invariants(dump, context)
        shutil.rmtree(work.parent)


def _vacuum(path: Path) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("VACUUM")
    finally:
        con.close()


def _page_count(store: SchedulerStore) -> int:
    count = int(store.connection.exec_driver_sql("PRAGMA page_count").scalar_one())
    store.connection.commit()
    return count


def _check_storage_error(error: SchedulerKernelError, context: str) -> str:
    assert error.code == "SCHEDULER_STORAGE_UNAVAILABLE", f"{context}: {error.code} {error}"
    details = error.details
    assert isinstance(details, dict), context
    assert details["storageCode"] == "SQLITE_FULL", f"{context}: {details}"
    assert details["retryable"] is False, f"{context}: {details}"
    assert details["commitState"] in ("not_committed", "unknown"), f"{context}: {details}"
    assert details.get("phase") in ("write", "commit"), f"{context}: {details}"
    return str(details["commitState"])


# ----------------------------------------------------------------------------- recorded traces


def _trace_calls(trace: dict[str, Any]) -> Iterator[Call | None]:
    """A Call for every applicable API call of a trace (``None`` for open/close and the rest)."""
    for raw in trace["calls"]:
        op = raw["op"]
        if op in ("openSchedulerStore", "close") or "note" in raw:
            yield None
            continue
        try:
            perform = invocation(op, raw["args"])
        except NotApplicable:
            yield None
            continue
        where = f"{trace['scenario']}#{raw['seq']}"
        yield Call(perform.method, where, raw["now"], perform)


# ----------------------------------------------------------------------------- scenario for the rest


AUTHORITY = {
    "principal": {"type": "user", "id": "disk"},
    "workspaceId": "ws",
    "requestedCapabilities": ["run"],
}
WIDE = {
    "principal": {"type": "user", "id": "wide"},
    "requestedCapabilities": [f"capability.{n:03d}" for n in range(40)],
}
SOURCE = {"id": "legacy-1", "title": "Water plants", "cron": "0 7 * * *"}
# Once begin_domain_migration_rollback has rolled every target back (in one transaction), a later
# rollback_domain_migration_targets has nothing left to write in any state the API can reach.
NO_WRITE_RETRIES = frozenset({"rollback_domain_migration_targets"})


def _plan(n: int) -> dict[str, Any]:
    entries = []
    for i in range(n):
        entries.append(
            {
                "domain": "agenda",
                "sourceId": f"legacy-{i}",
                "sourceScope": {"store": "agent-schedule", "directory": "/home/alice/agenda"},
                "source": {**SOURCE, "id": f"legacy-{i}"},
                "rollbackStrategy": "restore" if i % 2 == 0 else "disable",
                "targetJob": {
                    "id": f"migrated-{i}",
                    "kind": "agenda",
                    "trigger": {"type": "cron"},
                    "payload": {"title": f"t{i}"},
                    "authority": AUTHORITY,
                },
            }
        )
    return {"entries": entries}


Step = Callable[[SchedulerStore, dict[str, Any]], Any]


def _claim_batch(s: SchedulerStore, c: dict[str, Any]) -> Any:
    claimed = s.claim_batch(owner_id="w", lease_ms=600_000, limit=3)
    c["batch"] = [(o.id, o.fence) for o in claimed]
    return claimed


def _settle_many(s: SchedulerStore, c: dict[str, Any]) -> Any:
    return s.settle_many(
        [
            {
                "occurrence_id": occ,
                "owner_id": "w",
                "fence": fence,
                "outcome": "succeeded",
                "result": {"n": n},
            }
            for n, (occ, fence) in enumerate(c["batch"][:2])
        ]
    )


def _dead_letter(s: SchedulerStore, c: dict[str, Any]) -> Any:
    occ, fence = c["batch"][2]
    c["dead"] = occ
    return s.settle(
        occurrence_id=occ,
        owner_id="w",
        fence=fence,
        outcome="failed",
        error={"code": "EXEC_OUTCOME_UNKNOWN", "message": "lost"},
        retryable=False,
    )


def _adjudicate(s: SchedulerStore, c: dict[str, Any]) -> Any:
    case = s.get_adjudication_case(c["dead"])
    assert case is not None and case.eligible and case.evidence_digest is not None
    return s.adjudicate_occurrence(
        occurrence_id=c["dead"],
        decision="confirmed_not_applied",
        expected_evidence_digest=case.evidence_digest,
        expected_attempt=case.attempt,
        expected_fence=case.fence,
        reason_digest=scheduler_adjudication_reason_digest("checked"),
        operator_digest=scheduler_adjudication_operator_digest({"type": "local-operator", "id": "ops"}),
    )


def _transaction(s: SchedulerStore, c: dict[str, Any]) -> None:
    with s.transaction() as tx:
        tx.create_job(id="tx-job", kind="routine", authority=AUTHORITY, payload={"p": "y" * 300})
        tx.enqueue_occurrence(job_id="tx-job", scheduled_for=T0, trigger_key="tx")


def _prepare(s: SchedulerStore, c: dict[str, Any]) -> Any:
    migration = s.prepare_domain_migration(_plan(4))
    c["migration"] = migration.id
    c["entries"] = [(e.entry_id, e.rollback_strategy, e.source_id) for e in migration.entries or ()]
    return migration


def _restore(s: SchedulerStore, c: dict[str, Any], confirm: bool) -> Any:
    entry_id, _, source_id = [e for e in c["entries"] if e[1] == "restore"][1 if confirm else 0]
    source = {**SOURCE, "id": source_id}
    if confirm:
        return s.confirm_domain_migration_entry_source_restored(
            migration_id=c["migration"], entry_id=entry_id, retirement_token=None, source=source
        )
    return s.restore_domain_migration_entry_source(
        migration_id=c["migration"], entry_id=entry_id, retirement_token=None, restore_source=lambda: source
    )


def _pad(store: SchedulerStore, k: int) -> None:
    store.create_job(id=f"pad-{store.history(limit=1)[0].event_id}-{k}", kind="pad", authority=AUTHORITY)


def _claim_for_pause(s: SchedulerStore, c: dict[str, Any]) -> Any:
    claimed = s.claim_occurrence(occurrence_id=c["queued"], owner_id="pauser", lease_ms=600_000)
    assert claimed is not None
    c["held"] = (claimed.id, claimed.fence)
    return claimed


def _request_pause(s: SchedulerStore, c: dict[str, Any]) -> Any:
    occ, fence = c["held"]
    control = s.request_occurrence_pause(
        occurrence_id=occ,
        expected_fence=fence,
        request_id="pause-" + "p" * 100,
        capability={"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint"]},
    )
    c["control"] = control.revision
    return control


def _ack_pause(s: SchedulerStore, c: dict[str, Any]) -> Any:
    occ, fence = c["held"]
    result = s.ack_occurrence_pause(
        occurrence_id=occ,
        owner_id="pauser",
        fence=fence,
        request_id="pause-" + "p" * 100,
        expected_revision=c["control"],
        safe_point="adapter_checkpoint",
        checkpoint={"step": "c" * 400},
    )
    c["control"] = result.control.revision
    return result


def _resume(s: SchedulerStore, c: dict[str, Any]) -> Any:
    return s.resume_occurrence(
        occurrence_id=c["held"][0], expected_revision=c["control"], request_id="resume-" + "r" * 100
    )


def _set_policy(s: SchedulerStore, c: dict[str, Any]) -> Any:
    capabilities = [*WIDE["requestedCapabilities"], "more"]
    principal = WIDE["principal"]
    return s.set_authority_policy(
        principal,
        capabilities=capabilities,
        window_ms=120_000,
        max_runs=10,
        max_units=10,
        expected_revision=1,
    )


def _queued(s: SchedulerStore, c: dict[str, Any]) -> Any:
    occurrence = s.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="to-pause")
    c["queued"] = occurrence.id
    return occurrence


def scenario_steps() -> list[tuple[str, Step]]:
    """One write call per step (method, fn(store, ctx)); ``ctx`` carries ids between steps."""
    return [
        (
            "create_job",
            lambda s, c: s.create_job(
                id="job-a", kind="agenda", authority=AUTHORITY, max_attempts=2, payload={"p": "x" * 200}
            ),
        ),
        ("ensure_authority_policy", lambda s, c: s.ensure_authority_policy(WIDE)),
        (
            "enqueue_occurrence_once_per_trigger",
            lambda s, c: s.enqueue_occurrence_once_per_trigger(
                job_id="job-a", scheduled_for=T0, trigger_key="once"
            ),
        ),
        (
            "enqueue_many",
            lambda s, c: s.enqueue_many(
                [
                    {
                        "job_id": "job-a",
                        "scheduled_for": T0 + i,
                        "trigger_key": f"many-{i}",
                        "payload": {"i": i},
                    }
                    for i in range(6)
                ]
            ),
        ),
        ("claim_batch", _claim_batch),
        ("settle_many", _settle_many),
        ("settle", _dead_letter),
        ("adjudicate_occurrence", _adjudicate),
        ("transaction", _transaction),
        ("prepare_domain_migration", _prepare),
        ("apply_domain_migration", lambda s, c: s.apply_domain_migration(c["migration"])),
        ("begin_domain_migration_rollback", lambda s, c: s.begin_domain_migration_rollback(c["migration"])),
        ("restore_domain_migration_entry_source", lambda s, c: _restore(s, c, False)),
        ("confirm_domain_migration_entry_source_restored", lambda s, c: _restore(s, c, True)),
        (
            "rollback_domain_migration_targets",
            lambda s, c: s.rollback_domain_migration_targets(c["migration"]),
        ),
        ("update_job", lambda s, c: s.update_job("job-a", 1, payload={"p": "u" * 700}, max_attempts=5)),
        ("set_authority_policy", _set_policy),
        ("enqueue_occurrence", _queued),
        ("claim_occurrence", _claim_for_pause),
        ("request_occurrence_pause", _request_pause),
        ("ack_occurrence_pause", _ack_pause),
        ("resume_occurrence", _resume),
    ]


# ----------------------------------------------------------------------------- tests


def _selected(total: int, wanted: int, rng: random.Random) -> set[int]:
    return set(range(total)) if wanted <= 0 or wanted >= total else set(rng.sample(range(total), wanted))


def test_sqlite_full_in_recorded_write_calls(
    tmp_path: Path, scale: Scale, seed: int, figures: dict[str, Any]
) -> None:
    rng = random.Random(seed + 2)
    traces = sorted(TRACES.glob("*.json"))
    loaded = [json.loads(p.read_text()) for p in traces]
    writes = [
        (i, j)
        for i, t in enumerate(loaded)
        for j, c in enumerate(t["calls"])
        if c["op"] in WRITE_OPS and "error" not in c and "note" not in c
    ]
    chosen = _selected(len(writes), scale.full_disk_calls, rng)
    selected = {writes[k] for k in chosen}
    tally = Tally()
    for i, trace in enumerate(loaded):
        initial = FIXTURES / trace["initial_db"] if trace.get("initial_db") else None
        harness = Harness(tmp_path / trace["scenario"], initial, tally, trace["calls"][0]["now"])
        for j, call in enumerate(_trace_calls(trace)):
            if call is not None:
                harness.run(call, scale.full_disk_points if (i, j) in selected else None, rng)
        assert_invariants(dump_database(harness.live), trace["scenario"])
    _record(figures, "full_disk_traces", tally, len(selected))
    assert tally.faults, "no SQLITE_FULL was induced"


def test_sqlite_full_in_every_other_write_method(
    tmp_path: Path, scale: Scale, seed: int, figures: dict[str, Any]
) -> None:
    """Methods the traces do not call: batches, transaction(), adjudication, rollback and restore."""
    rng = random.Random(seed + 3)
    tally = Tally()
    harness = Harness(tmp_path / "scenario", None, tally)
    ctx: dict[str, Any] = {}
    for step, (label, fn) in enumerate(scenario_steps()):
        frozen = dict(ctx)
        call = Call(
            label,
            f"scenario#{step}",
            T0 + 1000 * (step + 1),
            run=lambda s, fn=fn, c=frozen: fn(s, dict(c)),
            live=lambda s, fn=fn: fn(s, ctx),
        )
        outcome = harness.run(call, scale.full_disk_points, rng, pad=_pad)
        assert not isinstance(outcome, SchedulerKernelError), f"{label}: {outcome!r}"
    _record(figures, "full_disk_scenario", tally, len(scenario_steps()))
    unfaulted = {label for label, _ in scenario_steps()} - set(tally.faults) - NO_WRITE_RETRIES
    assert not unfaulted, f"write methods never faulted (no page growth): {sorted(unfaulted)}"


def _record(figures: dict[str, Any], name: str, tally: Tally, calls: int) -> None:
    figures[name] = {
        "write_calls_selected": calls,
        "write_calls_faulted": tally.calls_faulted,
        "sqlite_full_injected": sum(tally.faults.values()),
        "commit_state_not_committed": sum(tally.not_committed.values()),
        "commit_state_unknown": dict(sorted(tally.committed_unknown.items())),
        "commit_state_unknown_but_nothing_written": tally.unknown_but_unchanged,
        "by_method": dict(sorted(tally.faults.items())),
        "calls_without_page_growth": dict(sorted(tally.calls_without_growth.items())),
    }


def test_sqlite_full_during_upgrade_leaves_file_untouched(tmp_path: Path, figures: dict[str, Any]) -> None:
    """An upgrade that runs out of pages is refused as storage-unavailable and changes no byte."""
    from sqlalchemy import create_engine, event

    from .invariants import file_sha256

    results: Counter[str] = Counter()
    for version in (1, 2, 3, 4, 5):
        for extra in (0, 1, 3):
            path = tmp_path / f"v{version}-{extra}" / "kernel.sqlite"
            path.parent.mkdir(mode=0o700)
            copy_reference(path.parent, version, path.name)
            pages = path.stat().st_size // sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
            engine = create_engine(f"sqlite+pysqlite:///{path}")
            event.listen(
                engine,
                "connect",
                lambda dbapi, _rec, cap=pages + extra: dbapi.execute(f"PRAGMA max_page_count = {cap}"),
            )
            before = file_sha256(path)
            with pytest.raises(SchedulerKernelError) as caught:
                open_store(engine)
            engine.dispose()
            assert caught.value.code == "SCHEDULER_STORAGE_UNAVAILABLE", caught.value
            assert caught.value.details["storageCode"] == "SQLITE_FULL"
            assert file_sha256(path) == before, f"v{version}: failed upgrade changed the file"
            assert not Path(f"{path}-journal").exists()
            results[f"v{version}"] += 1
            store = open_store(path, clock=lambda: T0)
            verify_schema(store.connection, 6)
            store.close()
    figures["full_disk_upgrade"] = {"refused_untouched": sum(results.values()), "by_version": dict(results)}
