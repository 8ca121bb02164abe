"""list_dead_letters / list_adjudication_cases read dead letters through their events, in the seed's order.

Randomized histories (dead letters of several jobs, ties on ``settled_at``, outcome-unknown
codes, adjudicated cases, requeued and dead-lettered again) with a clock that never goes
backwards: the results must be exactly the seed's queries' (``ORDER BY settled_at DESC,
occurrence_id``), with the walk's budget and page margin shrunk so that paging, tie completion
and the fallback to the seed's query all run. On both backends (``place``; on PostgreSQL the
seed's ``GLOB`` is spelled as the equivalent regular expression).
API §5 list_dead_letters, list_adjudication_cases.
"""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import pytest
from backends import POSTGRESQL, SQLITE
from hypothesis import given, settings
from hypothesis import strategies as st
from store_places import StorePlace, examples

from scheduler import SchedulerStore
from scheduler.store.capabilities import dead_letters

T0 = 1767225600000
AUTHORITY = {"principal": {"type": "user", "id": "u"}}
SEED_DEAD_LETTERS = (  # the seed's query (the parameter typed, which PostgreSQL needs)
    "SELECT occurrence_id FROM occurrences WHERE status = 'dead_letter' "
    "AND (CAST(? AS TEXT) IS NULL OR job_id = ?) ORDER BY settled_at DESC, occurrence_id LIMIT ?"
)
SEED_CANDIDATES = """
    SELECT o.occurrence_id FROM occurrences o
    LEFT JOIN scheduler_occurrence_adjudications a ON a.occurrence_id = o.occurrence_id
    WHERE o.status = 'dead_letter' AND a.occurrence_id IS NULL
      AND {outcome_unknown}
    ORDER BY o.settled_at DESC, o.occurrence_id LIMIT 1000
"""
OUTCOME_UNKNOWN = {  # the seed's GLOB, and the same test on PostgreSQL
    SQLITE: "json_extract(o.last_error_json, '$.code') GLOB '*_OUTCOME_UNKNOWN'",
    POSTGRESQL: "(CAST(o.last_error_json AS json) ->> 'code') ~ '^.*_OUTCOME_UNKNOWN$'",
}


def seed_candidates(place: StorePlace) -> list[str]:
    query = SEED_CANDIDATES.format(outcome_unknown=OUTCOME_UNKNOWN[place.backend])
    return [row[0] for row in place.sql(query)]


class Clock:
    def __init__(self) -> None:
        self.now = T0 + 10_000

    def __call__(self) -> int:
        return self.now


STEP = st.tuples(
    st.sampled_from(["a", "b"]),  # job
    st.sampled_from(["boom", "HANDLER_OUTCOME_UNKNOWN", "X_OUTCOME_UNKNOWN"]),  # error code
    st.sampled_from([0, 0, 1, 5]),  # clock advance (ties are common)
    st.sampled_from(["none", "none", "requeue", "adjudicate"]),  # what happens next
)


def build(store: SchedulerStore, clock: Clock, steps: list[tuple[str, str, int, str]]) -> None:
    for index, (job, code, advance, then) in enumerate(steps):
        clock.now += advance
        store.enqueue_occurrence(job_id=job, scheduled_for=T0 + index, trigger_key=f"t{index}")
        held = store.claim_next(owner_id="w", lease_ms=60_000, job_kind=job)
        assert held is not None
        dead = store.settle(
            occurrence_id=held.id,
            owner_id="w",
            fence=held.fence,
            outcome="failed",
            retryable=False,
            error={"code": code, "message": "m"},
        )
        if then == "requeue":
            clock.now += advance
            store.requeue_dead_letter(
                occurrence_id=dead.id,
                expected_fence=dead.fence,
                expected_error_code=code,
                request_id=f"rq{index}",
            )
            again = store.claim_next(owner_id="w", lease_ms=60_000, job_kind=job)
            assert again is not None
            store.settle(
                occurrence_id=again.id, owner_id="w", fence=again.fence, outcome="failed", retryable=False
            )
        elif then == "adjudicate" and code.endswith("_OUTCOME_UNKNOWN"):
            case = store.get_adjudication_case(dead.id)
            assert case is not None and case.evidence_digest is not None
            store.adjudicate_occurrence(
                occurrence_id=dead.id,
                decision="confirmed_not_applied",
                expected_evidence_digest=case.evidence_digest,
                expected_attempt=case.attempt,
                expected_fence=case.fence,
                reason_digest="sha256:" + "cd" * 32,
                operator_digest="sha256:" + "ef" * 32,
            )


LISTINGS = {
    "steps": st.lists(STEP, min_size=1, max_size=10),
    "limit": st.integers(1, 6),
    "job": st.sampled_from([None, "a", "b"]),
    # (events read before the sorting query's cost is first checked, first range's margin, rows
    # the sorting query may read at that check)
    "bounds": st.sampled_from(
        [(10_000, 16, 1024), (10_000, 0, 1024), (3, 0, 0), (8, 1, 2), (1, 0, 0), (2, 0, 1000), (1, 1, 1)]
    ),
}


def test_dead_letter_listings_match_the_seed(place: StorePlace) -> None:
    @settings(max_examples=examples(place, 60), deadline=None)
    @given(**LISTINGS)
    def listings_match(steps: Any, limit: int, job: str | None, bounds: tuple[int, int, int]) -> None:
        listings_match_the_seed(place.sibling("dl"), steps, limit, job, bounds)

    listings_match()


def listings_match_the_seed(
    place: StorePlace, steps: Any, limit: int, job: str | None, bounds: tuple[int, int, int]
) -> None:
    clock = Clock()
    store = place.open(clock=clock)
    try:
        for job_id in ("a", "b"):
            store.create_job(id=job_id, kind=job_id, authority=AUTHORITY, max_attempts=1)
        build(store, clock, steps)
        expected = [row[0] for row in place.sql(SEED_DEAD_LETTERS, (job, job, limit))]
        candidates = seed_candidates(place)
        eligible = [case for case in map(store.get_adjudication_case, candidates) if case and case.eligible]
        budget, margin, sort = bounds
        with (
            patch.object(dead_letters, "EVENT_SCAN_BUDGET", budget),
            patch.object(dead_letters, "PAGE_MARGIN", margin),
            patch.object(dead_letters, "SORT_BUDGET", sort),
        ):
            listed = store.list_dead_letters(job_id=job, limit=limit)
            cases = store.list_adjudication_cases(limit=limit)
        assert [occurrence.id for occurrence in listed] == expected
        assert cases == eligible[:limit]
    finally:
        store.close()


def test_a_dead_letter_requeued_and_dead_lettered_again_in_its_millisecond_counts_once(
    place: StorePlace,
) -> None:
    """Found by the randomized test: two dead-lettering events of one occurrence at one time filled
    the first range's candidates, and b's other dead letter of that time was skipped."""
    steps = [("a", "boom", 0, "none")] * 2 + [("b", "boom", 0, "none")] + [("a", "boom", 0, "none")] * 3
    steps += [("b", "boom", 0, "none"), ("b", "boom", 0, "requeue")] + [("a", "boom", 0, "none")] * 2
    listings_match_the_seed(place.sibling("twice"), steps, 2, "b", (10_000, 0, 1024))


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_ties_on_settled_at_are_completed_across_pages(place: StorePlace, limit: int) -> None:
    clock = Clock()
    store = place.open(clock=clock)
    try:
        for job_id in ("a", "b"):
            store.create_job(id=job_id, kind=job_id, authority=AUTHORITY, max_attempts=1)
        build(store, clock, [("a", "boom", 0, "none")] * 5)  # five dead letters in one millisecond
        expected = [row[0] for row in place.sql(SEED_DEAD_LETTERS, (None, None, limit))]
        with patch.object(dead_letters, "PAGE_MARGIN", 0):
            assert [occurrence.id for occurrence in store.list_dead_letters(limit=limit)] == expected
    finally:
        store.close()
