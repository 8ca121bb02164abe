"""Replays the recorded migration traces against this implementation (results and final dumps)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TOOLS = SHARED / "tools"
TRACES = SHARED / "fixtures" / "traces"


@pytest.mark.skipif(not (TOOLS / "trace_replay.py").exists(), reason=f"trace replay tool absent: {TOOLS}")
@pytest.mark.parametrize("scenario", ["migration_happy_path", "source_locators"])
def test_trace_replays_identically(scenario: str) -> None:
    trace = TRACES / f"{scenario}.json"
    if not trace.exists():
        pytest.skip(f"trace absent: {trace}")
    sys.path.insert(0, str(TOOLS))
    try:
        from trace_replay import replay
    finally:
        sys.path.remove(str(TOOLS))
    ok, applicable, failures, dump_problems = replay(str(trace))
    assert failures == []
    assert dump_problems == []
    assert applicable > 0
    assert ok == applicable
