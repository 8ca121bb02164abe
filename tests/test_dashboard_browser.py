"""The dashboard in a real browser: Debian's headless chromium driven by Selenium (chromedriver),
against a dashboard served by uvicorn on 127.0.0.1, on SQLite and PostgreSQL.

One browser for the module. Each view loads without a console error (a Content-Security-Policy
violation would be one) and, on SQLite, is saved as ``docs/images/dashboard-<view>.png`` for the
docs. A user filters, opens a run, requeues a dead letter and sees it back in the queue, cancels a
queued run, sees a ``<script>`` payload as inert text, is refused a POST without its CSRF token,
sees the figures refresh without a reload, and needs the token when the dashboard has one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from backends import SQLITE
from dashboard_support import Site, serve, site
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from scheduler.dashboard import create_app

__all__ = ["site"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
T = TypeVar("T")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1280,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: WebDriver, condition: Callable[[WebDriver], T], timeout: float = 10) -> T:
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)


def retry_stale(action: Callable[[], T]) -> T:
    """``action`` again if the element it used was replaced by a refresh of the live part."""
    for _ in range(20):
        try:
            return action()
        except StaleElementReferenceException:
            time.sleep(0.05)
    return action()


def console_errors(driver: WebDriver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def open_page(driver: WebDriver, site: Site, path: str) -> None:
    driver.get(site.base + path)
    wait(driver, lambda d: d.execute_script("return document.readyState") == "complete")


def text(driver: WebDriver, css: str) -> str:
    return retry_stale(lambda: driver.find_element(By.CSS_SELECTOR, css).text)


def no_alert(driver: WebDriver) -> bool:
    try:
        driver.switch_to.alert  # noqa: B018 - reading it is the check
    except NoAlertPresentException:
        return True
    return False


VIEWS = [
    ("overview", "/", "Overview"),
    ("runs", "/runs", "Runs"),
    ("jobs", "/jobs", "Jobs and periodic tasks"),
    ("dead-letters", "/dead-letters", "Dead letters"),
    ("adjudication", "/adjudication", "Adjudication cases"),
    ("paused", "/paused", "Paused runs"),
    ("workers", "/workers", "Workers"),
]


def test_each_view_loads_without_errors(browser: WebDriver, site: Site) -> None:
    browser.get_log("browser")  # start with an empty console
    views = [*VIEWS, ("run", f"/run?id={site.seeded.paused}", "Run")]
    for name, path, heading in views:
        open_page(browser, site, path)
        assert text(browser, "h1").startswith(heading), name
        if name == "overview":  # Chart.js drew the throughput chart from /api/throughput
            wait(browser, lambda d: d.find_element(By.ID, "throughput").get_attribute("data-ready") == "1")
            assert "newest events" in text(browser, ".chart-note")
        assert console_errors(browser) == [], name
        if site.backend == SQLITE:
            IMAGES.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(IMAGES / f"dashboard-{name}.png"))


def test_filter_the_runs(browser: WebDriver, site: Site) -> None:
    open_page(browser, site, "/runs")
    Select(browser.find_element(By.NAME, "status")).select_by_value("dead_letter")
    browser.find_element(By.NAME, "queue").send_keys("billing")
    browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
    wait(browser, lambda d: "status=dead_letter" in d.current_url)
    statuses = retry_stale(
        lambda: [e.text for e in browser.find_elements(By.CSS_SELECTOR, "table.runs .status")]
    )
    assert statuses and set(statuses) == {"dead_letter"}
    assert site.seeded.hostile in browser.page_source


def test_open_a_run(browser: WebDriver, site: Site) -> None:
    open_page(browser, site, "/runs?status=retry_wait&queue=reports")
    link = browser.find_element(By.CSS_SELECTOR, f'tr[data-run="{site.seeded.retry_wait}"] a')
    retry_stale(link.click)
    wait(browser, lambda d: d.find_elements(By.ID, "run-status"))
    assert browser.find_element(By.ID, "run-id").text == site.seeded.retry_wait
    assert text(browser, "#run-status") == "retry_wait"
    assert '"day": 1' in text(browser, "#run-payload")
    assert "TIMEOUT" in text(browser, "#run-error")
    assert "occurrence_retry_scheduled" in text(browser, "#timeline")


def _click_action(browser: WebDriver, row_css: str, action: str) -> None:
    def click() -> None:
        browser.find_element(By.CSS_SELECTOR, f'{row_css} form[data-action="{action}"] button').click()

    retry_stale(click)
    wait(browser, lambda d: d.find_elements(By.ID, "flash"))


def test_requeue_a_dead_letter_and_see_it_queued(browser: WebDriver, site: Site) -> None:
    dead = site.seeded.dead_letter
    open_page(browser, site, "/dead-letters")
    _click_action(browser, f'tr[data-run="{dead}"]', "requeue")
    assert "back in the queue" in text(browser, "#flash")
    assert site.store.get_occurrence(dead).status == "retry_wait"
    open_page(browser, site, "/runs?status=retry_wait")
    assert browser.find_elements(By.CSS_SELECTOR, f'tr[data-run="{dead}"]')
    open_page(browser, site, f"/run?id={dead}")
    assert text(browser, "#run-status") == "retry_wait"
    assert "occurrence_requeued" in text(browser, "#timeline")


def test_cancel_a_queued_run(browser: WebDriver, site: Site) -> None:
    queued = site.seeded.queued[2]
    open_page(browser, site, f"/run?id={queued}")
    browser.find_element(By.CSS_SELECTOR, '#run-actions input[name="reason"]').send_keys("not needed")
    browser.find_element(By.CSS_SELECTOR, '#run-actions form[data-action="cancel"] button').click()
    wait(browser, lambda d: d.find_elements(By.ID, "flash"))
    assert "Cancelled" in text(browser, "#flash")
    assert text(browser, "#run-status") == "dead_letter"
    assert '"code": "CANCELLED"' in text(browser, "#run-error")
    assert '"message": "not needed"' in text(browser, "#run-error")
    assert site.store.get_occurrence(queued).last_error == {"code": "CANCELLED", "message": "not needed"}


def test_a_script_payload_is_inert_and_readable(browser: WebDriver, site: Site) -> None:
    open_page(browser, site, f"/run?id={site.seeded.hostile}")
    time.sleep(0.3)  # time for anything that would run
    assert no_alert(browser)
    assert browser.execute_script("return window.__pwned === undefined") is True
    scripts = browser.execute_script("return Array.from(document.scripts).map(s => s.getAttribute('src'))")
    assert all(src and src.startswith("/static/") for src in scripts), scripts
    payload = text(browser, "#run-payload")
    assert '<script>window.__pwned = 1; alert(\\"pwned\\")</script>' in payload
    assert "<U+202E>evil<U+202C>" in payload and "zero<U+200B>width" in payload
    error = text(browser, "#run-error")
    assert "<img src=x onerror=" in error
    assert not browser.find_elements(By.CSS_SELECTOR, "#live img")


def test_a_post_without_its_csrf_token_is_refused(browser: WebDriver, site: Site) -> None:
    queued = site.seeded.queued[3]
    before = site.dump()
    open_page(browser, site, f"/run?id={queued}")
    browser.execute_script(
        "const form = document.querySelector('#run-actions form[data-action=\"cancel\"]');"
        "form.querySelector('input[name=\"csrf_token\"]').remove(); form.submit();"
    )
    wait(browser, lambda d: "403" in d.find_element(By.TAG_NAME, "body").text)
    assert "missing or invalid CSRF token" in browser.find_element(By.TAG_NAME, "body").text
    assert site.store.get_occurrence(queued).status == "queued"
    assert site.dump() == before


def test_figures_refresh_without_reloading(browser: WebDriver, site: Site) -> None:
    open_page(browser, site, "/")
    browser.execute_script("window.__marker = 42")

    def queued_count(driver: WebDriver) -> int:
        return int(text(driver, '[data-figure="queued"] .value').replace(",", ""))

    before = queued_count(browser)
    site.store.enqueue_occurrence(
        job_id="emails.send_welcome", scheduled_for=site.store.clock(), trigger_key="live-refresh"
    )
    wait(browser, lambda d: queued_count(d) == before + 1, timeout=8)
    assert browser.execute_script("return window.__marker") == 42


def test_the_token_is_required(browser: WebDriver, site: Site) -> None:
    with serve(create_app(site.store, token="t0ken-for-browser")) as base:
        browser.get(base + "/runs")
        assert "401 Unauthorized" in browser.find_element(By.TAG_NAME, "body").text
        browser.get(base + "/runs?status=queued&token=t0ken-for-browser")
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "h1"))
        assert "token" not in browser.current_url
        assert browser.current_url.endswith("/runs?status=queued")
        assert site.seeded.queued[0] in browser.page_source
        browser.get(base + "/workers")  # the session cookie carries on
        assert browser.find_element(By.CSS_SELECTOR, "h1").text == "Workers"
        browser.delete_all_cookies()
