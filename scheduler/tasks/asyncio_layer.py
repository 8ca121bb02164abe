"""SQLAlchemy's asyncio layer, loaded only by async code.

SQLAlchemy 2.1 no longer installs ``greenlet``, without which ``sqlalchemy.ext.asyncio`` (and so
:mod:`scheduler.aio`) cannot be imported; it comes with the ``[async]`` extra. The sync side of
Tasks — ``defer``, ``result()``, workers, the command line — must work without it. So a type test
looks at an async class only when its module is already loaded (no object of that class can exist
before), and the async API is imported on first async use, naming the extra when it is missing.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Final, TypeGuard

from scheduler.contract.errors import invalid_argument

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

    from scheduler.aio import AsyncSchedulerStore

INSTALL_HINT: Final = 'pip install "scheduler-kernel[async]"'
_SQLALCHEMY_ASYNCIO: Final = "sqlalchemy.ext.asyncio"


def _is_instance(value: object, module: str, *names: str) -> bool:
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(value, tuple(getattr(loaded, name) for name in names))


def is_async_engine(value: object) -> TypeGuard[AsyncEngine]:
    return _is_instance(value, _SQLALCHEMY_ASYNCIO, "AsyncEngine")


def is_async_connection(value: object) -> TypeGuard[AsyncConnection | AsyncSession]:
    """An ``AsyncConnection`` or an ``AsyncSession``."""
    return _is_instance(value, _SQLALCHEMY_ASYNCIO, "AsyncConnection", "AsyncSession")


def is_async_session(value: object) -> TypeGuard[AsyncSession]:
    return _is_instance(value, _SQLALCHEMY_ASYNCIO, "AsyncSession")


def is_async_store(value: object) -> TypeGuard[AsyncSchedulerStore]:
    return _is_instance(value, "scheduler.aio.store", "AsyncSchedulerStore")


def async_api() -> ModuleType:
    """:mod:`scheduler.aio`, imported now; ``SCHEDULER_INVALID_ARGUMENT`` naming the extra to
    install when SQLAlchemy's asyncio layer cannot be loaded."""
    try:
        import scheduler.aio
    except ImportError as error:
        raise invalid_argument(
            f"async calls need SQLAlchemy's asyncio layer, which cannot be loaded (greenlet is "
            f"missing?): {INSTALL_HINT}"
        ) from error
    return scheduler.aio


__all__ = [
    "INSTALL_HINT",
    "async_api",
    "is_async_connection",
    "is_async_engine",
    "is_async_session",
    "is_async_store",
]
