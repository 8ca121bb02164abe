"""Tasks (API §10): a decorated function and one ``defer`` — on a real SQLite file and on the real
PostgreSQL server (``place``). Defining (checked at decoration time), deferring now, at ``run_at``,
under a ``key``, several at once, and refusing bad input with nothing written."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from store_places import StorePlace
from tasks_support import count, run_row, tasks_on, working

from scheduler import RetryPolicy, SchedulerKernelError, TaskRun, Tasks

INVALID = "SCHEDULER_INVALID_ARGUMENT"


def test_the_five_minute_path(place: StorePlace) -> None:
    tasks = tasks_on(place)

    @tasks.task(queue="emails")
    def send_welcome(user_id: int, locale: str = "en") -> dict[str, Any]:
        return {"sent_to": user_id, "locale": locale}

    assert send_welcome(7, locale="de") == {"sent_to": 7, "locale": "de"}  # a plain call runs it here
    run = send_welcome.defer(user_id=42)
    assert isinstance(run, TaskRun)
    assert (run.task, run.queue, run.status, run.attempt, run.value) == (
        send_welcome.name,
        "emails",
        "queued",
        0,
        None,
    )
    assert count(place, "occurrences") == 1  # the plain call queued nothing
    with working(tasks):
        assert run.result(timeout_s=10) == {"sent_to": 42, "locale": "en"}
    done = tasks.get(run.id)
    assert done is not None and (done.status, done.attempt, done.error) == ("succeeded", 1, None)
    job = place.sql("SELECT kind, max_attempts, authority_json FROM jobs WHERE job_id = ?", (run.task,))
    assert job[0][:2] == ("emails", 3)
    assert '"principal":{"id":"app","type":"service"}' in job[0][2]
    tasks.close()


def test_defer_without_run_at_is_due_at_the_store_clock(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        noop = tasks.task(name="noop")(lambda: None)
        before = int(time.time() * 1000)
        run = noop.defer()
        after = int(time.time() * 1000)
        # the store's clock: the local one on SQLite, the server's on PostgreSQL (same machine)
        assert before - 1_000 <= run.scheduled_for <= after + 1_000
        row = run_row(place, run.id)
        assert row["scheduled_for"] == run.scheduled_for != 0
    with tasks_on(place, clock=lambda: 1_767_225_600_000) as pinned:
        assert pinned.task(name="noop")(lambda: None).defer().scheduled_for == 1_767_225_600_000


def test_run_at_takes_an_aware_datetime_or_epoch_ms_and_waits_for_it(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        echo = tasks.task(name="echo")(lambda text: text)
        later = datetime.now(UTC) + timedelta(hours=1)
        scheduled = echo.defer("later", run_at=later)
        assert scheduled.scheduled_for == int(later.timestamp() * 1000)
        at_ms = echo.defer("at", run_at=1_000)
        assert at_ms.scheduled_for == 1_000
        in_berlin = datetime(2020, 1, 1, 12, tzinfo=timezone(timedelta(hours=1)))
        assert echo.defer("tz", run_at=in_berlin).scheduled_for == 1_577_876_400_000
        worker = tasks.worker(poll_min_ms=5, poll_max_ms=20)
        try:
            assert worker.run_until_idle() == 2  # the past ones; the one an hour away waits
        finally:
            worker.close()
        assert tasks.get(scheduled.id).status == "queued"  # type: ignore[union-attr]
        assert at_ms.result(timeout_s=0) == "at"
        with pytest.raises(SchedulerKernelError) as naive:
            echo.defer("naive", run_at=datetime(2030, 1, 1))
        assert naive.value.code == INVALID
        assert count(place, "occurrences") == 3


def test_a_key_names_one_run_and_its_arguments_are_checked(place: StorePlace) -> None:
    with tasks_on(place) as tasks:

        @tasks.task(name="welcome")
        def welcome(user_id: int, locale: str = "en") -> None: ...

        first = welcome.defer(42, key="welcome-42")
        again = welcome.defer(user_id=42, key="welcome-42", run_at=5_000)  # positional = by name
        assert again.id == first.id and again.deduplicated is True and first.deduplicated is False
        assert again.scheduled_for == first.scheduled_for  # whatever run_at says
        assert count(place, "occurrences") == 1
        events = count(place, "events")
        with pytest.raises(SchedulerKernelError) as mismatch:
            welcome.defer(user_id=42, locale="fr", key="welcome-42")
        assert mismatch.value.code == "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH"
        assert mismatch.value.details["runId"] == first.id
        assert (count(place, "occurrences"), count(place, "events")) == (1, events)
        other = welcome.defer(43, key="welcome-43")
        assert other.id != first.id and count(place, "occurrences") == 2
        unkeyed = [welcome.defer(42), welcome.defer(42)]
        assert unkeyed[0].id != unkeyed[1].id  # without a key every defer is a new run


def test_a_key_compares_calls_with_their_defaults_filled_in(place: StorePlace) -> None:
    with tasks_on(place) as tasks:

        @tasks.task(name="welcome")
        def welcome(user_id: int, locale: str = "en", when: object = object()) -> None: ...

        first = welcome.defer(42, key="w")
        assert welcome.defer(42, "en", key="w").deduplicated is True  # the default, spelled out
        explicit = welcome.defer(user_id=7, locale="en", key="w7")
        assert welcome.defer(7, key="w7").id == explicit.id
        with pytest.raises(SchedulerKernelError) as mismatch:
            welcome.defer(42, locale="fr", key="w")
        assert mismatch.value.details["runId"] == first.id
        assert run_row(place, first.id)["payload_json"] == '{"args":{"user_id":42}}'  # defaults not stored
        assert count(place, "occurrences") == 2


def test_defer_many_is_one_transaction(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        add = tasks.task(name="add")(lambda a, b: a + b)
        shout = tasks.task(name="shout", queue="loud")(lambda text: text.upper())
        runs = add.defer_many(
            [{"a": 1, "b": 2}, {"a": 3, "b": 4, "key": "k34"}, {"a": 5, "b": 6, "run_at": 9}]
        )
        assert [run.scheduled_for == 9 for run in runs] == [False, False, True]
        assert count(place, "occurrences") == 3
        with pytest.raises(SchedulerKernelError) as bad:
            tasks.defer_many([{"task": shout, "text": "ok"}, {"task": "add", "a": 1, "b": 2, "key": 7}])
        assert (bad.value.code, bad.value.details["index"]) == (INVALID, 1)
        with pytest.raises(SchedulerKernelError) as mismatch:  # found in the transaction: all rolled back
            tasks.defer_many([{"task": shout, "text": "ok"}, {"task": add, "a": 9, "b": 9, "key": "k34"}])
        assert mismatch.value.code == "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH"
        assert mismatch.value.details["index"] == 1
        assert count(place, "occurrences") == 3
        mixed = tasks.defer_many([{"task": shout, "text": "hi"}, {"task": "add", "a": 1, "b": 1}])
        assert [run.queue for run in mixed] == ["loud", "default"]
        assert tasks.worker(["loud", "default"]).run_until_idle() == 5
        assert [run.result(timeout_s=0) for run in [*runs, *mixed]] == [3, 7, 11, "HI", 2]


def test_defer_many_writes_plain_runs_as_batches_with_the_results_of_one_by_one(place: StorePlace) -> None:
    """Plain calls next to each other are enqueued as one batch (long enough for PostgreSQL's
    COPY); keyed calls one at a time between them. Results, rows and events come in the items'
    order, and a failing item is named by its index in the whole call."""
    with tasks_on(place) as tasks:
        add = tasks.task(name="add")(lambda a, b: a + b)
        shout = tasks.task(name="shout", queue="loud")(lambda text: text.upper())
        add.defer(0, 0, key="k0")
        items: list[dict[str, Any]] = [{"task": add, "a": n, "b": 1} for n in range(70)]
        items += [{"task": add, "a": 0, "b": 0, "key": "k0"}, {"task": add, "a": 1, "b": 0, "key": "k1"}]
        items += [{"task": shout, "text": f"t{n}"} for n in range(70)]
        runs = tasks.defer_many(items)
        assert [run.task for run in runs] == ["add"] * 72 + ["shout"] * 70
        assert runs[70].id == add.defer(0, 0, key="k0").id  # the earlier run of the key
        assert count(place, "occurrences") == 1 + 71 + 70
        payloads = [run_row(place, run.id)["payload_json"] for run in runs]
        assert payloads[:2] == ['{"args":{"a":0,"b":1}}', '{"args":{"a":1,"b":1}}']
        assert payloads[-1] == '{"args":{"text":"t69"}}'
        enqueued = place.sql(
            "SELECT occurrence_id FROM events WHERE event_type = 'occurrence_enqueued' ORDER BY event_id"
        )
        assert [row[0] for row in enqueued][1:] == [run.id for index, run in enumerate(runs) if index != 70]

        tasks.register()
        with place.open() as store:
            job = store.get_job("shout")
            assert job is not None
            store.update_job("shout", job.revision, enabled=False)
        before = count(place, "occurrences")
        with pytest.raises(SchedulerKernelError) as disabled:
            tasks.defer_many(
                [{"task": add, "a": 1, "b": 2}, {"task": add, "a": 2, "b": 2}, {"task": shout, "text": "x"}]
            )
        assert (disabled.value.code, disabled.value.details["index"]) == ("SCHEDULER_JOB_DISABLED", 2)
        with pytest.raises(SchedulerKernelError) as after_key:
            tasks.defer_many(
                [{"task": add, "a": 1, "b": 2, "key": "k9"}, *[{"task": shout, "text": "x"}] * 2]
            )
        assert (after_key.value.code, after_key.value.details["index"]) == ("SCHEDULER_JOB_DISABLED", 1)
        assert count(place, "occurrences") == before


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda t: t.defer(object()), "a value that is not JSON"),
        (lambda t: t.defer(math.nan), "NaN"),
        (lambda t: t.defer(2**60), "an int beyond 2**53"),
        (lambda t: t.defer("a", "b"), "too many arguments"),
        (lambda t: t.defer(nope=1), "an unknown keyword"),
        (lambda t: t.defer(), "a missing argument"),
        (lambda t: t.defer(1, key=""), "an empty key"),
        (lambda t: t.defer(1, key="a\x01b"), "a control character in the key"),
        (lambda t: t.defer(1, key="k" * 300), "a key too long"),
        (lambda t: t.defer(1, run_at="tomorrow"), "run_at text"),
        (lambda t: t.defer(1, run_at=-1), "a negative run_at"),
        (lambda t: t.defer(1, run_at=True), "a bool run_at"),
        (lambda t: t.defer(1, run_at=1.5), "a float run_at"),
        (lambda t: t.defer(1, connection="not a connection"), "a connection that is none"),
        (lambda t: t.defer_many([{"value": 1}, "x"]), "a defer_many item that is no dict"),
        (lambda t: t.defer_many({"value": 1}), "defer_many of a dict"),
    ],
)
def test_bad_input_is_an_invalid_argument_and_writes_nothing(place: StorePlace, call: Any, what: str) -> None:
    place.open().close()  # the schema exists, empty
    with tasks_on(place) as tasks:
        task = tasks.task(name="one")(lambda value: value)
        with pytest.raises(SchedulerKernelError) as refused:
            call(task)
        assert refused.value.code == INVALID, what
        assert (count(place, "occurrences"), count(place, "jobs"), count(place, "events")) == (0, 0, 0)


def test_get_of_an_unknown_run_is_none_and_of_a_bad_id_an_error(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        assert tasks.get("occ_" + "0" * 64) is None
        with pytest.raises(SchedulerKernelError) as bad:
            tasks.get(42)  # type: ignore[arg-type]
        assert bad.value.code == INVALID


def _define(tasks: Tasks, **options: Any) -> Any:
    return tasks.task(name="t", **options)(lambda: None)


@pytest.mark.parametrize(
    ("define", "what"),
    [
        (lambda t: t.periodic(cron="61 * * * *")(lambda: None), "minute 61"),
        (lambda t: t.periodic(cron="0 0 30 2 *")(lambda: None), "February 30"),
        (lambda t: t.periodic(cron="* * * *")(lambda: None), "four fields"),
        (lambda t: t.periodic(cron="0 8 * * *", timezone="Mars/Olympus")(lambda: None), "an unknown zone"),
        (lambda t: t.periodic(every_ms=0)(lambda: None), "a zero interval"),
        (lambda t: t.periodic(every_ms=-5)(lambda: None), "a negative interval"),
        (lambda t: t.periodic(every_ms=1.5)(lambda: None), "a float interval"),
        (lambda t: t.periodic(every_ms=True)(lambda: None), "a bool interval"),
        (lambda t: t.periodic()(lambda: None), "no schedule"),
        (lambda t: t.periodic(cron="* * * * *", every_ms=5)(lambda: None), "two schedules"),
        (lambda t: t.periodic(every_ms=5)(lambda tick, other: None), "a tick function needing two values"),
        (lambda t: t.periodic(every_ms=5)(lambda *, when: None), "a tick function needing a keyword"),
        (lambda t: t.periodic(every_ms=5, timezone="UTC")(lambda: None), "a zone without cron"),
        (lambda t: t.task(name="t")(lambda key: None), "a parameter named key"),
        (lambda t: t.task(name="t")(lambda run_at=None: None), "a parameter named run_at"),
        (lambda t: t.task(name="t")(lambda *, connection: None), "a parameter named connection"),
        (lambda t: _define(t, queue=""), "an empty queue"),
        (lambda t: _define(t, queue="q" * 129), "a queue too long"),
        (lambda t: _define(t, max_attempts=0), "no attempts"),
        (lambda t: _define(t, max_attempts=33), "too many attempts"),
        (lambda t: _define(t, timeout_ms=0), "a zero time limit"),
        (lambda t: _define(t, retry={"base_ms": 5}), "a retry that is no RetryPolicy"),
        (lambda t: _define(t, pausable="yes"), "pausable that is no bool"),
        (lambda t: t.task(name="\x00")(lambda: None), "a name with NUL"),
        (lambda t: t.task(_main_function()), "a function of __main__ without name="),
        (lambda t: RetryPolicy(base_ms=-1), "a negative retry delay"),
    ],
)
def test_definitions_are_checked_when_decorated(tmp_path: Path, define: Any, what: str) -> None:
    tasks = Tasks(tmp_path / "never-opened.sqlite")
    with pytest.raises(SchedulerKernelError) as refused:
        define(tasks)
    assert refused.value.code == INVALID, what
    assert not (tmp_path / "never-opened.sqlite").exists()  # decorating touches no database


def test_a_periodic_function_takes_the_tick_or_nothing(tmp_path: Path) -> None:
    tasks = Tasks(tmp_path / "never-opened.sqlite")
    for number, function in enumerate(
        [lambda: None, lambda tick: None, lambda tick, other=1: None, lambda *ticks: None, lambda ctx: None]
    ):
        assert tasks.periodic(every_ms=5, name=f"p{number}")(function).definition.periodic


def _main_function() -> Any:
    def job() -> None: ...

    job.__module__ = "__main__"
    return job


def test_options_of_tasks_are_checked(tmp_path: Path) -> None:
    target = tmp_path / "k.sqlite"
    for options in (
        {"principal": {"type": "service"}},
        {"queues": {"q": {"concurrency": 0}}},
        {"queues": {"q": {"limit": 3}}},
        {"queues": ["q"]},
        {"busy_timeout_ms": -1},
        {"clock": "now"},
    ):
        with pytest.raises(SchedulerKernelError) as refused:
            Tasks(target, **options)
        assert refused.value.code == INVALID, options
    with pytest.raises(SchedulerKernelError):
        Tasks(42)
    assert not target.exists()


def test_registration_creates_then_updates_a_changed_definition(place: StorePlace) -> None:
    with tasks_on(place) as tasks:
        tasks.task(name="report", max_attempts=2)(lambda: None)
        (job,) = tasks.register()
        assert (job.revision, job.max_attempts, job.kind) == (1, 2, "default")
        assert tasks.register()[0].revision == 1  # unchanged: nothing written
    with tasks_on(place, principal={"type": "service", "id": "shop"}) as changed:
        changed.periodic(name="report", queue="reports", every_ms=60_000, pausable=True)(lambda tick: None)
        (job,) = changed.register()
        assert (job.revision, job.kind, job.trigger) == (
            2,
            "reports",
            {"type": "interval", "everyMs": 60_000},
        )
        assert job.authority["principal"] == {"type": "service", "id": "shop"}
        assert job.payload["runtimeControl"]["pauseResume"] == "checkpoint_v1"


def test_registration_sends_only_the_changed_fields(place: StorePlace) -> None:
    """A periodic task whose ``max_attempts`` changed: the update names that field alone, so the
    schedule (its trigger) is not counted as changed."""
    with tasks_on(place) as tasks:
        tasks.periodic(name="beat", every_ms=60_000, max_attempts=2)(lambda tick: None)
        tasks.register()
    with tasks_on(place) as changed:
        changed.periodic(name="beat", every_ms=60_000, max_attempts=5)(lambda tick: None)
        (job,) = changed.register()
        assert (job.revision, job.max_attempts) == (2, 5)
        with place.open() as store:
            assert store.periodic_state(job_id="beat").trigger_changed_at is None
    rows = place.sql("SELECT data_json FROM events WHERE event_type = 'job_updated'")
    assert [row[0] for row in rows] == ['{"changedFields":["maxAttempts"],"fromRevision":1,"toRevision":2}']
