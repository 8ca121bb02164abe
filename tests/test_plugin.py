"""The pytest plugin (``pytest11`` entry point ``scheduler``) and its helpers, run with ``pytester``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from scheduler.testing import T0, SchedulerClock, store_on

pytest_plugins = ["pytester"]


def test_clock_starts_at_t0_and_moves_only_when_told() -> None:
    clock = SchedulerClock()
    assert clock() == clock.now == T0 == 1_767_225_600_000
    assert clock.advance(1500) == T0 + 1500 == clock()
    assert clock.set(42) == 42 == clock.now
    assert repr(clock) == "SchedulerClock(now=42)"


@pytest.mark.parametrize("bad", [-1, 2**53, 1.5, True, "1"])
def test_clock_rejects_values_that_are_not_epoch_ms(bad: object) -> None:
    clock = SchedulerClock()
    with pytest.raises((TypeError, ValueError)):
        clock.set(bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError)):
        clock.advance(bad)  # type: ignore[arg-type]
    assert clock() == T0


def test_store_on_rejects_other_targets() -> None:
    with pytest.raises(TypeError):
        store_on("/tmp/not-an-engine.sqlite")


def test_plugin_is_registered_through_the_entry_point(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_registered(request):
            plugin = request.config.pluginmanager.get_plugin("scheduler")
            assert plugin is not None and plugin.__name__ == "scheduler.testing.plugin"
        """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


def test_fixtures_clock_and_store(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import stat

        AUTHORITY = {"principal": {"type": "service", "id": "app"}}
        OPENED = []

        def test_clock(scheduler_clock):
            assert scheduler_clock() == scheduler_clock.now == 1767225600000
            scheduler_clock.advance(250)
            assert scheduler_clock() == 1767225600250

        def test_clock_is_fresh_per_test(scheduler_clock):
            assert scheduler_clock.now == 1767225600000

        def test_store_is_v6_on_a_private_temporary_file(scheduler_store, tmp_path):
            assert scheduler_store.schema_info().schema_version == 6
            files = list(tmp_path.rglob("*.sqlite"))
            assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600

        def test_store_uses_the_clock(scheduler_store, scheduler_clock):
            job = scheduler_store.create_job(id="job-1", kind="report", authority=AUTHORITY)
            assert job.created_at == 1767225600000
            scheduler_clock.advance(5000)
            updated = scheduler_store.update_job("job-1", 1, enabled=False)
            assert updated.updated_at == 1767225605000
            OPENED.append(scheduler_store)

        def test_store_was_closed_at_teardown():
            assert OPENED[0].closed
        """
    )
    pytester.runpytest_inprocess().assert_outcomes(passed=5)


def test_store_on_an_application_engine_and_connection(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from sqlalchemy import create_engine, text

        AUTHORITY = {"principal": {"type": "service", "id": "app"}}
        OPENED = []

        def test_on_engine(scheduler_store_on, scheduler_clock, tmp_path):
            engine = create_engine(f"sqlite:///{tmp_path / 'app.sqlite'}")
            store = scheduler_store_on(engine)
            assert store.create_job(id="j", kind="k", authority=AUTHORITY).created_at == scheduler_clock.now
            OPENED.append(store)

        def test_engine_store_was_closed():
            assert OPENED[0].closed

        def test_on_connection_joins_the_application_transaction(scheduler_store_on, tmp_path):
            engine = create_engine(f"sqlite:///{tmp_path / 'app.sqlite'}")
            scheduler_store_on(engine)  # creates the v6 schema once
            with engine.connect() as connection:
                connection.exec_driver_sql("CREATE TABLE orders (id TEXT)")
                connection.commit()
                transaction = connection.begin()
                store = scheduler_store_on(connection, clock=lambda: 5)
                connection.execute(text("INSERT INTO orders VALUES ('o-1')"))
                job = store.create_job(id="outbox", kind="k", authority=AUTHORITY)
                assert job.created_at == 5
                transaction.rollback()
                assert store.get_job("outbox") is None
                assert connection.exec_driver_sql("SELECT count(*) FROM orders").scalar() == 0
        """
    )
    pytester.runpytest_inprocess().assert_outcomes(passed=3)


def test_store_on_engine_helper_opens_v6(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path}/helper.sqlite")
    with store_on(engine, clock=SchedulerClock()) as store:
        assert store.schema_info().schema_version == 6
    engine.dispose()


def test_the_examples_in_docs_testing_md_pass(pytester: pytest.Pytester) -> None:
    guide = Path(__file__).resolve().parents[1] / "docs" / "testing.md"
    blocks = re.findall(r"```python\n(.*?)```", guide.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 4
    pytester.makepyfile("\n\n".join(blocks))
    pytester.runpytest_inprocess().assert_outcomes(passed=4)


def test_plugin_can_be_disabled(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_uses(scheduler_clock):\n    pass\n")
    pytester.runpytest_inprocess("-p", "no:scheduler").assert_outcomes(errors=1)


def test_an_engine_store_leaves_the_application_engine_transactional(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'app.sqlite'}")
    store_on(engine).close()
    with engine.connect() as connection:
        connection.exec_driver_sql("CREATE TABLE orders (id TEXT)")
        connection.commit()
    with pytest.raises(RuntimeError), engine.begin() as connection:
        connection.exec_driver_sql("INSERT INTO orders VALUES ('o-1')")
        raise RuntimeError("the business step failed")
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT count(*) FROM orders").scalar() == 0
    engine.dispose()
