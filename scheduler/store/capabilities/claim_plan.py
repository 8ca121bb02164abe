"""The seed's claim rules for candidate rows, and the order successive claims take them in.

:class:`ClaimPlan` receives the rows of the claim statements (:mod:`scheduler.store.capabilities.claim_query`)
and yields sweep batches and claim candidates in the order successive seed ``claimNext`` calls
would take them (:func:`read_plan` runs the statements). A claim step that cannot take a
candidate (another worker holds it: ``scheduler.backends.postgresql.claim_locks``) simply asks for the next
one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Final

from scheduler.contract.constants import QUEUED, RETRY_WAIT, RUNNING
from scheduler.store.capabilities import claim_query
from scheduler.store.capabilities.claim_eligibility import (
    ARM_EXPIRED,
    ARM_QUEUED,
    ARM_RETRY_WAIT,
    ATTEMPT_NEUTRAL_CONTROLS,
    PAUSE_REQUESTED,
    PAUSED,
    RESUMED,
    WINDOW_MARKERS,
    ClaimFilter,
)
from scheduler.store.capabilities.claim_query import (
    GROWTH,
    PAST_TIES,
    SWEEP_LIMIT,
    beyond_window_params,
    claim_next_params,
    claim_next_prepared,
    eligible_job_rows_statement,
    eligible_jobs_statement,
    head_probe_params,
    head_probe_prepared,
    page_params,
    rows_statement,
    walk_statement,
)
from scheduler.store.plumbing.statement_plans import StoredRow
from scheduler.store.plumbing.tx import Tx

DUE_STREAMS: Final = (ARM_QUEUED, ARM_RETRY_WAIT)
WalkKey = tuple[int, int, str]
"""A waiting row's place in the seed's order: (``available_at``, ``scheduled_for``, ``occurrence_id``)."""


def walk_key(row: StoredRow) -> WalkKey:
    return (row.available_at, row.scheduled_for, row.occurrence_id)


class ClaimContention:
    """What one store's recent single claims met, to choose how a claim reads its candidates.

    The store keeps one and hands it to its backend's claim tactic (``Backend.claim``); only a
    backend with concurrent writers reads it (PostgreSQL's ``claim_tactics``).

    While the first candidate of each claim was free, a single claim reads only the heads of the
    queue (``claim_query.head_probe_prepared``, what the SQLite store reads: ~40% of the full
    read's server time) and locks the head. Once a head was held by another worker, claims read
    the first ``claim_query.HEAD_WINDOW`` due rows of each waiting status instead (the window,
    ``claim_plan.window_plan``; within ``settle_and_claim``, in the cycle's first statement) and
    lock the first free one (``claim_locks.lock_candidates``: ``LOCK_CANDIDATE_ROWS`` in a
    transaction the store owns, ``LOCK_CANDIDATES`` in a savepoint otherwise), reading the full list
    only when the window cannot decide, until :data:`QUIET_CLAIMS` claims in a row took their
    first candidate. The choice changes only which statements find the candidate, never which one
    is claimed.
    """

    __slots__ = ("quiet",)

    QUIET_CLAIMS: Final = 8

    def __init__(self) -> None:
        self.quiet = self.QUIET_CLAIMS

    @property
    def probe_first(self) -> bool:
        return self.quiet >= self.QUIET_CLAIMS

    def took_first(self, first: bool) -> None:
        """Record whether a claim locked its first candidate."""
        self.quiet = self.quiet + 1 if first else 0

    AMONG_WORKERS: Final = -(10**9)
    """A :attr:`quiet` no run of claims ever brings back to :data:`QUIET_CLAIMS`."""

    def stay_among_workers(self) -> None:
        """Keep claims on the path among workers, whatever they meet (benchmarks and tests that
        measure or pin that path with one worker)."""
        self.quiet = self.AMONG_WORKERS


class LockedAsProbed:
    """A probed head (``claim_locks.locked_head``) with the occurrence columns of its row as the
    probe statement locked it (the newest version) and its runtime control, requeue request and
    job as probed (none, none, eligible: ``head_plain`` of ``queries.sql``'s ``claim_head``). A claim
    of it is written with ``claim_eligibility.PLAIN_CLAIM_GUARD``, which checks those three again
    after the lock; where they changed, nothing is written and the call runs again
    (``RestartTransaction``)."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(self._values)


def sort_key(row: StoredRow) -> tuple[int, int, str]:
    """The seed's ORDER BY: lease expiry for running rows, availability otherwise."""
    first = row.lease_expires_at if row.status == RUNNING else row.available_at
    return (first, row.scheduled_for, row.occurrence_id)


def attempts_allow(row: StoredRow) -> bool:
    """Attempts left, or a claim that does not count one (pause/resume control, requeue)."""
    return (
        row.attempt < row.max_attempts
        or row.control_state in ATTEMPT_NEUTRAL_CONTROLS
        or row.retry_request_id is not None
    )


def keeps_attempt(row: StoredRow) -> bool:
    """The claim's attempt increment is 0 (seed: the CASE in the claim UPDATE).

    A requeue request keeps the attempt of a run that used one; a run cancelled before any claim
    (attempt 0, the only way a never-claimed run becomes a requeueable dead letter) is claimed as
    attempt 1, so no run is ever ``running`` at attempt 0 (an adjudication needs a positive one)."""
    state = row.control_state
    return (
        state == PAUSE_REQUESTED
        or (state == RESUMED and row.control_expected_fence == row.fence)
        or (row.retry_request_id is not None and row.attempt > 0)
    )


def plain(row: StoredRow) -> bool:
    """A candidate claimable on its row alone: an eligible job, attempts left, no runtime control
    and no requeue request (what ``head_plain`` of ``queries.sql``'s ``claim_head`` tests in SQL;
    the claim ``UPDATE`` of such a row decided without reading it again re-checks it:
    ``claim_eligibility.PLAIN_CLAIM_GUARD``)."""
    return bool(
        row.job_ok
        and row.control_state is None
        and row.retry_request_id is None
        and row.attempt < row.max_attempts
    )


def sweepable(row: StoredRow) -> bool:
    """An expired final attempt the sweep dead-letters (not while a pause/resume is pending)."""
    return row.attempt >= row.max_attempts and row.control_state not in ATTEMPT_NEUTRAL_CONTROLS


def claimable(row: StoredRow, now: int) -> bool:
    """The seed's claim eligibility of one row (claimOccurrence's check)."""
    state = row.control_state
    if not row.job_ok or not attempts_allow(row) or state == PAUSED:
        return False
    if state == PAUSE_REQUESTED and row.status != RUNNING:
        return False
    if row.status in (QUEUED, RETRY_WAIT):
        return bool(row.available_at <= now)
    return row.status == RUNNING and bool(row.lease_expires_at <= now)


class ClaimPlan:
    """Sweep batches and claim candidates in the order successive seed ``claimNext`` calls take them.

    Claiming or sweeping a row changes only that row, so the candidates of later calls in the
    same transaction are the remaining rows of the same ordered streams.
    """

    __slots__ = (
        "_done",
        "_open",
        "_origin",
        "_read_limit",
        "_running",
        "_streams",
        "_sweep",
        "_truncated",
        "target",
        "window_ends",
    )

    def __init__(
        self,
        rows: Iterable[StoredRow],
        now: int,
        *,
        read_limit: int | None = None,
        done: set[str] | None = None,
        truncated: bool = False,
    ) -> None:
        """``rows``: the claim statement's result. With ``read_limit`` (the rows per due arm
        it was read for: :func:`first_per_arm`) the plan tracks which due arms may hold more
        rows than were read, and :meth:`next_candidate` stops rather than pass over them once
        they run dry. ``done``:
        occurrences already claimed, swept or given up in this transaction (left out; shared
        and extended by this plan). ``truncated``: the due rows given stop short of a row
        that may come before unread ones, so once they run out the next candidate is unknown."""
        expired: list[StoredRow] = []
        due: dict[str, list[StoredRow]] = {arm: [] for arm in DUE_STREAMS}
        self.window_ends: dict[str, WalkKey] = {}
        self.target: StoredRow | None = None
        for row in rows:
            arm = row.arm
            if arm == ARM_EXPIRED:
                expired.append(row)
            elif arm in due:
                due[arm].append(row)
            elif arm in WINDOW_MARKERS:
                self.window_ends[WINDOW_MARKERS[arm]] = walk_key(row)
            else:
                self.target = row
        self._read_limit = read_limit
        self._open: set[str] = set()
        if read_limit is not None:
            self._open = {arm for arm, streamed in due.items() if len(streamed) >= read_limit}
        self._truncated = truncated
        self._done: set[str] = set() if done is None else done
        if self._done:
            due = {arm: self._fresh(streamed) for arm, streamed in due.items()}
            expired = self._fresh(expired)
        self._streams = {arm: deque(sorted(rows, key=sort_key)) for arm, rows in due.items()}
        ordered = sorted(expired, key=lambda row: (row.lease_expires_at, row.occurrence_id))
        self._sweep = deque(row for row in ordered if sweepable(row))
        self._running = deque(sorted((row for row in expired if claimable(row, now)), key=sort_key))
        self._origin: dict[str, deque[StoredRow]] = {}

    def _fresh(self, rows: list[StoredRow]) -> list[StoredRow]:
        done = self._done
        return [row for row in rows if row.occurrence_id not in done]

    def short_windows(self, limit: int) -> list[tuple[str, WalkKey, int]]:
        """(arm, key of the window's last entry, rows missing) of each due arm that returned
        fewer than ``limit`` rows although its window was full: its remaining rows lie beyond
        the window."""
        short = []
        for arm, end in self.window_ends.items():
            missing = limit - len(self._streams[arm])
            if missing > 0:
                short.append((arm, end, missing))
        return short

    def extend(self, arm: str, rows: Sequence[StoredRow], asked: int | None = None) -> None:
        """Append a due arm's rows from beyond its window (all later in the order than its own);
        ``asked``: how many were asked for (all of them came: there may be more)."""
        if self._read_limit is not None and asked is not None and len(rows) >= asked:
            self._open.add(arm)
        fresh = self._fresh(list(rows)) if self._done else rows
        self._streams[arm].extend(sorted(fresh, key=sort_key))

    def next_sweep(self) -> list[StoredRow]:
        """The next (at most 100) expired final attempts to dead-letter."""
        batch: list[StoredRow] = []
        while self._sweep and len(batch) < SWEEP_LIMIT:
            row = self._sweep.popleft()
            if row.occurrence_id not in self._done:
                batch.append(row)
                self._done.add(row.occurrence_id)
        return batch

    @property
    def sweep_pending(self) -> bool:
        """Expired final attempts remain for later sweeps."""
        return any(row.occurrence_id not in self._done for row in self._sweep)

    @property
    def dry(self) -> bool:
        """A due arm that may hold unread rows has run out, or the due rows of a truncated plan
        have: the next candidate is unknown."""
        if self._truncated and not any(self._streams.values()):
            return True
        return any(not self._streams[arm] for arm in self._open)

    def next_candidate(self) -> StoredRow | None:
        """The next occurrence to claim, or ``None`` (also when :attr:`dry`: read again)."""
        while self._running and self._running[0].occurrence_id in self._done:
            self._running.popleft()
        if (self._open or self._truncated) and self.dry:
            return None
        streams = [stream for stream in (*self._streams.values(), self._running) if stream]
        if not streams:
            return None
        best = min(streams, key=lambda stream: sort_key(stream[0]))
        row = best.popleft()
        self._done.add(row.occurrence_id)
        self._origin[row.occurrence_id] = best
        return row

    def put_back(self, rows: Sequence[StoredRow]) -> None:
        """Return candidates just taken by :meth:`next_candidate` and not looked at (the last
        ones taken, in the order taken): the next calls yield them again, as if never taken."""
        for row in reversed(rows):
            self._origin.pop(row.occurrence_id).appendleft(row)
            self._done.discard(row.occurrence_id)

    def was_swept(self, occurrence_id: str) -> bool:
        return occurrence_id in self._done


def read_plan(tx: Tx, claim_filter: ClaimFilter, limit: int, done: set[str] | None = None) -> ClaimPlan:
    """The claim statement's candidates (``limit`` per due arm), completed beyond short windows.

    ``done`` (concurrent writers only): the occurrences this transaction already claimed, swept
    or passed over; the plan leaves them out and tracks arms that may hold unread rows.
    """
    if limit == 1 and done is None:
        probed = probed_plan(tx, claim_filter)
        if probed is not None:
            return probed
    rows = tx.all(claim_next_prepared(claim_filter), claim_next_params(tx.now, limit, claim_filter))
    plan = ClaimPlan(
        first_per_arm(rows, limit), tx.now, read_limit=None if done is None else limit, done=done
    )
    for arm, window_end, missing in plan.short_windows(limit):
        plan.extend(arm, due_rows_beyond_window(tx, arm, window_end, missing, claim_filter), missing)
    return plan


def first_per_arm(rows: Sequence[StoredRow], limit: int) -> list[StoredRow]:
    """The window's rows with only the first ``limit`` of each due arm (in the seed's order):
    the window returns every claimable row among its entries."""
    due: dict[str, list[StoredRow]] = {arm: [] for arm in DUE_STREAMS}
    kept: list[StoredRow] = []
    for row in rows:
        due.get(row.arm, kept).append(row)
    for streamed in due.values():
        kept.extend(sorted(streamed, key=sort_key)[:limit])
    return kept


def probed_plan(tx: Tx, claim_filter: ClaimFilter) -> ClaimPlan | None:
    """The plan of one claim decided by the due index heads alone, or ``None`` (read it all).

    With no expired lease the claim could act on (nothing to sweep or reclaim), the seed's
    choice is the earliest eligible due row; the earlier of the two due heads precedes every
    other due row, so when it is claimable it is that choice (a plain queue: the common case).
    """
    rows = tx.all(head_probe_prepared(claim_filter), head_probe_params(tx.now, claim_filter))
    return head_plan(rows, tx.now)


def head_plan(rows: Sequence[StoredRow], now: int) -> ClaimPlan | None:
    """:func:`probed_plan` of the head probe's rows (``claim_query.head_probe_prepared``)."""
    if any(row.arm == ARM_EXPIRED for row in rows):
        return None
    if not rows:
        return ClaimPlan((), now)
    head = min(rows, key=sort_key)
    return ClaimPlan([head], now) if claimable(head, now) else None


def window_plan(rows: Sequence[StoredRow], now: int, heads: int) -> ClaimPlan | None:
    """The plan of one claim among workers from the first ``heads`` due entries of each waiting
    status (``claim_query.head_window_prepared``), or ``None`` (an expired lease to act on: read
    it all).

    Its candidates are the claimable rows in the seed's order up to the first row that is not
    claimable (which the full statement may pass over for a row this probe did not read), and
    it runs :attr:`~ClaimPlan.dry` (read everything again) where an arm that returned ``heads``
    rows runs out, or all of its rows do when it stopped at an unclaimable one: past those rows
    the order is unknown. So every candidate it yields is the one the full statement would
    yield next.
    """
    if any(row.arm == ARM_EXPIRED for row in rows):
        return None
    ordered = sorted(rows, key=sort_key)
    cut = next((index for index, row in enumerate(ordered) if not claimable(row, now)), len(ordered))
    return ClaimPlan(ordered[:cut], now, read_limit=heads, done=set(), truncated=cut < len(ordered))


def due_rows_beyond_window(
    tx: Tx, arm: str, after: WalkKey, limit: int, claim_filter: ClaimFilter
) -> list[StoredRow]:
    """The first ``limit`` claimable rows of a due arm after the key ``after`` (its window's last
    entry), read in rounds that each cost a bounded read (see ``claim_query``).

    A round counts the eligible jobs' occurrences up to its budget; within it, the rest is read
    through them. Otherwise it walks the next page of the status's entries, keeps the claimable
    ones, and the next round (both bounds ``GROWTH`` times larger) continues after the page.
    """
    shape = claim_filter.shape
    found: list[StoredRow] = []
    budget, page = claim_query.JOB_PROBE_BUDGET, claim_query.WALK_PAGE
    while True:
        params = beyond_window_params(tx.now, after, claim_filter)
        counting = eligible_job_rows_statement(tx.backend, shape)
        counted = tx.first(counting, {**params, "budget": budget + 1})[0]
        if counted <= budget:
            return found + _through_eligible_jobs(tx, arm, after, limit - len(found), claim_filter, budget)
        hits, end = _walk_page(tx, arm, after, page, limit - len(found), claim_filter)
        found.extend(hits)
        if len(found) >= limit or end is None:
            return found
        after = end
        budget, page = max(budget, 1) * GROWTH, max(page, 1) * GROWTH


def _walk_page(
    tx: Tx, arm: str, after: WalkKey, entries: int, wanted: int, claim_filter: ClaimFilter
) -> tuple[list[StoredRow], WalkKey | None]:
    """The first ``wanted`` claimable rows among the next ``entries`` due entries after ``after``
    and the key of the last of those entries (``None``: the status has no more)."""
    ties = after[1] < PAST_TIES
    params = {**beyond_window_params(tx.now, after, claim_filter), **page_params(max(entries, 1), wanted)}
    rows = tx.all(walk_statement(arm, claim_filter.shape, ties), params)
    hits = sorted((row for row in rows if row.arm == arm), key=sort_key)
    end = next((walk_key(row) for row in rows if row.arm != arm), None)
    if end is not None or not ties or len(hits) >= wanted:
        return hits, end
    # The entries tied at the key's available_at ran out: the page goes on after all of them.
    later, end = _walk_page(tx, arm, (after[0], PAST_TIES, ""), entries, wanted - len(hits), claim_filter)
    return hits + later, end


def _through_eligible_jobs(
    tx: Tx, arm: str, after: WalkKey, wanted: int, claim_filter: ClaimFilter, budget: int
) -> list[StoredRow]:
    """The first ``wanted`` claimable rows after ``after`` among the eligible jobs' occurrences
    (at most ``budget``, all of them), one more at a time than are still wanted: the due ones
    ranked, then the first ones' columns read, and the claimable ones kept."""
    found: list[StoredRow] = []
    size = wanted + 1
    while True:
        params = beyond_window_params(tx.now, after, claim_filter)
        params.update(budget=budget + 1, wanted=size)
        members = eligible_jobs_statement(tx.backend, arm, claim_filter.shape)
        ids = [row.occurrence_id for row in tx.all(members, params)]
        rows = sorted(tx.all(rows_statement(arm), {"p_ids": ids}), key=sort_key) if ids else []
        found.extend(row for row in rows if claimable(row, tx.now))
        if len(found) >= wanted or len(ids) < size:
            return found[:wanted]
        after, size = walk_key(rows[-1]), size * 2
