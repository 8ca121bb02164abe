"""Processes of a process group, read from ``/proc`` (for tests that stop a run and check that
none of its processes outlived it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def group_members(group: int, command_contains: str = "") -> list[int]:
    """The pids of ``group``'s processes that are not zombies, whose command line contains
    ``command_contains``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _parent, process_group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if int(process_group) == group and state != "Z" and command_contains in command:
            members.append(int(stat.parent.name))
    return members


def group_alive(group: int, wait_s: float = 10.0) -> bool:
    """Whether a process of ``group`` (not a zombie) is still there ``wait_s`` seconds on
    (multiprocessing's resource tracker exits shortly after its parent)."""
    deadline = time.monotonic() + wait_s
    while group_members(group):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


def bench_stopped_with_sigterm(
    arguments: Sequence[str],
    reached: Callable[[subprocess.Popen[bytes]], bool],
    *,
    environment: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> int:
    """Start ``python -m scheduler.bench *arguments`` in a process group of its own, wait (at most
    120 s) until ``reached(run)``, send it ``SIGTERM`` and check that it exits with 143 within
    ``timeout_s`` and that no process of its group outlives it; the run's pid. A group left behind
    (a failure) is killed and reaped."""
    run = subprocess.Popen(
        [sys.executable, "-m", "scheduler.bench", *arguments],
        cwd=REPO,
        env={**os.environ, **(environment or {}), "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its worker processes join its process group
    )
    try:
        deadline = time.monotonic() + 120
        while not reached(run):
            assert run.poll() is None and time.monotonic() < deadline, "the run never got there"
            time.sleep(0.02)
        run.send_signal(signal.SIGTERM)
        _, errors = run.communicate(timeout=timeout_s)
        assert run.returncode == 143, errors[-4000:]
        assert not group_alive(run.pid), "a worker process outlived the run"
    finally:
        if group_alive(run.pid, wait_s=0):
            with suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
    return run.pid
