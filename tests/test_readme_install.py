"""The README's first screen: the demo's install line installs what the demo needs (no extra), and
the test command is what ``.ci/run`` installs and runs.

The demo is run with every optional package blocked (the drivers, OpenTelemetry, the test and lint
tools), as in an environment where ``pip install -e .`` installed only the core dependencies.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPTIONAL = (
    "psycopg",
    "asyncpg",
    "aiosqlite",
    "greenlet",
    "opentelemetry",
    "prometheus_client",
    "pytest",
    "hypothesis",
    "mypy",
    "ruff",
)


def bash_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)]


def test_the_demo_line_installs_no_extra_and_the_test_line_is_what_ci_runs() -> None:
    demo, tests = bash_blocks((REPO / "README.md").read_text(encoding="utf-8"))[:2]
    assert "pip install -e . && scheduler demo" in demo and "[" not in demo
    install, run = (part.strip() for part in tests.split("&&"))
    assert install == 'pip install -e ".[test,postgres,async]"'
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert install.replace("pip install ", "pip install --quiet ") in ci.splitlines()
    assert run in ci.splitlines()


def test_the_demo_runs_on_the_core_dependencies_alone(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        for name in {OPTIONAL!r}:
            sys.modules[name] = None  # as if only `pip install -e .` had run
        from scheduler.cli import main
        sys.argv = ["scheduler", "demo", "--json"]
        main()
        """
    )
    env = {**os.environ, "SCHEDULER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    env.pop("SCHEDULER_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["database"] == str(tmp_path / "home" / "kernel-v1.sqlite")
    assert sorted(item["status"] for item in report["occurrences"]) == [
        "dead_letter",
        "succeeded",
        "succeeded",
        "succeeded",
    ]
