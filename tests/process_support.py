"""Processes of the tests: ``scheduler`` commands and Python scripts run as real processes of this
checkout (``start_scheduler``, ``start_python``, ``stop_gracefully``), and the processes of a
process group, read from ``/proc`` (for tests that stop a run and check that none of its processes
outlived it)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FORKSERVER: Any = multiprocessing.get_context("forkserver")
FORKSERVER.set_forkserver_preload(["scheduler.tasks", "scheduler.cli"])
"""Python processes forked from one server that imported the library once: many real processes
start in milliseconds instead of an import each (the server is single-threaded, so forking it is
safe). Targets must be importable functions (their module is found through ``sys.path``)."""


def start_processes(target: Callable[..., object], arguments: Sequence[tuple[Any, ...]]) -> list[BaseProcess]:
    """One :data:`FORKSERVER` process per argument tuple, running ``target(*arguments)``."""
    processes = [FORKSERVER.Process(target=target, args=args, daemon=True) for args in arguments]
    for process in processes:
        process.start()
    return processes


def stop_processes(processes: Sequence[BaseProcess], timeout_s: float = 60.0) -> list[int | None]:
    """SIGTERM to each process still running, then :func:`wait_processes`."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    return wait_processes(processes, timeout_s)


def wait_processes(processes: Sequence[BaseProcess], timeout_s: float = 60.0) -> list[int | None]:
    """The processes' exit codes once they exited (a process still there after ``timeout_s`` is
    killed and reported as ``None``)."""
    deadline = time.monotonic() + timeout_s
    codes: list[int | None] = []
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(5)
            codes.append(None)
        else:
            codes.append(process.exitcode)
    return codes


def _environment(extra: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, **(extra or {}), "PYTHONPATH": str(REPO)}


def start_scheduler(
    cwd: Path, *arguments: str, environment: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``python -m scheduler *arguments`` run in ``cwd`` (where a user's module lives), this checkout
    first on the path, with ``environment`` added; stderr is piped (read it with
    :func:`stop_gracefully`)."""
    command = [sys.executable, "-m", "scheduler", *arguments]
    return subprocess.Popen(
        command, cwd=cwd, env=_environment(environment), stderr=subprocess.PIPE, text=True
    )


def start_python(
    cwd: Path, script: Path, *arguments: str, environment: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``python script *arguments`` in ``cwd`` with this checkout on the path and ``environment``
    added; stdout and stderr piped."""
    return subprocess.Popen(
        [sys.executable, str(script), *arguments],
        cwd=cwd,
        env=_environment(environment),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_gracefully(process: subprocess.Popen[str], timeout_s: float = 60.0) -> tuple[int, str]:
    """SIGTERM, then wait for the exit: ``(exit code, stderr)``. A process still there after
    ``timeout_s`` is killed (and the wait raises)."""
    return stop_all_gracefully([process], timeout_s)[0]


def stop_all_gracefully(
    processes: Sequence[subprocess.Popen[str]], timeout_s: float = 60.0
) -> list[tuple[int, str]]:
    """:func:`stop_gracefully` for several processes at once (all signalled first)."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    ended: list[tuple[int, str]] = []
    try:
        for process in processes:
            _, stderr = process.communicate(timeout=timeout_s)
            ended.append((process.returncode, stderr or ""))
    except subprocess.TimeoutExpired:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
        raise
    return ended


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
