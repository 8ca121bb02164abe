"""Periodic trigger documents, their ticks and keys (API §9), and the retry/error policy: pure computation."""

from __future__ import annotations

from datetime import datetime

import pytest

from scheduler import SchedulerKernelError
from scheduler.worker import PermanentError, RetryPolicy, error_document, iso_ms, parse_trigger
from scheduler.worker.policy import MAX_ERROR_CODE_CHARS, result_not_json
from scheduler.worker.triggers import TriggerError, due_floor


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


BERLIN = "Europe/Berlin"


def cron(expression: str, timezone: str | None = None) -> object:
    document = {"type": "cron", "expression": expression}
    if timezone is not None:
        document["timezone"] = timezone
    return parse_trigger(document, created_at=0)


def keys(trigger: object, now: str, limit: int = 20, floor: int = 0) -> list[str]:
    return [tick.key for tick in trigger.latest(now=ms(now), floor=floor, limit=limit)]  # type: ignore[attr-defined]


def test_keys_are_iso_utc_with_milliseconds() -> None:
    assert iso_ms(1767226500000) == "2026-01-01T00:15:00.000Z"
    assert iso_ms(1767226500123) == "2026-01-01T00:15:00.123Z"
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    trigger = cron("*/15 * * * *")
    tick = trigger.latest(now=ms("2026-01-01T00:20:00Z"), floor=0, limit=1)[0]  # type: ignore[attr-defined]
    assert (tick.at, tick.key) == (1767226500000, "cron:2026-01-01T00:15:00.000Z")


def test_cron_in_a_time_zone_ticks_at_local_times() -> None:
    # 09:00 on weekdays in Shanghai (UTC+8) is 01:00Z; 2026-01-03/04 are a weekend.
    trigger = cron("0 9 * * 1-5", "Asia/Shanghai")
    assert keys(trigger, "2026-01-06T02:00:00Z", limit=3) == [
        "cron:2026-01-02T01:00:00.000Z",
        "cron:2026-01-05T01:00:00.000Z",
        "cron:2026-01-06T01:00:00.000Z",
    ]
    assert trigger.next_after(ms("2026-01-06T01:00:00Z")) == ms("2026-01-07T01:00:00Z")  # type: ignore[attr-defined]


def test_berlin_skipped_local_time_fires_once_at_the_first_instant_after_the_gap() -> None:
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00Z); 02:30 does not exist that day.
    daily = cron("30 2 * * *", BERLIN)
    assert keys(daily, "2026-03-30T12:00:00Z", limit=3) == [
        "cron:2026-03-28T01:30:00.000Z",
        "cron:2026-03-29T01:00:00.000Z",
        "cron:2026-03-30T00:30:00.000Z",
    ]
    # Every quarter hour: 02:00, 02:15, 02:30, 02:45 are skipped and fire ONCE, at 03:00 CEST.
    quarter = cron("*/15 * * * *", BERLIN)
    assert keys(quarter, "2026-03-29T01:20:00Z", limit=4) == [
        "cron:2026-03-29T00:30:00.000Z",
        "cron:2026-03-29T00:45:00.000Z",
        "cron:2026-03-29T01:00:00.000Z",
        "cron:2026-03-29T01:15:00.000Z",
    ]
    assert quarter.next_after(ms("2026-03-29T00:45:00Z")) == ms("2026-03-29T01:00:00Z")  # type: ignore[attr-defined]


def test_berlin_repeated_local_time_fires_once_at_its_first_occurrence() -> None:
    # 2026-10-25: 03:00 CEST goes back to 02:00 CET (01:00Z); 02:00-02:59 happen twice.
    daily = cron("30 2 * * *", BERLIN)
    assert keys(daily, "2026-10-26T12:00:00Z", limit=3) == [
        "cron:2026-10-24T00:30:00.000Z",
        "cron:2026-10-25T00:30:00.000Z",  # 02:30 CEST, never 02:30 CET (01:30Z)
        "cron:2026-10-26T01:30:00.000Z",
    ]
    quarter = cron("*/15 * * * *", BERLIN)
    # During the second 02:xx hour nothing new is due: the latest tick is still 02:45 CEST.
    assert keys(quarter, "2026-10-25T01:50:00Z", limit=2) == [
        "cron:2026-10-25T00:30:00.000Z",
        "cron:2026-10-25T00:45:00.000Z",
    ]
    assert quarter.next_after(ms("2026-10-25T00:45:00Z")) == ms("2026-10-25T02:00:00Z")  # type: ignore[attr-defined]


def test_interval_ticks_from_the_anchor_with_counted_keys() -> None:
    trigger = parse_trigger({"type": "interval", "everyMs": 1000, "anchor": 10_000}, created_at=0)
    assert trigger is not None
    ticks = trigger.latest(now=13_500, floor=0, limit=10)
    assert [(tick.at, tick.key) for tick in ticks] == [
        (10_000, "interval:0"),
        (11_000, "interval:1"),
        (12_000, "interval:2"),
        (13_000, "interval:3"),
    ]
    assert [tick.key for tick in trigger.latest(now=13_500, floor=11_001, limit=10)] == [
        "interval:2",
        "interval:3",
    ]
    assert trigger.latest(now=9_999, floor=0, limit=10) == []
    assert trigger.next_after(13_000) == 14_000
    assert trigger.next_after(0) == 10_000
    # No anchor: the job's created_at.
    default = parse_trigger({"type": "interval", "everyMs": 500}, created_at=2_000)
    assert default is not None and default.latest(now=2_600, floor=0, limit=5)[-1].key == "interval:1"


def test_once_fires_at_its_time_and_never_again() -> None:
    trigger = parse_trigger({"type": "once", "at": 1767830400000}, created_at=1767830500000)
    assert trigger is not None
    assert trigger.latest(now=1767830399999, floor=0, limit=1) == []
    [tick] = trigger.latest(now=1767830400000, floor=0, limit=1)
    assert tick.key == "once:2026-01-08T00:00:00.000Z"
    floor = due_floor(trigger, created_at=1767830500000, last_fired_at=None)
    assert floor == 0  # a once trigger whose time passed before the job existed still fires
    assert (
        trigger.latest(
            now=1767830500000, floor=due_floor(trigger, created_at=0, last_fired_at=tick.at), limit=1
        )
        == []
    )


def test_recurring_triggers_never_fire_before_creation_or_at_a_fired_tick() -> None:
    trigger = cron("0 * * * *")
    assert due_floor(trigger, created_at=5_000, last_fired_at=None) == 5_000  # type: ignore[arg-type]
    assert due_floor(trigger, created_at=5_000, last_fired_at=3_600_000) == 3_600_001  # type: ignore[arg-type]
    created = ms("2026-01-01T10:30:00Z")
    assert keys(trigger, "2026-01-01T10:59:00Z", floor=created) == []
    assert keys(trigger, "2026-01-01T11:00:00Z", floor=created) == ["cron:2026-01-01T11:00:00.000Z"]


@pytest.mark.parametrize(
    "document",
    [
        {"type": "cron", "expression": "* * * *"},
        {"type": "cron", "expression": "61 * * * *"},
        {"type": "cron", "expression": "0 0 * * * *"},
        {"type": "cron", "expression": 5},
        {"type": "cron", "expression": "* * * * *", "timezone": "Mars/Olympus"},
        {"type": "interval", "everyMs": 0},
        {"type": "interval", "everyMs": 1.5},
        {"type": "interval", "everyMs": 1000, "anchor": -1},
        {"type": "once", "at": "2026-01-01"},
        {"type": "once"},
    ],
)
def test_malformed_periodic_triggers_are_refused(document: dict[str, object]) -> None:
    with pytest.raises(TriggerError):
        parse_trigger(document, created_at=0)


@pytest.mark.parametrize(
    "document", [None, {"type": "event", "event": "nightly"}, {"kind": "cron"}, [], "cron"]
)
def test_other_documents_are_not_periodic(document: object) -> None:
    assert parse_trigger(document, created_at=0) is None


# ------------------------------------------------------------------------------ retry and errors


def test_retry_policy_backs_off_exponentially_and_caps() -> None:
    policy = RetryPolicy(base_ms=1_000, factor=2.0, max_ms=5_000, jitter=0.0)
    assert [policy.delay_ms(attempt) for attempt in range(1, 6)] == [1_000, 2_000, 4_000, 5_000, 5_000]
    jittered = RetryPolicy(base_ms=1_000, factor=3.0, max_ms=300_000, jitter=0.1)
    assert jittered.delay_ms(2, uniform=lambda: 0.0) == 2_700
    assert jittered.delay_ms(2, uniform=lambda: 0.999999) == 3_300
    assert RetryPolicy(base_ms=1_000, max_ms=1_000, jitter=0.5).delay_ms(1, uniform=lambda: 0.9999) == 1_000
    assert RetryPolicy(factor=10.0).delay_ms(32, uniform=lambda: 0.5) == 300_000


@pytest.mark.parametrize(
    "options",
    [{"base_ms": -1}, {"base_ms": 1.5}, {"max_ms": 10}, {"factor": 0.5}, {"factor": True}, {"jitter": 2.0}],
)
def test_retry_policy_rejects_invalid_values(options: dict[str, object]) -> None:
    with pytest.raises(SchedulerKernelError) as raised:
        RetryPolicy(**options)  # type: ignore[arg-type]
    assert raised.value.code == "SCHEDULER_INVALID_ARGUMENT"


class UpstreamDown(Exception):
    class Timeout(Exception):
        pass


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_error_documents_use_the_code_or_qualified_name_and_cut_the_message() -> None:
    assert error_document(ValueError("boom")) == {"code": "ValueError", "message": "boom"}
    assert error_document(UpstreamDown.Timeout("slow"))["code"] == "UpstreamDown.Timeout"
    assert error_document(PermanentError("bad input", code="INPUT_INVALID")) == {
        "code": "INPUT_INVALID",
        "message": "bad input",
    }
    assert error_document(PermanentError("no code"))["code"] == "PermanentError"
    long = error_document(RuntimeError("x" * 1_000_000))
    assert len(long["message"]) == 2_000
    code = error_document(PermanentError("", code="C" * 10_000 + "\n"))["code"]
    assert code == "C" * MAX_ERROR_CODE_CHARS
    assert error_document(PermanentError("", code="a\x00b"))["code"] == "a?b"
    assert error_document(PermanentError("", code="  "))["code"] == "PermanentError"
    assert error_document(Unprintable())["message"] == "<unprintable Unprintable>"
    assert result_not_json("x" * 5_000)["code"] == "RESULT_NOT_JSON"
    assert len(result_not_json("x" * 5_000)["message"]) == 2_000
