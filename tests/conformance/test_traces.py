"""Every recorded trace of the original replays identically (results, errors, final tables).

Parametrized by backend (``replay.REPLAY_BACKENDS``): a new backend gets every trace without a new test.
On PostgreSQL every trace replays in a fresh schema, except ``upgrade_v1_then_operate``, which starts
from the recorded SQLite file ``reference-dbs/v1.sqlite`` (skipped with that reason).
API §8 Results.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from backends import POSTGRESQL
from recorded import TRACES
from replay import REPLAY_BACKENDS, NotApplicable, replay

TRACE_NAMES = sorted(path.stem for path in TRACES.glob("*.json"))
# Recorded calls with no Python spelling (replay.NotApplicable): claimNext({jobKind: null}) is
# rejected by the original, while Python's job_kind=None means "no filter".
NOT_APPLICABLE: dict[str, list[str]] = {"claim_filters_and_ordering": ["#34 claimNext"]}


def test_every_recorded_trace_is_replayed() -> None:
    assert len(TRACE_NAMES) == 8


@pytest.mark.parametrize("backend", sorted(REPLAY_BACKENDS))
@pytest.mark.parametrize("name", TRACE_NAMES)
def test_trace_replays_identically(
    name: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    path = TRACES / f"{name}.json"
    if backend == POSTGRESQL:
        request.getfixturevalue("postgres_server")  # fails when the configured server is down
    try:
        report = replay(path, REPLAY_BACKENDS[backend](tmp_path / "replay"))
    except NotApplicable as reason:
        pytest.skip(f"{name} on {backend}: {reason}")
    assert report.failures == []
    assert report.dump_problems == []
    assert [entry.split(":")[0] for entry in report.not_applicable] == NOT_APPLICABLE.get(name, [])
    recorded = json.loads(path.read_text(encoding="utf-8"))
    assert report.identical == report.applicable == recorded["call_count"] - len(report.not_applicable)
