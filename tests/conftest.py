"""Fixtures shared by the whole suite: the PostgreSQL server and the ``backend`` parameter.

* ``postgres_server`` (session): the server of ``SCHEDULER_TEST_POSTGRES_URL``; skips when the
  variable is unset, FAILS when it is set and the server does not answer.
* ``pg_engine`` (session): an engine on the test run's database, shared: add no event listener to it.
* ``private_engine``: an engine on the same database of the test's own (one it may listen to).
* ``pg_schema``: a fresh schema name (not created yet), dropped with everything in it afterwards.
* ``pg_database``: a fresh, empty database (URL), dropped afterwards.
* ``wheel_env`` (session): this project built as a wheel and installed into a fresh venv
  (``wheel_support.py``), for tests that use it as an application would.
* ``backend``: parametrized ``"sqlite"`` / ``"postgresql"``; a ``backends.Backend`` with an
  engine and the schema to use. Use it to run one test body on both backends.
* ``place``: parametrized the same way; where a behavioural test's store lives (``store_places.py``).

``--backend sqlite|postgresql`` runs only that backend's tests (see tests/conformance/README.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from backends import (
    BACKENDS,
    HOW_TO_ENABLE,
    POSTGRESQL,
    SQLITE,
    Backend,
    PostgresServer,
    configured_url,
    describe_url,
    sqlite_engine,
    unique_name,
    unreachable_message,
)
from recorded import T0
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool
from store_places import PostgresSchemaPlace, SqliteFilePlace, StorePlace
from wheel_support import InstalledWheel, install_wheel

from scheduler import open_store


def pytest_report_header(config: pytest.Config) -> str:
    url = configured_url()
    return f"postgresql: {describe_url(url)}" if url else f"postgresql: not configured ({HOW_TO_ENABLE})"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="run only this backend's tests: deselect every test that runs on another backend "
        "(tests that use no backend in particular still run)",
    )


# The parameters that say which backend a test runs on (``backend``, ``place``, the claim
# equivalence's ``harness``, the async API's ``aio_place``), and their values' backends.
BACKEND_PARAMETERS: Final = ("backend", "place", "harness", "aio_place")
PARAM_BACKENDS: Final = {
    SQLITE: SQLITE,
    "aiosqlite": SQLITE,
    POSTGRESQL: POSTGRESQL,
    "asyncpg": POSTGRESQL,
    "psycopg_async": POSTGRESQL,
}


def item_backend(item: pytest.Item) -> str | None:
    """The backend ``item`` runs on: named by one of its parameters, or PostgreSQL when it uses
    the server; ``None`` for a test of no backend in particular."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        for name in BACKEND_PARAMETERS:
            value = callspec.params.get(name)
            if isinstance(value, str) and value in PARAM_BACKENDS:
                return PARAM_BACKENDS[value]
    if "postgres_server" in getattr(item, "fixturenames", ()):
        return POSTGRESQL
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the server ``postgresql`` (``-m "not postgresql"`` deselects them);
    with ``--backend NAME``, deselect the tests of the other backends."""
    only = config.getoption("backend")
    kept, deselected = [], []
    for item in items:
        backend = item_backend(item)
        if backend == POSTGRESQL or "postgres_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgresql)
        (deselected if only is not None and backend not in (None, only) else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Skipped here rather than in the fixture so that pytest reports every such skip at this one
    # location: one summary line saying how to enable them, not one line per test.
    if configured_url() is None and item.get_closest_marker("postgresql") is not None:
        raise pytest.skip.Exception(HOW_TO_ENABLE)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    url = configured_url()
    if url is None:
        pytest.skip(HOW_TO_ENABLE)
    server = PostgresServer(url)
    try:
        server.check_reachable()
    except OperationalError as error:
        server.dispose()
        pytest.fail(unreachable_message(url, error), pytrace=False)
    yield server
    server.dispose()


def _observed(engine: Engine) -> bool:
    """Whether an event listener was ever added to ``engine`` or its dialect (SQLAlchemy keeps
    ``_has_events`` set after ``event.remove``; the store's fast path is then off on it)."""
    return bool(engine._has_events or engine.dialect._has_events)


@pytest.fixture(autouse=True)
def _shared_engine_left_unobserved(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that adds an event listener to the shared engine: the store's fast path (and
    with it the one-statement cycle) would be off for every later test of this process on it.
    A test that listens uses ``private_engine``."""
    if "postgres_server" not in request.fixturenames:
        yield
        return
    engine = request.getfixturevalue("postgres_server").engine
    observed_before = _observed(engine)
    yield
    if not observed_before and _observed(engine):
        pytest.fail("this test added an event listener to the shared engine: use private_engine")


@pytest.fixture
def private_engine(postgres_server: PostgresServer) -> Iterator[Engine]:
    """An engine on the test run's database of this test's own, for a test that adds event
    listeners (never to the shared one: see ``_shared_engine_left_unobserved``)."""
    engine = create_engine(postgres_server.url, poolclass=NullPool)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def pg_engine(postgres_server: PostgresServer) -> Engine:
    return postgres_server.engine


@pytest.fixture
def pg_schema(postgres_server: PostgresServer) -> Iterator[str]:
    name = unique_name("t_schema")
    yield name
    postgres_server.drop_schema(name)


@pytest.fixture
def pg_database(postgres_server: PostgresServer) -> Iterator[URL]:
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(url)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == SQLITE:
        engine = sqlite_engine(tmp_path / "backend.sqlite")
        yield Backend(SQLITE, engine, "main")
        engine.dispose()
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    schema = unique_name("t_schema")
    yield Backend(POSTGRESQL, server.engine, schema)
    server.drop_schema(schema)


@pytest.fixture(params=BACKENDS)
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorePlace]:
    """Where a behavioural test's store lives: ``kernel.sqlite`` in ``tmp_path``, or a fresh
    PostgreSQL schema (dropped afterwards). See ``store_places.py``."""
    if request.param == SQLITE:
        yield SqliteFilePlace(tmp_path / "kernel.sqlite")
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    schema: str = request.getfixturevalue("shared_pg_schema")
    server.empty_scheduler_tables(schema)
    yield PostgresSchemaPlace(server, schema)


@pytest.fixture(scope="session")
def shared_pg_schema(postgres_server: PostgresServer) -> Iterator[str]:
    """One v6 scheduler schema for the session's ``place`` tests, emptied before each of them
    (creating a schema costs far more than emptying one)."""
    schema = unique_name("t_places")
    open_store(postgres_server.engine, schema=schema, clock=lambda: T0).close()
    yield schema
    postgres_server.drop_schema(schema)


@pytest.fixture(scope="session")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    installed = install_wheel(tmp_path_factory.mktemp("wheel"))
    installed.check()
    return installed
