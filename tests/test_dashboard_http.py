"""The dashboard over HTTP, served by uvicorn, on SQLite and PostgreSQL: pages, escaping, security
(CSRF, token, hosts, headers, read-only, no action by GET) and every action through the store.

The browser tests (``test_dashboard_browser.py``) check what a user sees; these check the HTTP
contract, including what a browser would not send (no CSRF token, a foreign Host header).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dashboard_support import (
    AUTHORITY,
    HOSTILE_JOB_ID,
    Client,
    Site,
    serve,
    site,
)
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from scheduler import Tasks
from scheduler.dashboard import create_app
from scheduler.dashboard.actions import ACTIONS

__all__ = ["site"]

VIEWS = ("/", "/runs", "/jobs", "/dead-letters", "/adjudication", "/paused", "/workers")


@pytest.fixture
def client(site: Site) -> Client:
    return Client(site.base)


def _enqueue(site: Site, key: str, job_id: str = "emails.send_welcome", payload: Any = None) -> str:
    return site.store.enqueue_occurrence(
        job_id=job_id, scheduled_for=site.store.clock(), trigger_key=key, payload=payload or {"k": key}
    ).id


def _dead_letter(site: Site, key: str, code: str = "SMTP_REFUSED") -> Any:
    occurrence_id = _enqueue(site, key, "billing.charge")
    claimed = site.store.claim_occurrence(occurrence_id=occurrence_id, owner_id="w", lease_ms=60_000)
    assert claimed is not None
    return site.store.settle(
        occurrence_id=occurrence_id,
        owner_id="w",
        fence=claimed.fence,
        outcome="failed",
        error={"code": code, "message": "no"},
        retryable=False,
    )


# --------------------------------------------------------------------------- pages


def test_every_view_answers_with_its_data_and_security_headers(site: Site, client: Client) -> None:
    for path in VIEWS:
        answer = client.get(path)
        assert answer.status == 200, (path, answer.text[:300])
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe" not in csp
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"
        assert answer.headers["cache-control"] == "no-store"
        assert "<script>" not in answer.text  # every script of a page is a static file
    seeded = site.seeded
    assert seeded.queued[0] in client.get("/runs?status=queued").text
    assert seeded.dead_letter in client.get("/dead-letters").text
    assert seeded.outcome_unknown in client.get("/adjudication").text
    paused = client.get("/paused").text
    assert seeded.paused in paused and seeded.pause_requested in paused
    workers = client.get("/workers").text
    assert 'data-owner="worker-a"' in workers and 'data-owner="worker-c"' in workers
    jobs = client.get("/jobs").text
    assert "reports.daily" in jobs and "07:00:00.000" in jobs  # the cron job's next tick, 08:00 Berlin
    run = client.get(f"/run?id={seeded.paused}").text
    assert 'id="control-state">paused<' in run and "occurrence_paused" in run and "&#34;page&#34;: 7" in run


def test_fragments_and_chart_data(site: Site, client: Client) -> None:
    fragment = client.get("/?fragment=1")
    assert fragment.status == 200 and "<html" not in fragment.text and 'id="figures"' in fragment.text
    chart = client.get("/api/throughput")
    data = __import__("json").loads(chart.text)
    assert chart.headers["content-type"].startswith("application/json")
    assert sum(data["series"]["enqueued"]) >= len(site.seeded.queued)
    assert sum(data["series"]["dead-lettered"]) >= 3
    assert len(data["labels"]) == len(data["series"]["succeeded"])


def test_static_files_are_served(client: Client) -> None:
    for name in ("htmx.min.js", "chart.umd.min.js", "dashboard.js", "dashboard.css", "htmx.LICENSE.txt"):
        answer = client.get(f"/static/{name}")
        assert answer.status == 200 and answer.text, name
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_stored_values_are_escaped_and_invisible_characters_shown(site: Site, client: Client) -> None:
    page = client.get(f"/run?id={site.seeded.hostile}").text
    assert "<script>window.__pwned" not in page and "<img src=x" not in page
    assert "&lt;script&gt;window.__pwned = 1; alert(" in page
    assert "&lt;img src=x onerror=" in page
    assert "\u202e" not in page and "\u200b" not in page
    assert 'title="U+202E RIGHT-TO-LEFT OVERRIDE">&lt;U+202E&gt;</span>' in page
    assert "&lt;U+200B&gt;" in page
    jobs = client.get("/jobs").text
    assert HOSTILE_JOB_ID not in jobs and "evil.&lt;script&gt;alert(1)&lt;/script&gt;&#34;" in jobs


def test_bad_filters_and_unknown_runs_are_reported(client: Client) -> None:
    bad = client.get("/runs?status=exploded")
    assert bad.status == 400 and "SCHEDULER_INVALID_ARGUMENT" in bad.text
    assert client.get("/runs?since=yesterday").status == 400
    assert client.get("/runs?job=%00").status == 400
    missing = client.get("/run?id=occ_missing")
    assert missing.status == 404 and "SCHEDULER_NOT_FOUND" in missing.text
    assert client.get("/runs?cursor=not-a-cursor").status == 200  # a foreign cursor starts over


# --------------------------------------------------------------------------- CSRF, GET, read-only


def test_every_action_refuses_a_post_without_a_valid_csrf_token(site: Site, client: Client) -> None:
    dead = site.seeded.dead_letter
    fields = {"occurrence_id": dead, "fence": "1", "code": "SMTP_REFUSED", "return_to": "/"}
    before = site.dump()
    other = Client(site.base)
    other_token = other.csrf()
    client.csrf()  # this client has a session of its own
    for name in ACTIONS:
        for token in (None, "", "forged", other_token):
            sent = fields if token is None else {**fields, "csrf_token": token}
            answer = client.post(f"/actions/{name}", sent)
            assert answer.status == 403, (name, token, answer.status)
            assert "CSRF" in answer.text
    fresh = Client(site.base)  # no session cookie at all
    assert fresh.post("/actions/requeue", {**fields, "csrf_token": other_token}).status == 403
    assert site.dump() == before


def test_no_state_change_by_get(site: Site, client: Client) -> None:
    before = site.dump()
    for name in ACTIONS:
        assert client.get(f"/actions/{name}?occurrence_id={site.seeded.dead_letter}").status == 405
    assert client.request("PUT", "/actions/requeue").status == 405
    assert site.dump() == before


def test_read_only_hides_and_refuses_actions(site: Site) -> None:
    with serve(create_app(site.store, read_only=True)) as base:
        reader = Client(base)
        for path in (*VIEWS, f"/run?id={site.seeded.queued[1]}", f"/run?id={site.seeded.dead_letter}"):
            page = reader.get(path).text
            assert 'action="/actions/' not in page, path
            assert 'id="read-only"' in page
        before = site.dump()
        token = reader.csrf()
        answer = reader.post(
            "/actions/cancel", {"occurrence_id": site.seeded.queued[1], "csrf_token": token, "return_to": "/"}
        )
        assert answer.status == 403 and "read-only" in answer.text
        assert site.dump() == before


# --------------------------------------------------------------------------- token and hosts


def test_token_is_required_on_every_request(site: Site) -> None:
    with serve(create_app(site.store, token="s3cret-t0ken")) as base:
        stranger = Client(base)
        for path in (*VIEWS, "/static/htmx.min.js", "/api/throughput", "/?token=wrong"):
            answer = stranger.get(path)
            assert answer.status == 401, path
            assert answer.headers["www-authenticate"].startswith("Bearer")
        assert stranger.post("/actions/cancel", {"occurrence_id": "x"}).status == 401
        assert stranger.get("/", headers={"Authorization": "Bearer wrong"}).status == 401
        assert stranger.get("/", headers={"Authorization": "Bearer s3cret-t0ken"}).status == 200
        visitor = Client(base)
        redirect = visitor.get("/runs?status=queued&token=s3cret-t0ken")
        assert redirect.status == 303 and redirect.headers["location"] == "/runs?status=queued"
        cookie = redirect.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        assert visitor.get("/runs?status=queued").status == 200  # the session cookie now suffices
        elsewhere = Client(base).get("//evil.example/x?token=s3cret-t0ken")
        assert elsewhere.status == 303 and elsewhere.headers["location"] == "/evil.example/x"
        assert site.seeded.queued[0] in visitor.get("/runs?status=queued").text


def test_host_header_must_be_allowed(site: Site) -> None:
    with serve(create_app(site.store, allowed_hosts=("127.0.0.1", "localhost"))) as base:
        visitor = Client(base)
        assert visitor.get("/", headers={"Host": "evil.example"}).status == 403
        assert visitor.get("/", headers={"Host": "localhost:8787"}).status == 200
        assert visitor.get("/").status == 200


# --------------------------------------------------------------------------- actions


def test_requeue_and_its_refusal(site: Site, client: Client) -> None:
    dead = _dead_letter(site, "requeue-me")
    wrong = {"occurrence_id": dead.id, "fence": str(dead.fence + 5), "code": "SMTP_REFUSED"}
    before = site.dump()
    page = client.act("requeue", wrong, return_to=f"/run?id={dead.id}")
    assert 'class="flash error"' in page.text and "SCHEDULER_REQUEUE_EVIDENCE_CONFLICT" in page.text
    assert "Nothing was changed." in page.text
    assert site.dump() == before
    done = client.act("requeue", {"occurrence_id": dead.id, "fence": str(dead.fence), "code": "SMTP_REFUSED"})
    assert 'class="flash ok"' in done.text and "back in the queue" in done.text
    assert site.store.get_occurrence(dead.id).status == "retry_wait"
    assert 'class="flash' not in client.get("/").text  # a message is shown once


def test_cancel_pause_resume(site: Site, client: Client) -> None:
    queued = _enqueue(site, "cancel-me")
    page = client.act("cancel", {"occurrence_id": queued, "reason": "operator <b>said</b> so"})
    assert "Cancelled" in page.text
    cancelled = site.store.get_occurrence(queued)
    assert cancelled.status == "dead_letter"
    assert cancelled.last_error == {"code": "CANCELLED", "message": "operator <b>said</b> so"}
    again = client.act("cancel", {"occurrence_id": site.seeded.succeeded})
    assert "SCHEDULER_CONFLICT" in again.text
    running = site.store.claim_occurrence(
        occurrence_id=_enqueue(site, "pause-me", "reports.daily"), owner_id="w-pause", lease_ms=600_000
    )
    assert running is not None
    client.act("pause", {"occurrence_id": running.id, "fence": str(running.fence)})
    control = site.store.get_occurrence_control(running.id)
    assert control is not None and control.state == "pause_requested"
    resumed = client.act("resume", {"occurrence_id": running.id, "revision": str(control.revision)})
    assert "SCHEDULER_OCCURRENCE_CONTROL_CONFLICT" in resumed.text  # not paused yet: refused
    paused = site.store.ack_occurrence_pause(
        occurrence_id=running.id,
        owner_id="w-pause",
        fence=running.fence,
        request_id=control.pause_request_id,
        expected_revision=control.revision,
        safe_point="adapter_checkpoint",
    )
    page = client.act("resume", {"occurrence_id": running.id, "revision": str(paused.control.revision)})
    assert "Resumed" in page.text
    assert site.store.get_occurrence_control(running.id).state == "resumed"


def test_enable_disable_a_job(site: Site, client: Client) -> None:
    job = site.store.create_job(id="toggle.me", kind="misc", authority=AUTHORITY)
    client.act("job-enabled", {"job_id": job.id, "revision": str(job.revision), "enabled": "0"})
    assert site.store.get_job(job.id).enabled is False
    stale = client.act("job-enabled", {"job_id": job.id, "revision": str(job.revision), "enabled": "1"})
    assert "SCHEDULER_REVISION_CONFLICT" in stale.text
    assert site.store.get_job(job.id).enabled is False
    client.act("job-enabled", {"job_id": job.id, "revision": str(job.revision + 1), "enabled": "1"})
    assert site.store.get_job(job.id).enabled is True


def test_adjudicate(site: Site, client: Client) -> None:
    unknown = _dead_letter(site, "adjudicate-me", code="CHARGE_OUTCOME_UNKNOWN")
    case = site.store.get_adjudication_case(unknown.id)
    assert case is not None and case.eligible
    form = {
        "occurrence_id": unknown.id,
        "decision": "confirmed_not_applied",
        "evidence_digest": case.evidence_digest,
        "attempt": str(case.attempt),
        "fence": str(case.fence),
        "reason": "gateway shows no charge",
        "operator": "ops@example.com",
    }
    stale = client.act("adjudicate", {**form, "fence": str(case.fence + 1)})
    assert "SCHEDULER_ADJUDICATION" in stale.text
    assert site.store.get_occurrence_adjudication(unknown.id) is None
    page = client.act("adjudicate", form, return_to=f"/run?id={unknown.id}")
    assert "Adjudicated" in page.text
    recorded = site.store.get_occurrence_adjudication(unknown.id)
    assert recorded is not None and recorded.decision == "confirmed_not_applied"


def test_bulk_requeue_and_cancel_of_a_filtered_set(site: Site, client: Client) -> None:
    dead = [_dead_letter(site, f"bulk-{n}", code="BULK_FAILURE").id for n in range(4)]
    page = client.act("bulk-requeue", {"code": "BULK_FAILURE", "queue": "billing"})
    assert "Requeued 4 run(s)." in page.text
    assert {site.store.get_occurrence(i).status for i in dead} == {"retry_wait"}
    refused = client.act("bulk-cancel", {"queue": "billing"})
    assert "bulk cancel needs a status filter" in refused.text
    site.store.create_job(id="bulk.job", kind="bulk-queue", authority=AUTHORITY)
    queued = [_enqueue(site, f"bulk-q-{n}", "bulk.job") for n in range(3)]
    page = client.act("bulk-cancel", {"status": "queued", "job": "bulk.job", "reason": "drain"})
    assert "Cancelled 3 run(s)." in page.text
    assert all(site.store.get_occurrence(i).last_error["code"] == "CANCELLED" for i in queued)


# --------------------------------------------------------------------------- mounted in a host


@pytest.fixture
def host_app(site: Site) -> Iterator[str]:
    async def home(_request: Any) -> PlainTextResponse:
        return PlainTextResponse("the host application")

    host = Starlette(routes=[Route("/", home), Mount("/scheduler", app=create_app(site.store))])
    with serve(host) as base:
        yield base


def test_mounted_under_a_prefix(site: Site, host_app: str) -> None:
    visitor = Client(host_app)
    assert visitor.get("/").text == "the host application"
    page = visitor.get("/scheduler/runs?status=dead_letter")
    assert page.status == 200
    assert 'href="/scheduler/static/dashboard.css"' in page.text
    assert f'href="/scheduler/run?id={site.seeded.dead_letter}"' in page.text
    assert 'action="/scheduler/actions/requeue"' in page.text
    assert "Path=/scheduler;" in page.headers["set-cookie"]
    assert visitor.get("/scheduler/static/htmx.min.js").status == 200
    queued = _enqueue(site, "mounted-cancel")
    token = visitor.csrf("/scheduler/")
    answer = visitor.post(
        "/scheduler/actions/cancel", {"occurrence_id": queued, "csrf_token": token, "return_to": "/runs"}
    )
    assert answer.status == 303 and answer.headers["location"] == "/scheduler/runs"
    assert site.store.get_occurrence(queued).status == "dead_letter"
    evil = visitor.post(
        "/scheduler/actions/cancel",
        {"occurrence_id": "x", "csrf_token": token, "return_to": "//evil.example/"},
    )
    assert evil.headers["location"] == "/scheduler/"


def test_a_tasks_object_is_served_through_its_store(site: Site) -> None:
    tasks = Tasks(site.store, principal={"type": "service", "id": "shop"})

    @tasks.task(name="shop.send_invoice", queue="invoices")
    def send_invoice(order: int) -> None: ...

    run = send_invoice.defer(order=7)
    assert tasks.store is site.store
    with serve(create_app(tasks)) as base:
        visitor = Client(base)
        page = visitor.get("/runs?queue=invoices")
        assert page.status == 200 and run.id in page.text and "shop.send_invoice" in page.text
        assert "shop.send_invoice" in visitor.get("/jobs?queue=invoices").text
        visitor.act("cancel", {"occurrence_id": run.id})
    assert tasks.get(run.id).status == "dead_letter"
