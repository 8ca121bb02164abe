"""Every recorded trace replays identically through the async API (``scheduler.aio``).

aiosqlite on the recording's SQLite file; asyncpg and async psycopg on a fresh PostgreSQL schema
(the traces that start from a recorded SQLite file do not apply there, API §8). The checks are
``test_traces.py``'s: every applicable call's result or error, then the final tables.
API §8 Results, §9 (scheduler.aio).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from async_replay import ASYNC_REPLAY_BACKENDS, sync_postgresql_backend
from backends import POSTGRESQL
from recorded import TRACES
from replay import replay
from test_traces import NOT_APPLICABLE, TRACE_NAMES


def _calls(failures: list[str]) -> list[str]:
    """The calls that differ (``#seq op``), without the drivers' own error texts."""
    return [failure.split(":")[0] for failure in failures]


DRIVERS = [
    pytest.param(driver, marks=[pytest.mark.postgresql] if backend == POSTGRESQL else [])
    for driver, (backend, _factory) in sorted(ASYNC_REPLAY_BACKENDS.items())
]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("name", TRACE_NAMES)
def test_trace_replays_identically_through_the_async_store(
    name: str, driver: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    backend_name, make_backend = ASYNC_REPLAY_BACKENDS[driver]
    if backend_name == POSTGRESQL:
        request.getfixturevalue("postgres_server")  # skips without a configured server
    path = TRACES / f"{name}.json"
    recorded = json.loads(path.read_text(encoding="utf-8"))
    if backend_name == POSTGRESQL and recorded.get("initial_db"):
        pytest.skip("starts from a recorded SQLite file (API §8: not replayed on PostgreSQL)")
    report = replay(path, make_backend(tmp_path / "replay"))
    if backend_name == POSTGRESQL and (report.failures or report.dump_problems):
        reference = replay(path, sync_postgresql_backend(tmp_path / "sync"))
        assert _calls(report.failures) == _calls(reference.failures)
        assert report.dump_problems == reference.dump_problems
        if reference.failures or reference.dump_problems:
            pytest.xfail("the synchronous store differs from the recording on PostgreSQL in the same calls")
    assert report.failures == []
    assert report.dump_problems == []
    assert [entry.split(":")[0] for entry in report.not_applicable] == NOT_APPLICABLE.get(name, [])
    assert report.identical == report.applicable == recorded["call_count"] - len(report.not_applicable)
