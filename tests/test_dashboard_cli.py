"""``scheduler dashboard``: what it refuses before it listens, and a real server process it starts.

The served process runs on SQLite and PostgreSQL: it answers on 127.0.0.1, refuses another
``Host`` name when it has no token, and exits 0 on SIGTERM; on SQLite it also needs the token when
it has one and refuses actions with ``--read-only`` (options that do not touch the backend).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from backends import POSTGRESQL, SQLITE, PostgresServer, unique_name
from cli_support import invoke, isolated_environment
from dashboard_support import Client, free_port, seed
from wheel_support import InstalledWheel

from scheduler import open_store
from scheduler.cli.dashboard_cmd import is_loopback

__all__ = ["isolated_environment"]

REPO = Path(__file__).resolve().parents[1]


def test_loopback_addresses() -> None:
    assert all(
        is_loopback(host) for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST")
    )
    assert not any(
        is_loopback(host) for host in ("0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "example.com", "")
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "dashboard.example.com"])
def test_a_non_loopback_bind_without_a_token_refuses_to_start(tmp_path: Path, host: str) -> None:
    database = tmp_path / "kernel.sqlite"
    open_store(database).close()
    result = invoke("dashboard", "--db", str(database), "--host", host, "--port", str(free_port()))
    assert result.exit_code == 2, result.output
    assert "--token" in result.output and "CLI_USAGE" in result.output


def test_usage_errors_and_a_missing_database(tmp_path: Path) -> None:
    database = tmp_path / "kernel.sqlite"
    assert invoke("dashboard", "--db", str(database), "--token", " ").exit_code == 2
    assert invoke("dashboard", "--db", str(database), "--root-path", "scheduler").exit_code == 2
    missing = invoke("dashboard", "--db", str(database), "--port", str(free_port()))
    assert missing.exit_code == 1, missing.output
    assert not database.exists()  # the dashboard never creates a database


@pytest.fixture(params=[SQLITE, pytest.param(POSTGRESQL, marks=pytest.mark.postgresql)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """A seeded database; the ``--db`` (and ``--schema``) arguments naming it."""
    if request.param == SQLITE:
        path = tmp_path / "kernel.sqlite"
        with open_store(path) as store:
            seed(store, store.clock())
        yield ["--db", str(path)]
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    schema = unique_name("t_dash_cli")
    with open_store(server.engine, schema=schema) as store:
        seed(store, store.clock())
    yield ["--db", server.url.render_as_string(hide_password=False), "--schema", schema]
    server.drop_schema(schema)


@pytest.fixture
def serve_cli(tmp_path: Path) -> Iterator[object]:
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> str:
        port = free_port()
        environment = {**os.environ, "PYTHONPATH": str(REPO), "SCHEDULER_HOME": str(tmp_path)}
        environment.pop("SCHEDULER_DASHBOARD_TOKEN", None)
        process = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "dashboard", "--port", str(port), *args],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                Client(base).get("/static/dashboard.css")
                return base
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(process.communicate()[1]) from None
                time.sleep(0.1)

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=15) == 0, process.communicate()[1]


def test_serves_until_sigterm_and_guards_the_host_name(database: list[str], serve_cli: object) -> None:
    base = serve_cli(*database)  # type: ignore[operator]
    visitor = Client(base)
    page = visitor.get("/runs?status=dead_letter")
    assert page.status == 200 and "SMTP_REFUSED" in page.text and 'action="/actions/requeue"' in page.text
    assert visitor.get("/", headers={"Host": "attacker.example"}).status == 403  # DNS rebinding
    assert visitor.get("/", headers={"Host": "localhost:1"}).status == 200


@pytest.mark.parametrize("database", [SQLITE], indirect=True)  # the options act above the backend
def test_token_and_read_only(database: list[str], serve_cli: object) -> None:
    base = serve_cli(*database, "--read-only", "--token", "t0ken")  # type: ignore[operator]
    stranger = Client(base)
    assert stranger.get("/").status == 401
    member = Client(base)
    assert member.get("/?token=t0ken").status == 303
    page = member.get("/runs")
    assert page.status == 200 and "read-only" in page.text and 'action="/actions/' not in page.text
    refused = member.post("/actions/cancel", {"occurrence_id": "x", "csrf_token": member.csrf()})
    assert refused.status == 403


WHEEL_CHECK = """
import asyncio, importlib.resources, sys
import scheduler.dashboard
from scheduler import open_store
from scheduler.dashboard import create_app

package = importlib.resources.files("scheduler.dashboard")
assert (package / "templates" / "base.html").is_file()
for name in ("htmx.min.js", "htmx.LICENSE.txt", "chart.umd.min.js", "chart.js.LICENSE.md", "dashboard.js"):
    assert (package / "static" / name).is_file(), name

async def get(app, path):
    answer, requests = {}, [{"type": "http.request", "body": b"", "more_body": False}]
    async def receive():  # the request once, then no disconnect until the answer is sent
        if requests:
            return requests.pop()
        await asyncio.Event().wait()
    async def send(message):
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        else:
            answer["body"] = answer.get("body", b"") + message.get("body", b"")
    scope = {"type": "http", "method": "GET", "path": path, "root_path": "", "query_string": b"",
             "headers": [(b"host", b"127.0.0.1")], "scheme": "http", "http_version": "1.1"}
    await app(scope, receive, send)
    return answer["status"], answer["body"]

app = create_app(open_store(":memory:"))
status, body = asyncio.run(get(app, "/"))
assert status == 200 and b"<h1>Overview</h1>" in body, (status, body[:200])
status, body = asyncio.run(get(app, "/static/htmx.min.js"))
assert status == 200 and len(body) > 40_000
print(scheduler.dashboard.__file__)
"""


def test_the_wheel_ships_the_templates_and_static_files(wheel_env: InstalledWheel) -> None:
    shown = wheel_env.run("-c", WHEEL_CHECK, cwd=wheel_env.venv)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip().startswith(str(wheel_env.venv))  # the wheel's package, not the work tree


BLOCK_THE_EXTRA = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("starlette", "jinja2", "uvicorn"):
            raise ImportError(f"No module named {name!r}")

sys.meta_path.insert(0, Blocker())
"""


def _without_the_extra(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a Python that cannot import Starlette, Jinja2 or uvicorn."""
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", BLOCK_THE_EXTRA + code], capture_output=True, text=True, env=environment
    )


def test_without_the_extra_the_error_names_it(tmp_path: Path) -> None:
    database = tmp_path / "kernel.sqlite"
    open_store(database).close()
    shown = _without_the_extra(
        "import scheduler.dashboard\n"  # importing the package needs none of the extra
        "try:\n    scheduler.dashboard.create_app\nexcept ImportError as error:\n    print(error)\n"
    )
    assert shown.returncode == 0 and 'pip install "scheduler-kernel[dashboard]"' in shown.stdout, shown
    served = _without_the_extra(
        f"sys.argv = ['scheduler', 'dashboard', '--db', {str(database)!r}]\n"
        "from scheduler.cli import main\nmain()\n"
    )
    assert served.returncode == 1 and "scheduler-kernel[dashboard]" in served.stderr, served
