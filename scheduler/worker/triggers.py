"""Periodic triggers: the original's trigger documents, their ticks and trigger keys (API §9).

A job's ``trigger`` document decides when it fires:

* ``{"type": "cron", "expression": E, "timezone": TZ}`` — each match of the 5-field cron
  expression ``E`` in the IANA zone ``TZ`` (optional, default UTC); key ``"cron:<ISO ms Z>"``.
* ``{"type": "interval", "everyMs": N, "anchor": A}`` — ``A + k·N`` for ``k ≥ 0``; key
  ``"interval:<k>"``. ``anchor`` is optional (default: the job's ``created_at``). Once
  ``update_job`` has changed a job's trigger, its interval keys name the schedule:
  ``"interval:<N>@<A>:<k>"`` (``interval:<k>`` alone does not say which schedule's ``k`` it is).
* ``{"type": "once", "at": T}`` — once at ``T`` (epoch ms); key ``"once:<ISO ms Z>"``.

Any other ``type`` (``event``, …) is not periodic: the application enqueues those occurrences.

Cron matching uses `cronsim <https://pypi.org/project/cronsim/>`_ on local wall-clock times; the
daylight-saving rule is ours (API §9): a local time skipped by a DST change fires once, at the first
instant after the gap; a repeated local time fires once, at its first occurrence. Everything here is
pure computation on epoch milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Final, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from scheduler.contract.constants import MAX_SAFE_INTEGER

CRON: Final = "cron"
INTERVAL: Final = "interval"
ONCE: Final = "once"
PERIODIC_TYPES: Final = (CRON, INTERVAL, ONCE)

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_LAST_INSTANT_MS: Final = int((datetime(9999, 12, 31, 23, 59, tzinfo=UTC) - _EPOCH).total_seconds()) * 1000
# How far local wall-clock time can lag behind its instant's order around a DST change: a reverse
# search for the latest tick starts this much later in local time and skips instants after ``now``.
_DST_MARGIN: Final = timedelta(hours=3)


class TriggerError(ValueError):
    """A periodic trigger document that cannot be evaluated (the job is skipped and logged)."""


@dataclass(frozen=True, slots=True)
class Tick:
    """One firing: ``at`` (epoch ms) is the occurrence's ``scheduled_for``; ``key`` its trigger key."""

    at: int
    key: str


class Trigger(Protocol):
    """A parsed periodic trigger."""

    @property
    def prefix(self) -> str:
        """What every key of this trigger type starts with (``"cron:"``, ``"interval:"``, ``"once:"``)."""
        ...

    @property
    def recurring(self) -> bool:
        """Whether it ticks more than once (cron, interval)."""
        ...

    def latest(self, *, now: int, floor: int, limit: int) -> list[Tick]:
        """The latest ``limit`` ticks ``t`` with ``floor <= t <= now``, oldest first."""
        ...

    def next_after(self, now: int) -> int | None:
        """The first tick strictly after ``now`` (epoch ms), or ``None`` if there is none."""
        ...


def iso_ms(epoch_ms: int) -> str:
    """``2026-01-01T00:15:00.000Z``: ISO-8601 UTC with milliseconds (JavaScript's ``toISOString``)."""
    seconds, millis = divmod(epoch_ms, 1000)
    moment = _EPOCH + timedelta(seconds=seconds)
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T"
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}.{millis:03d}Z"
    )


def _epoch_ms(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(milliseconds=1)


# --------------------------------------------------------------------------- cron


class CronTrigger:
    """``{"type": "cron", "expression", "timezone"}``: 5-field cron in an IANA time zone."""

    prefix: Final = "cron:"
    recurring: Final = True

    def __init__(self, expression: str, zone: tzinfo) -> None:
        self.expression = expression
        self.zone = zone
        self._utc = zone is UTC

    def _local(self, epoch_ms: int) -> datetime:
        """The naive local wall-clock time of an instant, truncated to the second."""
        moment = _EPOCH + timedelta(seconds=epoch_ms // 1000)
        return moment.replace(tzinfo=None) if self._utc else moment.astimezone(self.zone).replace(tzinfo=None)

    def instant(self, local: datetime) -> int:
        """The instant a naive local time fires at (API §9's daylight-saving rule).

        An existing time maps to its first occurrence (``fold=0``); a skipped time maps to the first
        instant after the gap: the earliest instant whose local time is not before it.
        """
        if self._utc:
            return _epoch_ms(local.replace(tzinfo=UTC))
        first = local.replace(tzinfo=self.zone, fold=0)
        first_ms = _epoch_ms(first.astimezone(UTC))
        if self._local(first_ms) == local:
            return first_ms
        other_ms = _epoch_ms(local.replace(tzinfo=self.zone, fold=1).astimezone(UTC))
        low, high = min(first_ms, other_ms), max(first_ms, other_ms)
        while low < high:  # local time is non-decreasing in the instant, except at a fold
            middle = (low + high) // 2
            if self._local_ms(middle) >= local:
                high = middle
            else:
                low = middle + 1
        return low

    def _local_ms(self, epoch_ms: int) -> datetime:
        moment = _EPOCH + timedelta(milliseconds=epoch_ms)
        return moment.astimezone(self.zone).replace(tzinfo=None)

    def _matches(self, start: datetime, reverse: bool) -> Iterator[datetime]:
        try:
            yield from CronSim(self.expression, start, reverse=reverse)
        except (OverflowError, ValueError):  # ran off datetime's range
            return

    def latest(self, *, now: int, floor: int, limit: int) -> list[Tick]:
        if now < floor or now > _LAST_INSTANT_MS:
            return []
        margin = timedelta(0) if self._utc else _DST_MARGIN
        start = self._local(now) + margin + timedelta(seconds=1)  # CronSim's reverse start is exclusive
        found: list[int] = []
        for local in self._matches(start, reverse=True):
            at = self.instant(local)
            if at > now:
                continue
            if at < floor or len(found) >= limit:
                break
            if not found or at != found[-1]:  # skipped times share the instant after the gap
                found.append(at)
        return [Tick(at, f"{self.prefix}{iso_ms(at)}") for at in reversed(found)]

    def next_after(self, now: int) -> int | None:
        if now >= _LAST_INSTANT_MS:
            return None
        margin = timedelta(0) if self._utc else _DST_MARGIN
        start = self._local(now) - margin - timedelta(seconds=1)
        for local in self._matches(start, reverse=False):
            at = self.instant(local)
            if at > now:
                return at
        return None


# --------------------------------------------------------------------------- interval and once


class IntervalTrigger:
    """``{"type": "interval", "everyMs": N, "anchor": A}``: ticks at ``A + k·N``, key ``interval:<k>``,
    or ``interval:<N>@<A>:<k>`` when ``named`` (the trigger was changed: a key must say which
    schedule's ``k`` it is, so that the same key always means the same instant)."""

    prefix: Final = "interval:"
    recurring: Final = True

    def __init__(self, every_ms: int, anchor: int, *, named: bool = False) -> None:
        self.every_ms = every_ms
        self.anchor = anchor
        self.key_prefix = f"{self.prefix}{every_ms}@{anchor}:" if named else self.prefix

    def latest(self, *, now: int, floor: int, limit: int) -> list[Tick]:
        if now < self.anchor or now < floor:
            return []
        last = (now - self.anchor) // self.every_ms
        first = max(0, -(-(floor - self.anchor) // self.every_ms), last - limit + 1)
        return [
            Tick(self.anchor + k * self.every_ms, f"{self.key_prefix}{k}") for k in range(first, last + 1)
        ]

    def next_after(self, now: int) -> int | None:
        k = 0 if now < self.anchor else (now - self.anchor) // self.every_ms + 1
        at = self.anchor + k * self.every_ms
        return at if at <= MAX_SAFE_INTEGER else None


class OnceTrigger:
    """``{"type": "once", "at": T}``: one tick at ``T``, key ``once:<ISO ms Z>``."""

    prefix: Final = "once:"
    recurring: Final = False

    def __init__(self, at: int) -> None:
        self.at = at

    def latest(self, *, now: int, floor: int, limit: int) -> list[Tick]:
        if floor <= self.at <= now and limit > 0:
            return [Tick(self.at, f"{self.prefix}{iso_ms(self.at)}")]
        return []

    def next_after(self, now: int) -> int | None:
        return self.at if self.at > now else None


# --------------------------------------------------------------------------- parsing


def _epoch_field(document: dict[str, Any], name: str, *, positive: bool = False) -> int:
    value = document.get(name)
    minimum = 1 if positive else 0
    if type(value) is not int or not minimum <= value <= MAX_SAFE_INTEGER:
        raise TriggerError(f"{name} must be an integer >= {minimum} (milliseconds)")
    return value


def _zone(name: Any) -> tzinfo:
    if name is None or name == "UTC":
        return UTC
    if not isinstance(name, str):
        raise TriggerError("timezone must be an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise TriggerError(f"unknown timezone {name!r}") from error


def _cron(document: dict[str, Any]) -> CronTrigger:
    expression = document.get("expression")
    if not isinstance(expression, str) or len(expression.split()) != 5:
        raise TriggerError("expression must be a cron expression of 5 fields")
    normalized = " ".join(expression.split())
    try:
        CronSim(normalized, datetime(2000, 1, 1))
    except CronSimError as error:
        raise TriggerError(f"invalid cron expression {expression!r}: {error}") from error
    return CronTrigger(normalized, _zone(document.get("timezone")))


def parse_trigger(document: Any, *, created_at: int, changed_at: int | None = None) -> Trigger | None:
    """The periodic trigger a job's ``trigger`` document describes, or ``None`` if it is not periodic.

    ``created_at`` (the job's, epoch ms) is the default interval ``anchor``; ``changed_at`` is when
    ``update_job`` last set the trigger (``None``: never), which gives an interval its named keys.
    A malformed cron, interval or once document raises :class:`TriggerError`.
    """
    if not isinstance(document, dict) or document.get("type") not in PERIODIC_TYPES:
        return None
    kind = document["type"]
    if kind == CRON:
        return _cron(document)
    if kind == INTERVAL:
        every = _epoch_field(document, "everyMs", positive=True)
        anchor = created_at if document.get("anchor") is None else _epoch_field(document, "anchor")
        return IntervalTrigger(every, anchor, named=changed_at is not None)
    return OnceTrigger(_epoch_field(document, "at"))


def due_floor(
    trigger: Trigger, *, created_at: int, last_fired_at: int | None, changed_at: int | None = None
) -> int:
    """The earliest tick that may still fire: after the last fired tick of the trigger's type, and
    for recurring triggers not before the job was created nor before its trigger was last changed
    (a once trigger whose time has passed still fires, unless a once tick at or after it has)."""
    floor = max(created_at, changed_at or 0) if trigger.recurring else 0
    return floor if last_fired_at is None else max(floor, last_fired_at + 1)


def due_ticks(
    trigger: Trigger,
    *,
    now: int,
    limit: int,
    created_at: int,
    last_fired_at: int | None,
    changed_at: int | None = None,
) -> list[Tick]:
    """The latest ``limit`` ticks due at ``now`` that have not fired, oldest first (see
    :func:`due_floor`)."""
    floor = due_floor(trigger, created_at=created_at, last_fired_at=last_fired_at, changed_at=changed_at)
    return trigger.latest(now=now, floor=floor, limit=limit)


__all__ = [
    "PERIODIC_TYPES",
    "CronTrigger",
    "IntervalTrigger",
    "OnceTrigger",
    "Tick",
    "Trigger",
    "TriggerError",
    "due_floor",
    "due_ticks",
    "iso_ms",
    "parse_trigger",
]
