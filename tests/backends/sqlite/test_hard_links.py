"""One file, two names: a database or sidecar with more than one hard link is refused
(SCHEDULER_STORAGE_INSECURE, like a symbolic link), and left untouched (issue 15, item 4).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hardening_support import T0, expect_code, new_store, sidecars

from scheduler import open_store

INSECURE = "SCHEDULER_STORAGE_INSECURE"


def state(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file's sha256 and mode."""
    return {
        entry.name: (hashlib.sha256(entry.read_bytes()).hexdigest(), entry.stat().st_mode)
        for entry in sorted(directory.iterdir())
    }


def test_a_second_name_of_the_database_is_refused_under_both_names(tmp_path: Path) -> None:
    """The issue's input: two processes would use the file through two names."""
    first = tmp_path / "a" / "kernel.sqlite"
    first.parent.mkdir(mode=0o700)
    new_store(first).close()
    second = tmp_path / "b" / "alias.sqlite"
    second.parent.mkdir(mode=0o700)
    os.link(first, second)
    before = state(first.parent), state(second.parent)
    for name in (first, second):
        error = expect_code(INSECURE, lambda name=name: open_store(name, clock=lambda: T0))
        assert error.details == {"path": str(name)}
        assert "hard link" in error.message
    assert (state(first.parent), state(second.parent)) == before
    second.unlink()
    open_store(first, clock=lambda: T0).close()  # one name again: accepted


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_a_sidecar_with_a_second_name_is_refused_and_nothing_changes(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / "kernel.sqlite"
    new_store(path).close()
    path.chmod(0o640)  # a mode open_store would fix: it must not, since it refuses
    sidecar = tmp_path / f"kernel.sqlite{suffix}"
    sidecar.write_bytes(b"")
    sidecar.chmod(0o600)
    os.link(sidecar, tmp_path / "elsewhere")
    before = state(tmp_path)
    error = expect_code(INSECURE, lambda: open_store(path, clock=lambda: T0))
    assert error.details == {"path": str(sidecar)}
    assert state(tmp_path) == before


def test_every_file_the_store_may_open_is_checked(tmp_path: Path) -> None:
    """The kind: whichever of the files SQLite opens by name has a second name, open is refused."""
    path = tmp_path / "kernel.sqlite"
    store = new_store(path)
    open_names = sidecars(path)  # -wal and -shm while open
    assert open_names == ["kernel.sqlite-shm", "kernel.sqlite-wal"]
    other = tmp_path / "other"
    for name in ["kernel.sqlite", *open_names]:
        os.link(tmp_path / name, other)
        expect_code(INSECURE, lambda: open_store(path, clock=lambda: T0))
        other.unlink()
    store.close()
    open_store(path, clock=lambda: T0).close()
