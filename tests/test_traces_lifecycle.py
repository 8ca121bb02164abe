"""Replays the recorded lifecycle traces of the original implementation against this store."""

from __future__ import annotations

import sys

import pytest
from lifecycle_support import TOOLS, TRACES

TRACE_NAMES = ("lifecycle_basic", "claim_filters_and_ordering", "lease_expiry_and_renewal")

pytestmark = pytest.mark.skipif(
    not (TRACES.is_dir() and (TOOLS / "trace_replay.py").is_file()),
    reason=f"shared fixtures/tools not found next to the repository ({TRACES.parent.parent})",
)


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_trace_replays_identically(name: str) -> None:
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    from trace_replay import replay

    ok, applicable, failures, dump_problems = replay(str(TRACES / f"{name}.json"))
    assert failures == []
    assert dump_problems == []
    assert applicable > 0
    assert ok == applicable
