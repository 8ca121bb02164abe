"""Observability on a SQLite file (API §9 Observability): state-change records inside a caller's
``BEGIN IMMEDIATE`` transaction, a worker in a process without OpenTelemetry, and
docs/observability.md's Prometheus set-up run as written in a process of its own, scraped over
HTTP on 127.0.0.1. (The store's records and metrics on both backends:
``tests/conformance/test_store_observability.py``, ``test_observability_duration.py``.)
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from otel_support import states
from sqlalchemy import create_engine

from scheduler import SchedulerStore
from tests.worker_support import add_job, new_store

REPO = Path(__file__).resolve().parents[3]


def test_inside_a_callers_transaction_records_are_emitted_per_operation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="scheduler.events")
    path = tmp_path / "k.sqlite"
    new_store(path).close()
    engine = create_engine(f"sqlite:///{path}")
    with engine.connect() as connection:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
        bound = SchedulerStore.on_connection(connection)
        add_job(bound, "a")
        assert states(caplog) == ["job created"]  # the caller still owns the commit
        connection.rollback()
    engine.dispose()


def test_without_opentelemetry_the_worker_runs_and_metrics_are_off(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
        from pathlib import Path
        from scheduler.store.plumbing import telemetry
        from scheduler.worker import Worker
        from tests.worker_support import add_job, enqueue, new_store
        store = new_store(Path({str(tmp_path / "k.sqlite")!r}))
        add_job(store, "job")
        enqueue(store, "job", "one")
        assert Worker(store, {{"job": lambda o, c: 1}}, periodic=False).run_until_idle() == 1
        assert telemetry.METRICS.instruments() is None
        assert telemetry.observe_queue_depth(store.queue_depth) is False
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


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
