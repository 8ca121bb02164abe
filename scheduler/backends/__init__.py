"""The databases the store runs on, and the registry that picks one.

Each supported backend is a package (``sqlite``, ``postgresql``) with one class implementing
:class:`~scheduler.backends.interface.Backend` (its ``implementation`` module) and the modules
that class uses; its ``backend`` module also registers the renderings of the neutral constructs of
:mod:`scheduler.store.plumbing.constructs` when imported. :func:`backend_for` returns the backend
of a connection, engine, dialect or dialect name; any other database is
``SCHEDULER_INVALID_ARGUMENT``.

The registry loads a backend's implementation when it is first asked for: the implementations
build on the store's capabilities, which themselves reach the backend only through this
registry's answer (``Tx.backend``), never by importing a backend.
"""

from __future__ import annotations

import functools
import importlib
from typing import Final, Protocol, cast

from sqlalchemy.engine import Dialect

from scheduler.backends.interface import Backend
from scheduler.contract.errors import invalid_argument

_IMPLEMENTATIONS: Final = {
    "sqlite": "scheduler.backends.sqlite.implementation",
    "postgresql": "scheduler.backends.postgresql.implementation",
}
SUPPORTED: Final = tuple(_IMPLEMENTATIONS)
"""The dialect names of the supported backends."""


class _HasDialect(Protocol):
    @property
    def dialect(self) -> Dialect: ...


def is_supported(name: str) -> bool:
    """Whether ``name`` (a SQLAlchemy dialect name) is a supported backend."""
    return name in _IMPLEMENTATIONS


@functools.cache
def backend_named(name: str) -> Backend:
    """The backend of the dialect named ``name``; ``SCHEDULER_INVALID_ARGUMENT`` for another."""
    module = _IMPLEMENTATIONS.get(name)
    if module is None:
        raise invalid_argument(f"the scheduler store supports SQLite and PostgreSQL, not {name}")
    return cast(Backend, importlib.import_module(module).BACKEND)


def backend_for(subject: _HasDialect | Dialect | str) -> Backend:
    """The backend of a connection or engine (sync or async), a dialect, or a dialect name;
    ``SCHEDULER_INVALID_ARGUMENT`` for another database."""
    if isinstance(subject, str):
        return backend_named(subject)
    dialect = subject if isinstance(subject, Dialect) else subject.dialect
    return backend_named(dialect.name)


__all__ = ["SUPPORTED", "Backend", "backend_for", "backend_named", "is_supported"]
