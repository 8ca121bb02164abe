"""``scheduler worker MODULE:ATTR --db URL`` on PostgreSQL without ``--schema`` serves the schema
of the ``Tasks`` object it is given, not the default ``scheduler`` (the rest of the ``Tasks``
worker processes, on both backends: ``tests/conformance/test_tasks_processes.py``). API §10.
"""

from __future__ import annotations

from pathlib import Path

from process_support import start_scheduler, stop_gracefully
from sqlalchemy import create_engine
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool
from task_app import app_home, make_app


def test_a_worker_given_only_db_serves_the_schema_of_its_tasks_object(
    tmp_path: Path, pg_database: URL
) -> None:
    """``scheduler worker app:tasks --db URL`` without ``--schema``: the schema is the ``Tasks``
    object's (``Tasks(url, schema="shop")``), not the default ``scheduler``."""
    home = app_home(tmp_path)
    url = pg_database.render_as_string(hide_password=False)
    environment = {"TASKS_TEST_URL": url, "TASKS_TEST_SCHEMA": "shop"}
    worker = start_scheduler(
        home, "worker", "app_module:tasks", "--db", url, "--poll-max-ms", "50", environment=environment
    )
    try:
        with make_app(url, "shop") as tasks:
            assert tasks["app.urgent"].defer("hello").result(timeout_s=30) == "HELLO"
    finally:
        code, stderr = stop_gracefully(worker)
    assert code == 0, stderr[-2000:]
    engine = create_engine(pg_database, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            schemas = connection.exec_driver_sql(
                "SELECT schema_name FROM information_schema.schemata"
                " WHERE schema_name IN ('shop', 'scheduler')"
            )
            assert sorted(row[0] for row in schemas) == ["shop"]
    finally:
        engine.dispose()
