"""Replay the recorded governance traces of the original implementation against this API."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from governance_support import TOOLS, TRACES

GOVERNANCE_TRACES = ("authority_policy_and_budget", "runtime_pause_resume", "upgrade_v1_then_operate")


def _replay() -> Any:
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    from trace_replay import replay

    return replay


@pytest.mark.skipif(not (TOOLS / "trace_replay.py").is_file(), reason=f"trace_replay.py not found in {TOOLS}")
@pytest.mark.parametrize("scenario", GOVERNANCE_TRACES)
def test_trace_replays_identically(scenario: str) -> None:
    path = TRACES / f"{scenario}.json"
    if not path.is_file():
        pytest.skip(f"trace {path} not found")
    ok, applicable, failures, dump_problems = _replay()(str(path))
    assert failures == []
    assert dump_problems == []
    assert ok == applicable
    recorded = json.loads(path.read_text())
    assert applicable == recorded["call_count"]  # every call of these traces applies to the Python API
