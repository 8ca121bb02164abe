"""How long handlers ran: in the worker's log records and the ``scheduler.handler.duration``
histogram (OpenTelemetry SDK, in-memory reader), on both backends; and docs/observability.md's
Prometheus set-up run as written in a process of its own, scraped over HTTP on 127.0.0.1.
API §9 Observability.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from otel_support import meter_reader as meter_reader
from otel_support import metric_points
from store_places import StorePlace

from scheduler.worker import PermanentError, RetryPolicy, Worker
from tests.worker_support import add_job, enqueue

REPO = Path(__file__).resolve().parents[2]
SLEEP_S = 0.03


def handler(occurrence: Any, ctx: Any) -> str:
    time.sleep(SLEEP_S)
    key = occurrence.payload["key"]
    if key == "flaky" and occurrence.attempt == 1:
        raise ValueError("first attempt fails")
    if key == "fatal":
        raise PermanentError("never", code="FATAL")
    return key


def test_handler_duration_in_log_records_and_the_histogram(
    place: StorePlace, meter_reader: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = place.open()
    add_job(store, "mail", kind="email", max_attempts=2)
    ids = {key: enqueue(store, "mail", key, payload={"key": key}) for key in ("ok", "flaky", "fatal")}
    with caplog.at_level(logging.INFO, logger="scheduler"):
        worker = Worker(store, {"email": handler}, periodic=False, retry=RetryPolicy(base_ms=0, jitter=0))
        assert worker.run_until_idle() == 4
    store.close()

    settled = [r for r in caplog.records if r.name == "scheduler.events" and r.state != "claimed"]
    by_state = {
        (r.occurrence, r.state): r for r in settled if r.state in ("settled", "retried", "dead-lettered")
    }
    assert set(by_state) == {
        (ids["ok"], "settled"),
        (ids["flaky"], "retried"),
        (ids["flaky"], "settled"),
        (ids["fatal"], "dead-lettered"),
    }
    for record in by_state.values():
        assert record.duration_ms >= SLEEP_S * 1000, record.getMessage()
        assert re.search(r"\(handler \d+\.\d ms\)$", record.getMessage()), record.getMessage()
    claimed = [r for r in caplog.records if getattr(r, "state", None) == "claimed"]
    assert len(claimed) == 4 and all(record.duration_ms is None for record in claimed)
    failures = [
        r
        for r in caplog.records
        if r.name == "scheduler.worker" and r.getMessage().startswith("handler failed")
    ]
    assert len(failures) == 2 and all(record.duration_ms >= SLEEP_S * 1000 for record in failures)

    points = metric_points(meter_reader)["scheduler.handler.duration"]
    by_outcome = {point.attributes["outcome"]: point for point in points}
    assert {point.attributes["kind"] for point in points} == {"email"}
    assert (by_outcome["succeeded"].count, by_outcome["failed"].count) == (2, 2)
    assert by_outcome["succeeded"].min >= SLEEP_S * 1000 and by_outcome["failed"].min >= SLEEP_S * 1000
    assert by_outcome["succeeded"].sum < 60_000


def test_a_settle_without_a_worker_carries_no_duration(
    place: StorePlace, caplog: pytest.LogCaptureFixture
) -> None:
    store = place.open()
    add_job(store, "mail", kind="email")
    occurrence_id = enqueue(store, "mail", "direct")
    claimed = store.claim_occurrence(occurrence_id=occurrence_id, owner_id="me", lease_ms=60_000)
    with caplog.at_level(logging.INFO, logger="scheduler.events"):
        store.settle(occurrence_id=occurrence_id, owner_id="me", fence=claimed.fence, outcome="succeeded")
    store.close()
    [record] = [r for r in caplog.records if getattr(r, "state", None) == "settled"]
    named = f"occurrence={occurrence_id} job=mail kind=email attempt=1 fence=1"
    assert record.duration_ms is None and record.getMessage() == f"settled {named}"


def prometheus_block() -> str:
    text = (REPO / "docs" / "observability.md").read_text(encoding="utf-8")
    blocks = [
        block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "PrometheusMetricReader" in block
    ]
    assert len(blocks) == 1, "one documented Prometheus set-up"
    return blocks[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_documented_prometheus_setup_serves_the_schedulers_metrics(tmp_path: Path) -> None:
    port = free_port()
    documented = prometheus_block()
    assert "port=9464" in documented and "/var/lib/app/kernel-v1.sqlite" in documented
    script = documented.replace("port=9464", f"port={port}").replace(
        "/var/lib/app/kernel-v1.sqlite", str(tmp_path / "kernel.sqlite")
    )
    script += textwrap.dedent(
        """
        import sys, time
        from scheduler.worker import Worker

        store.create_job(id="mail", kind="email", authority={"principal": {"type": "service", "id": "app"}},
                         max_attempts=1)
        for key in ("a", "b", "bad"):
            store.enqueue_occurrence(job_id="mail", scheduled_for=0, trigger_key=key, payload={"key": key})

        def send(occurrence, ctx):
            time.sleep(0.01)
            if occurrence.payload["key"] == "bad":
                raise ValueError("no")
            return "sent"

        Worker(store, {"email": send}, periodic=False).run_until_idle()
        print("ready", flush=True)
        sys.stdin.read()  # serve until the test closes stdin
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.strip() == "ready", process.stderr.read() if process.stderr else line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert response.status == 200
            body = response.read().decode()
    finally:
        if process.stdin is not None:
            process.stdin.close()
        process.wait(timeout=30)
    samples = {
        line.split("{")[0]: line
        for line in body.splitlines()
        if line.startswith("scheduler_") and "{" in line
    }
    assert re.search(r'scheduler_claims_total\{[^}]*kind="email"[^}]*\} 3\.0', body), body
    assert re.search(r'scheduler_settlements_total\{[^}]*outcome="succeeded"[^}]*\} 2\.0', body), body
    assert re.search(r'scheduler_settlements_total\{[^}]*outcome="dead_lettered"[^}]*\} 1\.0', body), body
    duration = r'scheduler_handler_duration_milliseconds_count\{[^}]*kind="email"[^}]*outcome="succeeded"'
    assert re.search(duration + r"[^}]*\} 2\.0", body), body
    assert re.search(
        r'scheduler_queue_depth\{[^}]*kind="email"[^}]*status="dead_letter"[^}]*\} 1\.0', body
    ), body
    assert "scheduler_claim_latency_milliseconds_bucket" in samples
    assert process.returncode == 0
