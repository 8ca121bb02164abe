"""Property tests of the value contract (canonical JSON, numbers, identities)."""

from __future__ import annotations

import hashlib
import json
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.contract import (
    MAX_SAFE_INTEGER,
    SchedulerKernelError,
    canonical_json,
    derive_occurrence_identity,
    js_number,
    normalize_json,
    utf16_sorted,
)

safe_ints = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
keys = st.text(max_size=8) | st.sampled_from(["0", "1", "2", "10", "01", "-1", "4294967294", "4294967295"])
json_values = st.recursive(
    st.none() | st.booleans() | safe_ints | finite_floats | st.text(max_size=12),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(keys, children, max_size=5),
    max_leaves=30,
)
# Letters, digits, punctuation and symbols: never trimmed, never control characters.
identifiers = st.text(alphabet=st.characters(categories=["L", "N", "P", "S"]), min_size=1, max_size=40)


def _parse_int(text: str) -> int | float:
    # JavaScript prints large integral doubles as digits; read them back as the double they were.
    number = int(text)
    return number if abs(number) <= MAX_SAFE_INTEGER else float(text)


@settings(max_examples=300)
@given(json_values)
def test_canonical_json_round_trips_through_json_loads(value: Any) -> None:
    text = canonical_json(value)
    assert json.loads(text, parse_int=_parse_int) == value
    assert json.loads(text, parse_int=_parse_int) == normalize_json(value)
    assert canonical_json(normalize_json(value)) == text


@settings(max_examples=200)
@given(st.dictionaries(keys, json_values, max_size=8), st.randoms(use_true_random=False))
def test_canonical_json_ignores_key_insertion_order(value: dict[str, Any], rng: random.Random) -> None:
    items = list(value.items())
    rng.shuffle(items)
    assert canonical_json(dict(items)) == canonical_json(value)


@given(st.lists(st.text(max_size=6), max_size=10))
def test_utf16_sorted_matches_code_unit_order(values: list[str]) -> None:
    expected = sorted(values, key=lambda text: text.encode("utf-16-be", "surrogatepass"))
    assert utf16_sorted(values) == expected


@settings(max_examples=500)
@given(finite_floats)
def test_js_number_round_trips_and_uses_javascript_exponent_rules(number: float) -> None:
    text = js_number(number)
    assert float(text) == number
    magnitude = abs(number)
    uses_exponent = "e" in text
    assert uses_exponent == (magnitude != 0 and (magnitude >= 1e21 or magnitude < 1e-6))
    assert not text.endswith(".0")
    if uses_exponent:
        assert "e+" in text or "e-" in text


@given(st.one_of(st.integers(min_value=MAX_SAFE_INTEGER + 1), st.integers(max_value=-MAX_SAFE_INTEGER - 1)))
def test_ints_beyond_the_safe_range_are_rejected(number: int) -> None:
    with pytest.raises(SchedulerKernelError) as raised:
        canonical_json({"n": [number]})
    assert raised.value.code == "SCHEDULER_INVALID_ARGUMENT"
    assert raised.value.message.startswith("value.n[0] ")


@given(identifiers, st.integers(1, MAX_SAFE_INTEGER - 1), st.integers(0, MAX_SAFE_INTEGER), identifiers)
def test_occurrence_identity_is_deterministic_and_matches_its_definition(
    job_id: str, revision: int, scheduled_for: int, trigger_key: str
) -> None:
    first = derive_occurrence_identity(
        job_id=job_id, job_revision=revision, scheduled_for=scheduled_for, trigger_key=trigger_key
    )
    second = derive_occurrence_identity(
        job_id=job_id, job_revision=revision, scheduled_for=scheduled_for, trigger_key=trigger_key
    )
    assert first == second
    material = canonical_json(
        {
            "contractVersion": 1,
            "jobId": job_id,
            "jobRevision": revision,
            "scheduledFor": scheduled_for,
            "triggerKey": trigger_key,
        }
    )
    digest = hashlib.sha256(b"chainlesschain.scheduler.occurrence.v1\0" + material.encode()).hexdigest()
    assert first.occurrence_id == f"occ_{digest}"
    assert first.idempotency_key == f"scheduler:v1:{digest}"
    bumped = derive_occurrence_identity(
        job_id=job_id, job_revision=revision + 1, scheduled_for=scheduled_for, trigger_key=trigger_key
    )
    assert bumped.occurrence_id != first.occurrence_id


@given(finite_floats)
def test_floats_normalize_like_javascript_numbers(number: float) -> None:
    normalized = normalize_json(number)
    assert normalized == number
    if number.is_integer() and abs(number) <= MAX_SAFE_INTEGER:
        assert type(normalized) is int
    assert not (isinstance(normalized, float) and math.copysign(1.0, normalized) < 0 and normalized == 0)
