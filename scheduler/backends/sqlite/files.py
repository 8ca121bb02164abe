"""Owner-only files and directories for a SQLite database (seed: secure-fs helpers)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from scheduler.contract.errors import SchedulerKernelError

STORAGE_INSECURE = "SCHEDULER_STORAGE_INSECURE"
SIDECAR_SUFFIXES = ("", "-journal", "-wal", "-shm")


def insecure(message: str, path: Path) -> SchedulerKernelError:
    return SchedulerKernelError(STORAGE_INSECURE, message, {"path": str(path)})


def storage_files(target: Path) -> list[Path]:
    """The database file and the sidecars SQLite may create beside it."""
    return [Path(f"{target}{suffix}") for suffix in SIDECAR_SUFFIXES]


def ensure_private_directory(directory: Path) -> None:
    """Create ``directory`` owner-only (0700) or check that an existing one is safe to use.

    An existing directory must be owned by the current user and not writable by others;
    a symbolic link in the last component is refused.
    """
    if not directory.exists() and not directory.is_symlink():
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        return
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode):
        raise insecure("Scheduler database directory must not be a symbolic link", directory)
    if not stat.S_ISDIR(info.st_mode):
        raise insecure("Scheduler database directory is not a directory", directory)
    if info.st_uid != os.geteuid():
        raise insecure("Scheduler database directory is owned by another user", directory)
    if info.st_mode & 0o002:
        raise insecure("Scheduler database directory is writable by other users", directory)


def check_private_file(path: Path) -> os.stat_result:
    """Refuse a symlink, a second name (hard link) or another user's file; change nothing.

    A file with more than one hard link is refused like a symbolic link: SQLite finds the
    ``-wal``/``-shm`` sidecars by name, so two processes opening the same file under two names
    would each use their own WAL and index and corrupt the file.
    """
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise insecure("Scheduler database file must not be a symbolic link", path)
    if not stat.S_ISREG(info.st_mode):
        raise insecure("Scheduler database path is not a regular file", path)
    if info.st_nlink > 1:
        raise insecure(
            f"Scheduler database file has {info.st_nlink} names (hard links); it must have exactly one",
            path,
        )
    if info.st_uid != os.geteuid():
        raise insecure("Scheduler database file is owned by another user", path)
    return info


def check_existing_files(target: Path) -> None:
    """The checks of :func:`secure_existing_files` without any change (before a verification
    that may still refuse the file: a refused open never changes a file's mode)."""
    for candidate in storage_files(target):
        if os.path.lexists(candidate):
            check_private_file(candidate)


def secure_existing_files(target: Path) -> None:
    """Check the database file and every sidecar present, then make them owner-only.

    Every file is checked before any mode is changed, so a refused database keeps its modes.
    """
    present = [candidate for candidate in storage_files(target) if os.path.lexists(candidate)]
    modes = {candidate: check_private_file(candidate).st_mode for candidate in present}
    for candidate, mode in modes.items():
        if stat.S_IMODE(mode) & 0o077:
            os.chmod(candidate, 0o600)


def check_writable(target: Path) -> None:
    """Raise ``OSError`` (``EROFS`` on a read-only mount, else ``EACCES``) if an existing database
    file cannot be written by this process.

    SQLite would silently open such a file read-only and fail only at the first write. (Checked
    with ``access()``, never by opening the file: closing a descriptor would drop this process's
    POSIX locks on it, which other connections of the process may hold.)
    """
    if os.path.exists(target) and not os.access(target, os.W_OK):
        read_only_mount = bool(os.statvfs(target).f_flag & os.ST_RDONLY)
        code = errno.EROFS if read_only_mount else errno.EACCES
        raise OSError(code, os.strerror(code), str(target))


def create_private_file(target: Path) -> None:
    """Create an empty database file with mode 0600 so SQLite never makes it world-readable."""
    try:
        descriptor = os.open(
            target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600
        )
    except FileExistsError:
        return
    os.close(descriptor)
