"""The lab scripts in ``benchmarks/``: outside the installed package, and still runnable.

Every script starts (``--help``) from a checkout's root as ``python -m benchmarks.NAME``; the three
that measure SQLite on their own (schema floor, WAL frames, profile) run at tiny sizes.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import setuptools

REPO = Path(__file__).resolve().parents[1]
HELPERS = {"__init__", "lab"}
SCRIPTS = sorted(path.stem for path in (REPO / "benchmarks").glob("*.py") if path.stem not in HELPERS)
START_ALL = """
import runpy, signal, sys, warnings

def too_slow(*_):
    raise TimeoutError("--help took over 30 s")

warnings.simplefilter("ignore", RuntimeWarning)  # a script another one imported is run again
signal.signal(signal.SIGALRM, too_slow)
for name in sys.argv[1:]:
    sys.argv = [name, "--help"]
    signal.alarm(30)
    try:
        runpy.run_module("benchmarks." + name, run_name="__main__")
    except SystemExit as stop:
        assert stop.code in (0, None), (name, stop.code)
    else:
        raise AssertionError(name + " --help did not exit: every lab script takes --help")
    finally:
        signal.alarm(0)
    print("started", name, file=sys.stderr)
"""


def _run(*arguments: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SCHEDULER_BENCH_SCALE": ""}
    return subprocess.run(
        [sys.executable, *arguments], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_every_lab_script_starts() -> None:
    assert len(SCRIPTS) >= 14
    completed = _run("-c", START_ALL, *SCRIPTS)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stderr.count("started ") == len(SCRIPTS)


def test_the_readme_says_what_each_script_is_for() -> None:
    readme = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    unlisted = [name for name in SCRIPTS if f"| `{name}.py` |" not in readme]
    assert not unlisted, f"add a line for each to benchmarks/README.md: {unlisted}"


def test_the_package_never_imports_the_lab() -> None:
    """``benchmarks`` is not installed, so nothing in ``scheduler/`` may import it."""
    for path in (REPO / "scheduler").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(name.split(".")[0] in {"benchmarks", "tools"} for name in names), path


def test_the_wheel_finds_only_the_scheduler_packages() -> None:
    """pyproject's ``packages.find`` (include ``scheduler*``) leaves the lab and the tools out."""
    found = setuptools.find_packages(str(REPO), include=["scheduler*"])
    assert "scheduler" in found and "scheduler.bench" in found
    assert not [name for name in found if not name.startswith("scheduler")]
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'include = ["scheduler*"]' in pyproject


def test_the_schema_floor_prints_the_library_share() -> None:
    completed = _run("-m", "benchmarks.schema_floor", "--quick", "--scale", "0.01")
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("raw commit floor: ")
    shares = {line.split()[0]: line.split()[-1] for line in lines[2:]}
    assert set(shares) == {
        "enqueue_occurrence_per_s",
        "enqueue_many_items_per_s",
        "claim_settle_cycles_per_s",
        "settle_and_claim_cycles_per_s",
    }
    assert all(share.endswith("%") and int(share[:-1]) > 0 for share in shares.values()), shares


def test_wal_frames_counts_the_pages_of_each_commit() -> None:
    completed = _run("-m", "benchmarks.wal_frames", "--depth", "200")
    assert completed.returncode == 0, completed.stderr[-3000:]
    frames = {
        line.split(":")[0].split(" @ ")[0]: float(line.split(": ")[1].split()[0])
        for line in completed.stdout.splitlines()
    }
    assert set(frames) == {
        "raw commit floor",
        "enqueue_occurrence",
        "claim_next",
        "settle",
        "settle_and_claim",
    }
    # One small row is about one page; a store write touches its rows' tables and indexes.
    assert 0.5 <= frames["raw commit floor"] <= 2
    assert all(frames[name] > frames["raw commit floor"] for name in frames if name != "raw commit floor")


def test_the_profile_groups_add_up() -> None:
    completed = _run("-m", "benchmarks.profile_hot_paths", "--quick", "--scale", "0.01")
    assert completed.returncode == 0, completed.stderr[-3000:]
    for name in ("enqueue_occurrence", "claim_next_settle", "settle_and_claim"):
        assert f"**{name}** — " in completed.stdout
    shares = [
        float(line.rsplit("|", 2)[1].strip().rstrip("%"))
        for line in completed.stdout.splitlines()
        if line.startswith("| ") and line.rstrip().endswith("% |")
    ]
    assert len(shares) >= 3 * 3
    assert abs(sum(shares) - 300.0) < 1.5  # three profiles, each 100 %
