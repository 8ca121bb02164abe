"""Canonical source-locator paths (the original's ``source-locator-path.js``).

The identity of a path depends on the platform's rules: POSIX paths are normalized absolute
paths; Windows paths must be fully qualified (drive or UNC share, also ``\\\\?\\`` forms), and are
normalized, lower-cased and use backslashes. The helpers below port the parts of Node's
``path.posix`` / ``path.win32`` that these rules use, so results match the original on any host.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Final

from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.contract.scalars import js_trim

SOURCE_PATH_INVALID: Final = "SCHEDULER_SOURCE_PATH_INVALID"
_WINDOWS_QUALIFIED_MESSAGE: Final = (
    "Windows scheduler source path must use a fully-qualified drive or UNC share"
)

_WIN_ROOTS: Final = (
    re.compile(r"[A-Za-z]:\\\Z"),
    re.compile(r"\\\\\?\\[A-Za-z]:\\\Z"),
    re.compile(r"\\\\\?\\UNC\\[^\\]+\\[^\\]+\\\Z", re.IGNORECASE),
    re.compile(r"\\\\(?![?.]\\)[^\\]+\\[^\\]+\\\Z"),
)
_EXTENDED_UNC: Final = re.compile(r"[\\/]{2}\?[\\/]UNC[\\/][^\\/]+[\\/]+[^\\/]+(?:[\\/]|\Z)", re.IGNORECASE)
_EXTENDED_DRIVE: Final = re.compile(r"[\\/]{2}\?[\\/][A-Za-z]:[\\/]")
_DEVICE_NAMESPACE: Final = re.compile(r"[\\/]{2}[?.][\\/]")
_DRIVE: Final = re.compile(r"[A-Za-z]:[\\/]")
_UNC: Final = re.compile(r"[\\/]{2}[^\\/]+[\\/]+[^\\/]+(?:[\\/]|\Z)")
_DRIVE_RELATIVE: Final = re.compile(r"[A-Za-z]:(?:[^\\/]|\Z)")
_POSIX_SEPARATORS: Final = re.compile("/")
_WIN_SEPARATORS: Final = re.compile(r"[\\/]")


def _path_error(message: str) -> SchedulerKernelError:
    return SchedulerKernelError(SOURCE_PATH_INVALID, message)


def _base(base_path: object) -> str:
    if base_path is None:
        return os.getcwd()
    if not isinstance(base_path, str):
        raise _path_error("scheduler source path base must be a string")
    return base_path


def _resolve_platform(platform: str | None) -> str:
    if platform is None:
        if sys.platform == "win32":
            return "win32"
        return "darwin" if sys.platform == "darwin" else "linux"
    if not isinstance(platform, str):
        raise invalid_argument("platform must be a string such as linux, darwin or win32")
    return platform


# --- Node path helpers -------------------------------------------------------------------------


def _normalize_segments(path: str, allow_above_root: bool, separators: re.Pattern[str], sep: str) -> str:
    """Node's ``normalizeString``: drop empty and ``.`` segments, resolve ``..``."""
    out: list[str] = []
    for segment in separators.split(path):
        if segment in ("", "."):
            continue
        if segment == "..":
            if out and out[-1] != "..":
                out.pop()
            elif allow_above_root:
                out.append("..")
            continue
        out.append(segment)
    return sep.join(out)


def _posix_normalize(path: str) -> str:
    if not path:
        return "."
    absolute = path.startswith("/")
    trailing = path.endswith("/")
    tail = _normalize_segments(path, not absolute, _POSIX_SEPARATORS, "/")
    if not tail:
        return "/" if absolute else ("./" if trailing else ".")
    if trailing:
        tail += "/"
    return f"/{tail}" if absolute else tail


def _posix_resolve(*paths: str) -> str:
    resolved = ""
    absolute = False
    for path in reversed((os.getcwd(), *paths)):
        if path:
            resolved = f"{path}/{resolved}"
            absolute = path.startswith("/")
            if absolute:
                break
    tail = _normalize_segments(resolved, not absolute, _POSIX_SEPARATORS, "/")
    return f"/{tail}" if absolute else (tail or ".")


def _posix_dirname(path: str) -> str:
    if not path:
        return "."
    has_root = path.startswith("/")
    end = -1
    matched_slash = True
    for i in range(len(path) - 1, 0, -1):
        if path[i] == "/":
            if not matched_slash:
                end = i
                break
        else:
            matched_slash = False
    if end == -1:
        return "/" if has_root else "."
    if has_root and end == 1:
        return "//"
    return path[:end]


def _is_sep(char: str) -> bool:
    return char in "\\/"


def _is_drive_letter(char: str) -> bool:
    return char.isascii() and char.isalpha()


def _win_unc(path: str) -> tuple[str, int, int, int] | None:
    """Match ``\\\\first\\second`` at the start: ``(first, second_start, second_end, len)``."""
    n = len(path)
    if n < 2 or not (_is_sep(path[0]) and _is_sep(path[1])):
        return None
    j = last = 2
    while j < n and not _is_sep(path[j]):
        j += 1
    if j >= n or j == last:
        return None
    first = path[last:j]
    last = j
    while j < n and _is_sep(path[j]):
        j += 1
    if j >= n or j == last:
        return None
    last = j
    while j < n and not _is_sep(path[j]):
        j += 1
    return first, last, j, n


def _win_root(path: str) -> tuple[str, int, bool]:
    """Node's win32 root matching: ``(device, root_end, is_absolute)``."""
    n = len(path)
    if n == 0:
        return "", 0, False
    if n == 1:
        return ("", 1, True) if _is_sep(path[0]) else ("", 0, False)
    if _is_sep(path[0]):
        unc = _win_unc(path)
        if unc is not None:
            first, start, end, _ = unc
            if first in (".", "?"):
                return f"\\\\{first}", 4, True
            return f"\\\\{first}\\{path[start:end]}", end, True
        return "", 1, True
    if _is_drive_letter(path[0]) and path[1] == ":":
        if n > 2 and _is_sep(path[2]):
            return path[:2], 3, True
        return path[:2], 2, False
    return "", 0, False


def _win_normalize(path: str) -> str:
    """Node's ``path.win32.normalize`` for the rooted paths this module feeds it."""
    if not path:
        return "."
    if len(path) == 1:
        return "\\" if path == "/" else path
    unc = _win_unc(path)
    if unc is not None and unc[0] not in (".", "?") and unc[2] == unc[3]:
        return f"\\\\{unc[0]}\\{path[unc[1] :]}\\"  # a bare UNC root
    device, root_end, absolute = _win_root(path)
    tail = _normalize_segments(path[root_end:], not absolute, _WIN_SEPARATORS, "\\")
    if not tail and not absolute:
        tail = "."
    if tail and _is_sep(path[-1]):
        tail += "\\"
    if not device:
        return f"\\{tail}" if absolute else tail
    return f"{device}\\{tail}" if absolute else f"{device}{tail}"


def _win_resolve(*paths: str) -> str:
    """Node's ``path.win32.resolve`` (the process cwd stands in for a drive's cwd)."""
    resolved_device = ""
    resolved_tail = ""
    resolved_absolute = False
    for i in range(len(paths) - 1, -2, -1):
        if i >= 0:
            path = paths[i]
            if not path:
                continue
        elif not resolved_device:
            path = os.getcwd()
        else:
            path = os.environ.get(f"={resolved_device}") or os.getcwd()
            if path[:2].lower() != resolved_device.lower() and path[2:3] == "\\":
                path = f"{resolved_device}\\"
        device, root_end, absolute = _win_root(path)
        if device:
            if resolved_device:
                if device.lower() != resolved_device.lower():
                    continue
            else:
                resolved_device = device
        if resolved_absolute:
            if resolved_device:
                break
        else:
            resolved_tail = f"{path[root_end:]}\\{resolved_tail}"
            resolved_absolute = absolute
            if absolute and resolved_device:
                break
    tail = _normalize_segments(resolved_tail, not resolved_absolute, _WIN_SEPARATORS, "\\")
    if resolved_absolute:
        return f"{resolved_device}\\{tail}"
    return f"{resolved_device}{tail}" or "."


def _win_parse_root(path: str) -> str:
    """``path.win32.parse(path).root``."""
    n = len(path)
    if n == 0:
        return ""
    if n == 1:
        return path if _is_sep(path[0]) else ""
    if _is_sep(path[0]):
        unc = _win_unc(path)
        if unc is None:
            return path[:1]
        _, start, end, _ = unc
        if end == n:
            return path
        return path[: end + 1] if end != start else path[:1]
    if _is_drive_letter(path[0]) and path[1] == ":":
        if n <= 2 or (n == 3 and _is_sep(path[2])):
            return path
        return path[:3] if _is_sep(path[2]) else path[:2]
    return ""


def _win_dirname(path: str) -> str:
    """Node's ``path.win32.dirname``."""
    n = len(path)
    if n == 0:
        return "."
    if n == 1:
        return path if _is_sep(path[0]) else "."
    root_end = -1
    offset = 0
    if _is_sep(path[0]):
        root_end = offset = 1
        unc = _win_unc(path)
        if unc is not None:
            _, start, end, _ = unc
            if end == n:
                return path
            if end != start:
                root_end = offset = end + 1
    elif _is_drive_letter(path[0]) and path[1] == ":":
        root_end = offset = 3 if n > 2 and _is_sep(path[2]) else 2
    end = -1
    matched_slash = True
    for i in range(n - 1, offset - 1, -1):
        if _is_sep(path[i]):
            if not matched_slash:
                end = i
                break
        else:
            matched_slash = False
    if end == -1:
        if root_end == -1:
            return "."
        end = root_end
    return path[:end]


def _strip_trailing_separators(value: str, windows: bool) -> str:
    if windows and any(pattern.match(value) for pattern in _WIN_ROOTS):
        return value
    root = _win_parse_root(value) if windows else ("/" if value.startswith("/") else "")
    sep = "\\" if windows else "/"
    end = len(value)
    while end > len(root) and value[end - 1] == sep:
        end -= 1
    return value[:end]


# --- public API --------------------------------------------------------------------------------


def is_fully_qualified_windows_scheduler_path(value: object) -> bool:
    """True for ``C:\\…``, ``\\\\server\\share…`` and their ``\\\\?\\`` extended forms.

    Root-relative (``\\foo``), drive-relative (``C:foo``), device namespaces (``\\\\.\\…``) and
    incomplete UNC paths are not fully qualified; neither is a string with surrounding whitespace.
    """
    if not isinstance(value, str) or not value or js_trim(value) != value:
        return False
    if _EXTENDED_UNC.match(value) or _EXTENDED_DRIVE.match(value):
        return True
    if _DEVICE_NAMESPACE.match(value):
        return False
    return bool(_DRIVE.match(value) or _UNC.match(value))


def canonical_scheduler_source_path(
    value: object,
    *,
    platform: str | None = None,
    base_path: str | None = None,
    allow_relative: bool = False,
) -> str:
    """The durable identity of a source path (``SCHEDULER_SOURCE_PATH_INVALID`` if it has none).

    POSIX: normalized absolute path without trailing ``/`` (except ``/``). Windows: normalized,
    lower-cased, fully-qualified path without trailing separators (roots keep theirs). Relative
    input is resolved against ``base_path`` (default: the process cwd) only when
    ``allow_relative`` is true. ``platform`` is ``linux``/``darwin``/``win32``; ``None`` = host.
    """
    if not isinstance(value, str) or not value or js_trim(value) != value:
        raise _path_error("scheduler source path must be a non-empty string")
    windows = _resolve_platform(platform) == "win32"
    if windows:
        candidate = value
        if not is_fully_qualified_windows_scheduler_path(candidate):
            if _is_sep(candidate[0]) or _DRIVE_RELATIVE.match(candidate) or not allow_relative:
                raise _path_error(_WINDOWS_QUALIFIED_MESSAGE)
            base = _base(base_path)
            if not is_fully_qualified_windows_scheduler_path(base):
                raise _path_error(
                    "Windows scheduler source path base must use a fully-qualified drive or UNC share"
                )
            candidate = _win_resolve(base, candidate)
        if not is_fully_qualified_windows_scheduler_path(candidate):
            raise _path_error(_WINDOWS_QUALIFIED_MESSAGE)
        return _strip_trailing_separators(_win_normalize(candidate), True).lower()
    absolute = value.startswith("/")
    if not absolute and not allow_relative:
        raise _path_error("scheduler source path must be absolute")
    if not absolute:
        value = _posix_resolve(_base(base_path), value)
    return _strip_trailing_separators(_posix_normalize(value), False)


def is_canonical_scheduler_source_path(path: object, *, platform: str | None = None) -> bool:
    """True when ``path`` is already its own canonical, absolute form (never raises for ``path``)."""
    resolved = _resolve_platform(platform)
    try:
        return canonical_scheduler_source_path(path, platform=resolved) == path
    except SchedulerKernelError:
        return False


def scheduler_source_path_dirname(value: object, *, platform: str | None = None) -> str:
    """The canonical parent directory of a source path (a root is its own parent).

    Like the original with default options, a relative ``value`` is resolved against the cwd.
    """
    resolved = _resolve_platform(platform)
    canonical = canonical_scheduler_source_path(value, platform=resolved, allow_relative=True)
    parent = _win_dirname(canonical) if resolved == "win32" else _posix_dirname(canonical)
    return canonical_scheduler_source_path(parent, platform=resolved)
