"""Server time of every dashboard page on a large database (SQLite file or PostgreSQL schema).

    python -m benchmarks.dashboard_pages build   --db /tmp/bench/kernel.sqlite [--occurrences 1000000]
    python -m benchmarks.dashboard_pages measure --db /tmp/bench/kernel.sqlite [--requests 20]
    python -m benchmarks.dashboard_pages build   --db postgresql+psycopg://postgres@127.0.0.1/db --schema b1m
    python -m benchmarks.dashboard_pages measure --db postgresql+psycopg://postgres@127.0.0.1/db --schema b1m

``build`` makes the database the dashboard's speed target names (API §11): 20 tasks in 4 queues,
``--occurrences`` runs created over 30 days, ~10 events per run, 10 % dead letters (a few of them
outcome-unknown), the newest runs queued, a few hundred running under 8 workers (some leases
expired), some waiting to retry. Jobs are created with ``create_job``; the bulk rows are what the
store writes for those lifecycles (ids from ``derive_occurrence_identity``, canonical JSON, the
same event types and data), inserted in batches with the occurrence and event indexes dropped
and then re-created from their own catalog text (the schema is verified by ``open_store``
afterwards). Then real store calls add the live states: paused runs, a pause request,
adjudication decisions, a requeue and a cancellation.

``measure`` opens the database with ``open_store``, builds the ASGI app with ``create_app`` and
sends each page ``--requests`` times in-process (no network; after 2 warm-up requests), timing
each request from the call into the app to the last byte of the answer. It prints p50, p95 and max
per page, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import make_url

from scheduler import open_store
from scheduler.contract.authority import normalize_authority_envelope
from scheduler.contract.canonical import canonical_json
from scheduler.contract.identity import derive_occurrence_identity
from scheduler.store.facade import SchedulerStore

QUEUES = {
    "emails": ["send_welcome", "send_receipt", "send_digest", "send_reset", "send_invite"],
    "reports": ["daily_sales", "weekly_stock", "export_csv", "monthly_close", "audit_log"],
    "billing": ["charge_card", "refund", "invoice_pdf", "dunning", "sync_ledger"],
    "webhooks": ["order_paid", "order_shipped", "user_created", "stock_low", "retry_hook"],
}
WORKSPACES = {"emails": "ws-eu", "reports": "ws-eu", "billing": "ws-us", "webhooks": "ws-us"}
ERRORS = [
    ("SMTP_REFUSED", "550 mailbox unavailable"),
    ("HTTP_502", "bad gateway"),
    ("TIMEOUT", "no answer in 30 s"),
]
SPAN_MS = 30 * 86_400_000
WORKERS = 8
BATCH = 20_000


def job_ids() -> list[tuple[str, str]]:
    return [(f"shop.{queue}.{task}", queue) for queue, tasks in QUEUES.items() for task in tasks]


def open_target(db: str, schema: str | None) -> SchedulerStore:
    return open_store(db, schema=schema) if "://" in db else open_store(db)


# --------------------------------------------------------------------------- rows


def _payload(queue: str, n: int) -> Any:
    if queue == "emails":
        return {"template": "welcome", "userId": n}
    if queue == "reports":
        return {"day": n % 365, "format": "csv"}
    if queue == "billing":
        return {"amountCents": 100 + n % 9_900, "invoice": n}
    return {"event": "order.paid", "url": f"https://hooks.example.com/{n % 97}"}


class Plan:
    """Which status run ``n`` of ``total`` ends in (the newest are queued, then running, …)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.queued = max(1, total // 200)  # 0.5 %: the newest runs
        self.running = max(1, total // 5_000)
        self.retry = max(1, total // 1_000)

    def status(self, n: int) -> str:
        from_end = self.total - 1 - n
        if from_end < self.queued:
            return "queued"
        if from_end < self.queued + self.running:
            return "running"
        if n % 10 == 3:
            return "dead_letter"
        if from_end < self.queued + self.running + 20 * self.retry and n % 20 == 7:
            return "retry_wait"
        return "succeeded"


def _claimed(attempt: int, previous: str) -> str:
    return f'{{"attempt":{attempt},"previousOwner":null,"previousStatus":"{previous}"}}'


def lifecycle(
    n: int, status: str, created: int, occurrence_id: str, job_id: str, key: str, now: int
) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """The occurrence row (changing columns) and its events ``(job, occurrence, type, at, owner,
    fence, data)`` for run ``n`` ending in ``status``."""
    owner = f"worker-{n % WORKERS}"
    events: list[tuple[Any, ...]] = [
        (
            job_id,
            occurrence_id,
            "occurrence_enqueued",
            created,
            None,
            None,
            f'{{"jobRevision":1,"scheduledFor":{created},"triggerKey":"{key}"}}',
        ),
    ]
    row: dict[str, Any] = {
        "status": status,
        "attempt": 0,
        "fence": 0,
        "available_at": created,
        "lease_owner": None,
        "lease_expires_at": None,
        "last_error_json": None,
        "result_json": None,
        "updated_at": created,
        "settled_at": None,
    }
    if status == "queued":
        return row, events
    at = created + 150
    attempts = 3 if status == "dead_letter" else 1
    for attempt in range(1, attempts + 1):
        previous = "queued" if attempt == 1 else "retry_wait"
        events.append(
            (job_id, occurrence_id, "occurrence_claimed", at, owner, attempt, _claimed(attempt, previous))
        )
        renewals = 7 if status == "succeeded" else 2
        for _ in range(renewals):
            at += 5_000
            events.append(
                (
                    job_id,
                    occurrence_id,
                    "occurrence_renewed",
                    at,
                    owner,
                    attempt,
                    f'{{"leaseExpiresAt":{at + 30_000}}}',
                )
            )
        if status == "running":
            expires = now - 5_000 if n % 10 == 0 else now + 30_000
            row.update(attempt=1, fence=1, lease_owner=owner, lease_expires_at=expires, updated_at=at)
            return row, events
        at += 3_000
        code, message = ERRORS[n % len(ERRORS)]
        if status == "succeeded":
            events.append(
                (
                    job_id,
                    occurrence_id,
                    "occurrence_succeeded",
                    at,
                    owner,
                    attempt,
                    '{"attempt":1,"maxAttempts":3}',
                )
            )
            row.update(
                attempt=1,
                fence=1,
                result_json=canonical_json({"durationMs": 3_000 + n % 500, "ok": True}),
                updated_at=at,
                settled_at=at,
            )
            return row, events
        if status == "retry_wait" or attempt < attempts:
            retry_at = at + 2_000 * attempt
            events.append(
                (
                    job_id,
                    occurrence_id,
                    "occurrence_retry_scheduled",
                    at,
                    owner,
                    attempt,
                    f'{{"attempt":{attempt},"maxAttempts":3,"retryAt":{retry_at}}}',
                )
            )
            row.update(
                attempt=attempt,
                fence=attempt,
                available_at=retry_at,
                updated_at=at,
                last_error_json=canonical_json({"code": code, "message": message}),
            )
            if status == "retry_wait":
                return row, events
            at = retry_at + 100
            continue
        if n % 200 == 3:
            code, message = "CHARGE_OUTCOME_UNKNOWN", "the gateway timed out after the charge was sent"
        events.append(
            (
                job_id,
                occurrence_id,
                "occurrence_dead_lettered",
                at,
                owner,
                attempt,
                '{"attempt":3,"maxAttempts":3}',
            )
        )
        row.update(
            attempt=attempt,
            fence=attempt,
            updated_at=at,
            settled_at=at,
            last_error_json=canonical_json({"code": code, "message": message}),
        )
    return row, events


def generate(
    total: int, now: int, authority_json: dict[str, str]
) -> Iterator[tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]]:
    """Batches of (occurrence rows, event rows) in creation order."""
    jobs = job_ids()
    plan = Plan(total)
    start = now - SPAN_MS
    step = SPAN_MS / total
    for first in range(0, total, BATCH):
        occurrences: list[tuple[Any, ...]] = []
        events: list[tuple[Any, ...]] = []
        for n in range(first, min(total, first + BATCH)):
            job_id, queue = jobs[(n * 7) % len(jobs)]
            created = int(start + n * step)
            key = f"defer:{n}"
            identity = derive_occurrence_identity(
                job_id=job_id, job_revision=1, scheduled_for=created, trigger_key=key
            )
            status = plan.status(n)
            row, lifecycle_events = lifecycle(n, status, created, identity.occurrence_id, job_id, key, now)
            occurrences.append(
                (
                    identity.occurrence_id,
                    job_id,
                    1,
                    identity.idempotency_key,
                    key,
                    created,
                    row["available_at"],
                    status,
                    row["attempt"],
                    3,
                    row["fence"],
                    row["lease_owner"],
                    row["lease_expires_at"],
                    authority_json[queue],
                    canonical_json(_payload(queue, n)),
                    row["last_error_json"],
                    row["result_json"],
                    created,
                    row["updated_at"],
                    row["settled_at"],
                )
            )
            events.extend(lifecycle_events)
        events.sort(key=lambda event: event[3])
        yield occurrences, events


OCCURRENCE_COLUMNS = (
    "occurrence_id, job_id, job_revision, idempotency_key, trigger_key, scheduled_for, available_at, status, "
    "attempt, max_attempts, fence, lease_owner, lease_expires_at, authority_json, payload_json, "
    "last_error_json, result_json, created_at, updated_at, settled_at"
)
EVENT_COLUMNS = "event_id, job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data_json"
BULK_TABLES = ("occurrences", "events")


# --------------------------------------------------------------------------- build


def create_jobs(store: SchedulerStore) -> dict[str, str]:
    """The 20 jobs (two with periodic triggers), and each queue's stored authority JSON."""
    authority: dict[str, str] = {}
    for job_id, queue in job_ids():
        envelope = {"principal": {"type": "service", "id": "shop"}, "workspaceId": WORKSPACES[queue]}
        trigger: dict[str, Any] = {"type": "event"}
        if job_id.endswith("daily_sales"):
            trigger = {"type": "cron", "expression": "0 6 * * *", "timezone": "Europe/Berlin"}
        elif job_id.endswith("sync_ledger"):
            trigger = {"type": "interval", "everyMs": 900_000}
        store.create_job(id=job_id, kind=queue, authority=envelope, trigger=trigger)
        authority[queue] = canonical_json(normalize_authority_envelope(envelope))
    return authority


def _bulk_sqlite(path: str, batches: Iterator[Any], report: Any) -> None:
    import sqlite3

    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA synchronous=OFF")
    connection.execute("PRAGMA cache_size=-400000")
    indexes = connection.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL AND tbl_name IN (?, ?)",
        BULK_TABLES,
    ).fetchall()
    connection.execute("BEGIN IMMEDIATE")
    for name, _ in indexes:
        connection.execute(f'DROP INDEX "{name}"')
    next_event = (connection.execute("SELECT coalesce(max(event_id), 0) FROM events").fetchone()[0]) + 1
    for occurrences, events in batches:
        connection.executemany(
            f"INSERT INTO occurrences ({OCCURRENCE_COLUMNS}) VALUES ({', '.join('?' * 20)})", occurrences
        )
        numbered = [(next_event + i, *event) for i, event in enumerate(events)]
        next_event += len(events)
        connection.executemany(
            f"INSERT INTO events ({EVENT_COLUMNS}) VALUES ({', '.join('?' * 8)})", numbered
        )
        report(len(occurrences), len(events))
    print("re-creating indexes …", file=sys.stderr)
    for _, sql in indexes:
        connection.execute(sql)
    connection.execute("COMMIT")
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()


def _bulk_postgresql(url: str, schema: str, batches: Iterator[Any], report: Any) -> None:
    import psycopg

    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain) as connection:
        connection.execute(f'SET search_path TO "{schema}"')
        indexes = connection.execute(
            "SELECT i.indexname, i.indexdef FROM pg_indexes i"
            " WHERE i.schemaname = %s AND i.tablename = ANY(%s)"
            " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname"
            " AND c.connamespace = %s::regnamespace)",
            (schema, list(BULK_TABLES), schema),
        ).fetchall()
        for name, _ in indexes:
            connection.execute(f'DROP INDEX "{schema}"."{name}"')
        newest = connection.execute("SELECT coalesce(max(event_id), 0) FROM events").fetchone()
        next_event = int(newest[0] if newest else 0) + 1
        for occurrences, events in batches:
            with connection.cursor().copy(f"COPY occurrences ({OCCURRENCE_COLUMNS}) FROM STDIN") as copy:
                for row in occurrences:
                    copy.write_row(row)
            with connection.cursor().copy(f"COPY events ({EVENT_COLUMNS}) FROM STDIN") as copy:
                for i, event in enumerate(events):
                    copy.write_row((next_event + i, *event))
            next_event += len(events)
            connection.commit()
            report(len(occurrences), len(events))
        print("re-creating indexes …", file=sys.stderr)
        for _, definition in indexes:
            connection.execute(definition)
        connection.execute("SELECT setval(pg_get_serial_sequence('events', 'event_id'), %s)", (next_event,))
        connection.commit()
        connection.autocommit = True
        connection.execute("VACUUM ANALYZE occurrences")
        connection.execute("VACUUM ANALYZE events")


def live_states(store: SchedulerStore) -> None:
    """Paused runs, a pause request, adjudication decisions, a requeue and a cancellation, made
    with the store's own methods on the bulk rows."""
    capability = {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint"]}
    for n in range(4):
        job_id, _ = job_ids()[n]
        run = store.enqueue_occurrence(job_id=job_id, scheduled_for=store.clock(), trigger_key=f"live:{n}")
        claimed = store.claim_occurrence(occurrence_id=run.id, owner_id="worker-live", lease_ms=600_000)
        assert claimed is not None
        control = store.request_occurrence_pause(
            occurrence_id=run.id,
            expected_fence=claimed.fence,
            request_id=f"live-pause-{n}",
            capability=capability,
        )
        if n < 3:
            store.ack_occurrence_pause(
                occurrence_id=run.id,
                owner_id="worker-live",
                fence=claimed.fence,
                request_id=f"live-pause-{n}",
                expected_revision=control.revision,
                safe_point="adapter_checkpoint",
                checkpoint={"page": n},
            )
    cases = store.list_adjudication_cases(limit=3)
    for case in cases[:2]:
        store.adjudicate_occurrence(
            occurrence_id=case.occurrence_id,
            decision="confirmed_applied",
            expected_evidence_digest=case.evidence_digest,
            expected_attempt=case.attempt,
            expected_fence=case.fence,
            reason_digest="sha256:" + "1" * 64,
            operator_digest="sha256:" + "2" * 64,
        )
    dead = store.list_dead_letters(limit=5)
    plain = [o for o in dead if not o.last_error["code"].endswith("_OUTCOME_UNKNOWN")]
    store.requeue_dead_letter(
        occurrence_id=plain[0].id,
        expected_fence=plain[0].fence,
        expected_error_code=plain[0].last_error["code"],
        request_id="live-requeue",
    )
    queued = store.claim_next(owner_id="worker-live", lease_ms=600_000)
    assert queued is not None
    store.cancel_occurrence(occurrence_id=queued.id, reason="benchmark")


def build(db: str, schema: str | None, total: int) -> None:
    began = time.monotonic()
    with open_target(db, schema) as store:
        authority = create_jobs(store)
        now = store.clock()
    done = [0, 0]

    def report(occurrences: int, events: int) -> None:
        done[0] += occurrences
        done[1] += events
        if done[0] % 100_000 < BATCH:
            print(
                f"{done[0]:>9,} runs, {done[1]:>11,} events, {time.monotonic() - began:6.0f} s",
                file=sys.stderr,
            )

    batches = generate(total, now, authority)
    if "://" in db and make_url(db).get_backend_name() == "postgresql":
        _bulk_postgresql(db, schema or "scheduler", batches, report)
    else:
        _bulk_sqlite(db, batches, report)
    print("verifying the schema and adding live states …", file=sys.stderr)
    with open_target(db, schema) as store:
        live_states(store)
    print(
        f"built {done[0]:,} runs and {done[1]:,} events in {time.monotonic() - began:.0f} s", file=sys.stderr
    )


# --------------------------------------------------------------------------- measure


async def get(app: Any, path: str) -> tuple[int, bytes]:
    """``GET path`` sent to the ASGI ``app`` in-process: the status and the body."""
    route, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": route,
        "raw_path": route.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8787")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8787),
    }
    status, chunks = 0, []
    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if requests:  # the request once; no disconnect while the answer is being sent
            return requests.pop()
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def pages(store: SchedulerStore, app: Any) -> list[tuple[str, str]]:
    """The pages measured: each view, its fragment, the filters each index serves and the ones
    read in a bounded window, a second page, a run."""
    dead = store.list_dead_letters(limit=1)[0].id
    day_ago = store.clock() - 86_400_000
    listing = asyncio.run(get(app, "/runs?status=succeeded"))[1].decode()
    found = re.search(r'<a href="([^"]+)" id="next-page">', listing)
    second = found.group(1).replace("&amp;", "&") if found else "/runs?status=succeeded"
    return [
        ("overview", "/"),
        ("overview, live fragment", "/?fragment=1"),
        ("throughput chart data", "/api/throughput"),
        ("runs (recent window)", "/runs"),
        ("runs: status=queued", "/runs?status=queued"),
        ("runs: status=succeeded, page 2", second),
        ("runs: queue=emails", "/runs?queue=emails"),
        ("runs: queue=billing, status=dead_letter", "/runs?queue=billing&status=dead_letter"),
        ("runs: task + created since a day", f"/runs?job=shop.billing.refund&since={day_ago}"),
        ("runs: error code (window)", "/runs?status=dead_letter&code=TIMEOUT"),
        ("runs: workspace (window)", "/runs?workspace=ws-us"),
        ("one run", f"/run?id={dead}"),
        ("jobs", "/jobs"),
        ("dead letters", "/dead-letters"),
        ("adjudication", "/adjudication"),
        ("paused", "/paused"),
        ("workers", "/workers"),
    ]


async def timed(app: Any, path: str, requests: int) -> list[float]:
    """Milliseconds of ``requests`` GETs of ``path``, after 2 warm-up GETs."""
    timings = []
    for round_number in range(2 + requests):
        began = time.perf_counter()
        status, _ = await get(app, path)
        elapsed = (time.perf_counter() - began) * 1000
        assert status == 200, (path, status)
        if round_number >= 2:
            timings.append(elapsed)
    return timings


def measure(db: str, schema: str | None, requests: int, as_json: Path | None) -> None:
    from scheduler.dashboard import create_app

    with open_target(db, schema) as store:
        app = create_app(store)
        results = []
        for name, path in pages(store, app):
            timings = sorted(asyncio.run(timed(app, path, requests)))
            p95 = timings[max(0, round(0.95 * len(timings)) - 1)]
            results.append(
                {
                    "page": name,
                    "path": path,
                    "p50": statistics.median(timings),
                    "p95": p95,
                    "max": timings[-1],
                }
            )
            print(
                f"{name:45} p50 {statistics.median(timings):7.1f}  p95 {p95:7.1f}  max {timings[-1]:7.1f} ms",
                file=sys.stderr,
            )
    print("| page | p50 ms | p95 ms | max ms |\n|---|---:|---:|---:|")
    for row in results:
        print(f"| {row['page']} | {row['p50']:.1f} | {row['p95']:.1f} | {row['max']:.1f} |")
    if as_json is not None:
        as_json.write_text(json.dumps(results, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("build", "measure"))
    parser.add_argument("--db", required=True, help="SQLite file path or postgresql+psycopg:// URL")
    parser.add_argument("--schema", default=None, help="PostgreSQL schema (default scheduler)")
    parser.add_argument("--occurrences", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    arguments = parser.parse_args()
    if arguments.command == "build":
        build(arguments.db, arguments.schema, arguments.occurrences)
    else:
        measure(arguments.db, arguments.schema, arguments.requests, arguments.json)


if __name__ == "__main__":
    main()
