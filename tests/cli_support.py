"""Helpers of the command-line tests: invoking ``scheduler`` in-process, an isolated environment."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from scheduler.cli import app

runner = CliRunner()


def invoke(*args: str) -> Result:
    """``scheduler ARGS…`` in-process (wide terminal, so tables are not folded)."""
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def run_json(*args: str, exit_code: int = 0) -> Any:
    """``scheduler ARGS… --json``: its exit code must be ``exit_code``; the parsed stdout."""
    result = invoke(*args, "--json")
    assert result.exit_code == exit_code, result.output
    return json.loads(result.stdout)


def decide_arguments(occurrence: str, case: dict[str, Any], reason: str = "never sent") -> list[str]:
    """``adjudication decide OCCURRENCE …`` quoting ``case`` (from ``adjudication show --json``)."""
    return [
        "adjudication",
        "decide",
        occurrence,
        "--decision",
        "confirmed_not_applied",
        "--evidence-digest",
        case["evidenceDigest"],
        "--attempt",
        str(case["attempt"]),
        "--fence",
        str(case["fence"]),
        "--reason",
        reason,
        "--operator",
        "ops@example.com",
    ]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``$SCHEDULER_DATABASE_URL``; ``$SCHEDULER_HOME`` in the test's temporary directory.

    Autouse in every module that imports it.
    """
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)
    monkeypatch.setenv("SCHEDULER_HOME", str(tmp_path / "scheduler-home"))
