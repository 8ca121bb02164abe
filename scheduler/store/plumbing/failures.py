"""Classification of low-level storage failures (seed: findStorageFailureCode).

A storage code anywhere in an error's cause chain (an ``OSError`` errno, a SQLite result code
name from ``sqlite_errorname``) becomes ``SCHEDULER_STORAGE_UNAVAILABLE`` with
``{phase, storageCode, commitState, retryable}``. The SQLite result codes and a lost connection
(``CONNECTION_LOST``) live here; a server's own failures (PostgreSQL's SQLSTATEs) are classified
by the backend the caller names (:meth:`scheduler.backends.interface.Backend.storage_condition`);
the capability modules stay dialect-free.

``retryable`` (API §8) is ``True`` only for contention (``SQLITE_BUSY``/``SQLITE_LOCKED``) when
nothing can have been committed and the store owns the transaction; never for a SQLite busy
snapshot, which cannot succeed until the enclosing transaction is restarted.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING, Final, Literal

from scheduler.contract.errors import SchedulerKernelError

if TYPE_CHECKING:
    from scheduler.backends.interface import Backend

STORAGE_UNAVAILABLE = "SCHEDULER_STORAGE_UNAVAILABLE"
STORAGE_FAILURE_CODES = (
    # the original's codes (seed: STORAGE_FAILURE_CODES)
    "ENOSPC",
    "EROFS",
    "EIO",
    "SQLITE_FULL",
    "SQLITE_IOERR",
    "SQLITE_READONLY",
    # beyond the original: media that cannot be opened, written or locked
    "EACCES",
    "EPERM",
    "EDQUOT",
    "SQLITE_CANTOPEN",
    "SQLITE_PERM",
    "SQLITE_NOMEM",
    "SQLITE_NOLFS",
    "SQLITE_PROTOCOL",
)
# Lock contention is not a broken disk, but it is a storage condition the caller can retry.
CONTENTION_CODES = ("SQLITE_BUSY", "SQLITE_LOCKED")
# A write inside a deferred transaction whose snapshot is older than another connection's
# commit: SQLite refuses it for as long as that transaction lasts (extended result code 517).
BUSY_SNAPSHOT = "SQLITE_BUSY_SNAPSHOT"
# Extended result codes reported as they are (others are folded into their primary code, as
# the original does), because they change what the caller must do.
_KEPT_EXTENDED_CODES = (BUSY_SNAPSHOT,)

CommitState = Literal["not_committed", "unknown"]
IN_FAILED_TRANSACTION: Final = "25P02"
"""The storage code of a transaction aborted by an earlier failed statement (PostgreSQL's
SQLSTATE 25P02; only a caller's transaction reaches the store in that state): not retryable until
the caller rolls it back."""
CONNECTION_LOST: Final = "CONNECTION_LOST"
"""The storage code of a connection lost without a code of the server's (retryable)."""
_NETWORK_ERRNOS: Final = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "EPIPE", "ETIMEDOUT",
        "EHOSTUNREACH", "EHOSTDOWN", "ENETUNREACH", "ENETDOWN",
    )
    if hasattr(errno, name)
)  # fmt: skip


def _normalized(value: object, codes: tuple[str, ...]) -> str | None:
    if not isinstance(value, str):
        return None
    candidate = value.strip().upper()
    if candidate in codes:
        return candidate
    return next((code for code in codes if candidate.startswith(f"{code}_")), None)


def _own_codes(error: BaseException) -> list[object]:
    codes: list[object] = [getattr(error, "sqlite_errorname", None), getattr(error, "code", None)]
    if isinstance(error, OSError) and error.errno is not None:
        codes.append(errno.errorcode.get(error.errno))
    return codes


def is_network_error(error: BaseException) -> bool:
    """The server could not be reached or dropped the socket: asyncpg raises the ``OSError``
    itself (connection refused, reset, unreachable host, a connect timeout, an unknown host),
    where psycopg raises an ``OperationalError`` without a SQLSTATE."""
    if isinstance(error, (ConnectionError, TimeoutError, socket.gaierror)):
        return True
    return isinstance(error, OSError) and error.errno in _NETWORK_ERRNOS


def lost_connection(errors: list[BaseException]) -> tuple[str, bool] | None:
    """(``CONNECTION_LOST``, retryable) where a cause chain holding no server code tells of a lost
    connection (SQLAlchemy invalidated it, or a network ``OSError``); ``None`` otherwise: the
    storage condition of a backend without codes of its own."""
    if any(getattr(error, "connection_invalidated", False) is True for error in errors):
        return CONNECTION_LOST, True
    if any(is_network_error(error) for error in errors):
        return CONNECTION_LOST, True
    return None


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop(0)
        if current is None or any(current is item for item in seen):
            continue
        seen.append(current)
        orig = getattr(current, "orig", None)
        pending.extend(
            [orig if isinstance(orig, BaseException) else None, current.__cause__, current.__context__]
        )
    return seen


def find_storage_failure_code(
    error: BaseException, codes: tuple[str, ...] = STORAGE_FAILURE_CODES
) -> str | None:
    """The first storage failure code anywhere in the cause chain of ``error``."""
    for current in _chain(error):
        for value in _own_codes(current):
            code = _normalized(value, codes)
            if code:
                return code
    return None


def find_contention_code(error: BaseException) -> str | None:
    """``SQLITE_BUSY``/``SQLITE_LOCKED`` (or ``SQLITE_BUSY_SNAPSHOT``) anywhere in the chain."""
    for current in _chain(error):
        for value in _own_codes(current):
            if isinstance(value, str) and value.strip().upper() in _KEPT_EXTENDED_CODES:
                return value.strip().upper()
            code = _normalized(value, CONTENTION_CODES)
            if code:
                return code
    return None


def storage_unavailable(
    *, phase: str, storage_code: str, commit_state: CommitState, retryable: bool = False
) -> SchedulerKernelError:
    message = "Scheduler storage is unavailable"
    if storage_code == BUSY_SNAPSHOT:
        message += (
            " (SQLITE_BUSY_SNAPSHOT: another connection committed after the enclosing transaction"
            " first read; roll that transaction back and restart it to retry)"
        )
    elif storage_code == IN_FAILED_TRANSACTION:
        message += (
            " (25P02: the caller's transaction is aborted: a statement in it failed earlier; roll it"
            " back before using the store on this connection)"
        )
    return SchedulerKernelError(
        STORAGE_UNAVAILABLE,
        message,
        {"phase": phase, "storageCode": storage_code, "commitState": commit_state, "retryable": retryable},
    )


def classify_storage_failure(
    error: BaseException,
    backend: Backend | None,
    *,
    phase: str,
    commit_state: CommitState,
    contention_state: CommitState | None = None,
    owns_transaction: bool = True,
) -> SchedulerKernelError | None:
    """``SCHEDULER_STORAGE_UNAVAILABLE`` for a storage failure or contention; ``None`` otherwise.

    ``commit_state`` is what is known of the transaction; ``contention_state`` may prove more
    for lock contention (a busy statement or COMMIT changed nothing). Contention is retryable
    only when nothing was committed and ``owns_transaction`` (API §8). ``backend`` classifies its
    server's own failures (``None``: a database the store does not support, whose chain can only
    tell of a lost connection).
    """
    chain = _chain(error)
    server = lost_connection(chain) if backend is None else backend.storage_condition(chain)
    if server is not None:
        code, retryable_cause = server
        retryable = retryable_cause and owns_transaction and commit_state == "not_committed"
        return storage_unavailable(
            phase=phase, storage_code=code, commit_state=commit_state, retryable=retryable
        )
    storage_code = find_storage_failure_code(error)
    if storage_code:
        return storage_unavailable(phase=phase, storage_code=storage_code, commit_state=commit_state)
    contention = find_contention_code(error)
    if contention is None:
        return None
    state = contention_state or commit_state
    retryable = owns_transaction and state == "not_committed" and contention != BUSY_SNAPSHOT
    return storage_unavailable(phase=phase, storage_code=contention, commit_state=state, retryable=retryable)


def rolled_back(error: BaseException, backend: Backend) -> bool:
    """Whether ``error`` (or its causes) proves its transaction rolled back (``Backend.rolled_back``)."""
    return backend.rolled_back(_chain(error))


def missing_tables(error: BaseException, schema: str, backend: Backend) -> SchedulerKernelError | None:
    """``SCHEDULER_SCHEMA_UNKNOWN`` when a statement on a caller's connection (``on_connection``)
    found no scheduler table in ``schema`` (:meth:`~scheduler.backends.interface.Backend.missing_table`):
    not a scheduler database, or one ``open_store`` never created; ``None`` otherwise.

    Only the runners of a caller's connection ask: ``open_store`` verifies the catalog itself.
    """
    if not backend.missing_table(_chain(error)):
        return None
    found = SchedulerKernelError(
        "SCHEDULER_SCHEMA_UNKNOWN",
        f"The scheduler's tables are missing from schema {schema!r}: not a scheduler database"
        " (open it once with open_store, which creates them, before SchedulerStore.on_connection)",
        {"schema": schema},
    )
    found.__cause__ = error
    return found
