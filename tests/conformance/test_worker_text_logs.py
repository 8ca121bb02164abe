"""The default text logs of ``scheduler worker`` name what failed: every state-change record and
every handler failure (traceback included) names the occurrence, the job, the kind and the
attempt, as ``--json`` does. The real stderr of a real worker process, on a SQLite file and a
PostgreSQL schema.

API §9 Observability.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from store_places import StorePlace
from worker_process_support import start_worker, status_of, stop

from tests.worker_support import HANDLERS, add_job, enqueue, wait_for

RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) (?P<logger>[\w.]+): (?P<message>.*)$"
)
STATES = ("claimed", "retried", "settled", "dead-lettered")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "handlers_module.py").write_text(HANDLERS)
    return tmp_path


def names_everything(message: str, occurrence: str, job: str, attempt: int) -> bool:
    return all(
        token in message.split()
        for token in (f"occurrence={occurrence}", f"job={job}", f"kind={job}", f"attempt={attempt}")
    )


def test_text_records_name_the_occurrence_job_kind_and_attempt(home: Path, place: StorePlace) -> None:
    with place.open() as store:
        add_job(store, "flaky", max_attempts=3)
        add_job(store, "fatal", max_attempts=3)
        flaky = enqueue(store, "flaky", "one")
        fatal = enqueue(store, "fatal", "one")
    process = start_worker(home, place, "--retry-base-ms", "200", "--no-periodic")
    try:
        wait_for(lambda: status_of(place, flaky)[0] == "succeeded", 30, "the retried occurrence")
        wait_for(lambda: status_of(place, fatal)[0] == "dead_letter", 30, "the dead letter")
    finally:
        code, stderr = stop(process)
    assert code == 0, stderr
    lines = stderr.splitlines()
    records = [(index, match) for index, line in enumerate(lines) if (match := RECORD.match(line))]
    assert records and all(not line.startswith("{") for line in lines)  # the text formatter

    failures = {
        m["message"].split()[2]: index for index, m in records if m["message"].startswith("handler failed:")
    }
    assert sorted(failures) == ["ConnectionError", "PermanentError"]
    assert names_everything(lines[failures["ConnectionError"]], flaky, "flaky", 1), lines[
        failures["ConnectionError"]
    ]
    assert names_everything(lines[failures["PermanentError"]], fatal, "fatal", 1), lines[
        failures["PermanentError"]
    ]
    following = lines[failures["ConnectionError"] + 1 :]
    traceback = following[: next(i for i, line in enumerate(following) if RECORD.match(line))]
    assert traceback[0] == "Traceback (most recent call last):"
    assert "ConnectionError: upstream reset" in traceback

    seen: dict[tuple[str, str], int] = {}
    for _, match in records:
        if match["logger"] != "scheduler.events":
            continue
        words = match["message"].split()
        if words[0] not in STATES:
            continue
        occurrence = flaky if f"occurrence={flaky}" in words else fatal
        job = "flaky" if occurrence == flaky else "fatal"
        attempt = [word for word in words if word.startswith("attempt=")]
        assert attempt, match["message"]
        assert names_everything(match["message"], occurrence, job, int(attempt[0][8:])), match["message"]
        seen[(job, words[0])] = seen.get((job, words[0]), 0) + 1
    assert seen == {
        ("flaky", "claimed"): 2,
        ("flaky", "retried"): 1,
        ("flaky", "settled"): 1,
        ("fatal", "claimed"): 1,
        ("fatal", "dead-lettered"): 1,
    }
