"""Processes of a process group, read from ``/proc`` (for tests that stop a run and check that
none of its processes outlived it)."""

from __future__ import annotations

import time
from pathlib import Path


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
