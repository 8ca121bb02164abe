"""The framework recipes (``examples/fastapi_app``, ``examples/flask_app``) run as a user runs them:
the web app served by its real server in a process of its own on a free loopback port, a
``scheduler worker app:tasks`` process, real HTTP requests, and ``scheduler tasks list`` reading the
runs. Each app reads its database from ``SHOP_DATABASE_URL``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cli_support import run_json
from process_support import REPO, start_scheduler, stop_gracefully

EXAMPLES: Final = REPO / "examples"
DEADLINE_S: Final = 20.0


@dataclass(frozen=True)
class Database:
    """Where a recipe runs: the app's URL (its driver) and ``--db`` for the ``scheduler`` command."""

    app_url: str
    cli_url: str


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def page(port: int, path: str) -> tuple[int, str]:
    """``(status, text)`` of one GET of an HTML page of the app."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def request(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """``(status, JSON answer)`` of one HTTP request to the app."""
    data = None if body is None else json.dumps(body).encode()
    sent = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(sent, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


@contextmanager
def serving(example: Path, command: Sequence[str], database: Database, log: Path) -> Iterator[int]:
    """The app served by ``command`` (``{port}`` filled in) in ``example``; its port once it answers."""
    port = free_port()
    environment = {**os.environ, "PYTHONPATH": str(REPO), "SHOP_DATABASE_URL": database.app_url}
    with log.open("w") as output:
        server = subprocess.Popen(
            [sys.executable, *(part.format(port=port) for part in command)],
            cwd=example,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert server.poll() is None, log.read_text()
            try:
                if request(port, "GET", "/orders")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the app did not answer: " + log.read_text()
            time.sleep(0.1)
        yield port
    finally:
        server.terminate()
        server.wait(15)


def wait_succeeded(port: int, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        status, run = request(port, "GET", f"/runs/{run_id}")
        assert status == 200, run
        if run["status"] == "succeeded":
            return dict(run)
        assert run["status"] in ("queued", "running"), run
        assert time.monotonic() < deadline, run
        time.sleep(0.05)


def check_recipe(example: Path, command: Sequence[str], database: Database, tmp_path: Path) -> None:
    """Two orders placed (each defers its receipt in the request's transaction), one refused after
    its defer (rolled back: no order, no run); a worker runs the two receipts."""
    with serving(example, command, database, tmp_path / "server.log") as port:
        placed = {}
        for order, cents in (("o-1", 1250), ("o-2", 990)):
            status, answer = request(port, "POST", "/orders", {"id": order, "total_cents": cents})
            assert status == 200 and answer["order"] == order, answer
            placed[order] = answer["receipt_run"]
        status, refused = request(port, "POST", "/orders", {"id": "o-3", "total_cents": 0})
        assert status == 402 and "payment declined" in json.dumps(refused), refused
        worker = start_scheduler(
            example,
            "worker",
            "app:tasks",
            "--poll-max-ms",
            "100",
            environment={"SHOP_DATABASE_URL": database.app_url},
        )
        try:
            for order, run_id in placed.items():
                run = wait_succeeded(port, run_id)
                assert (run["task"], run["value"]) == ("shop.send_receipt", {"sent": f"receipt for {order}"})
        finally:
            code, errors = stop_gracefully(worker)
        assert code == 0, errors
        assert "settled" in errors  # the worker's log records
        assert request(port, "GET", "/orders") == (200, ["o-1", "o-2"])
        if (example / "app.py").read_text().count("create_app(tasks)"):  # the mounted dashboard
            for run_id in placed.values():
                status, shown = page(port, f"/scheduler/run?id={run_id}")
                assert status == 200 and "succeeded" in shown and "shop.send_receipt" in shown, shown[:500]
    runs = run_json("tasks", "list", "--db", database.cli_url)["runs"]
    assert sorted((run["args"]["order_id"], run["status"]) for run in runs) == [
        ("o-1", "succeeded"),
        ("o-2", "succeeded"),
    ]  # the refused order deferred nothing
