"""The framework recipes of docs/quickstart.md, served for real on SQLite and PostgreSQL
(``recipe_support.check_recipe``): ``examples/fastapi_app`` (uvicorn, async SQLAlchemy session,
``defer_async(connection=await session.connection())``) and ``examples/flask_app`` (Flask's
development server, Flask-SQLAlchemy, ``defer(connection=db.session.connection())``). On PostgreSQL
each gets a fresh database (the app's table in ``public``, the scheduler's in ``scheduler``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from backends import POSTGRESQL, SQLITE, PostgresServer
from cli_support import isolated_environment as isolated_environment
from recipe_support import EXAMPLES, Database, check_recipe

BACKENDS = [SQLITE, pytest.param(POSTGRESQL, marks=pytest.mark.postgresql)]


def database(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path, sqlite: str, postgresql: str
) -> Database:
    """The recipe's database: a file in ``tmp_path``, or a fresh PostgreSQL database; the app's
    URL uses the driver ``sqlite`` / ``postgresql`` names."""
    if backend == SQLITE:
        path = tmp_path / "shop.sqlite"
        return Database(f"{sqlite}:///{path}", str(path))
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = request.getfixturevalue("pg_database")
    assert isinstance(server, PostgresServer)
    return Database(
        url.set(drivername=postgresql).render_as_string(hide_password=False),
        url.render_as_string(hide_password=False),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_fastapi_recipe(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> None:
    where = database(request, backend, tmp_path, "sqlite+aiosqlite", "postgresql+asyncpg")
    uvicorn = ["-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port", "{port}"]
    check_recipe(EXAMPLES / "fastapi_app", uvicorn, where, tmp_path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_flask_recipe(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> None:
    where = database(request, backend, tmp_path, "sqlite", "postgresql+psycopg")
    flask = ["-m", "flask", "--app", "app", "run", "--host", "127.0.0.1", "--port", "{port}"]
    check_recipe(EXAMPLES / "flask_app", flask, where, tmp_path)
