"""The application of the Tasks process tests: ``APP`` is its module's source (``app_module.py``,
run by ``scheduler worker app_module:tasks`` on the database its environment names);
:func:`make_app` builds the same ``Tasks`` object in any process; :func:`run_app_worker` and
:func:`register_app` are what forked test processes run. Imports nothing but the library, so
forked processes start at once."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Final

from scheduler import Tasks

APP: Final = textwrap.dedent(
    """
    import os
    import time

    from scheduler import RetryPolicy, Tasks


    def make(url, schema=None, cap=3, attempts=3):
        tasks = Tasks(url, schema=schema or None, queues={"critical": {}, "capped": {"concurrency": cap}})

        @tasks.task(name="app.slow", queue="capped", max_attempts=attempts)
        def slow(index, seconds=0.2):
            time.sleep(seconds)
            return {"index": index, "pid": os.getpid()}

        @tasks.task(name="app.urgent", queue="critical", retry=RetryPolicy(base_ms=10, max_ms=10))
        def urgent(text):
            return text.upper()

        return tasks


    environ = os.environ
    tasks = None if "TASKS_TEST_URL" not in environ else make(
        environ["TASKS_TEST_URL"],
        environ.get("TASKS_TEST_SCHEMA"),
        int(environ.get("TASKS_TEST_CAP", "3")),
        int(environ.get("TASKS_TEST_ATTEMPTS", "3")),
    )
    """
)
"""The application module (``app_module.py``): ``make(url, schema, cap, attempts)`` and, when the
environment names a database (``TASKS_TEST_URL``), ``tasks = make(...)`` on it."""


def app_home(directory: Path) -> Path:
    """``directory`` holding the application module (``app_module.py``), as a user's project would."""
    (directory / "app_module.py").write_text(APP)
    return directory


def make_app(target: str, schema: str | None = None, **options: Any) -> Tasks:
    """``APP``'s ``make(target, schema, cap=…, attempts=…)`` in this process."""
    namespace: dict[str, Any] = {"__name__": "app_module"}
    exec(compile(APP, "app_module.py", "exec"), namespace)
    tasks: Tasks = namespace["make"](target, schema, **options)
    return tasks


def run_app_worker(
    target: str,
    schema: str | None,
    cap: int,
    lease_ms: int = 30_000,
    attempts: int = 3,
    started: Any = None,
) -> None:
    """A worker process: ``make_app(...).worker(concurrency=2)`` until SIGTERM; ``started`` (an
    event) is set once its store is open and its tasks registered."""
    tasks = make_app(target, schema, cap=cap, attempts=attempts)
    worker = tasks.worker(concurrency=2, lease_ms=lease_ms, poll_min_ms=5, poll_max_ms=50)
    tasks.register(worker.store)
    if started is not None:
        started.set()
    worker.run()


def register_app(target: str, schema: str | None, attempts: int, barrier: Any, results: Any) -> None:
    """A registration process: once every process is at ``barrier``, ``register()``; put
    ``{job id: [revision, max_attempts]}`` on ``results``."""
    tasks = make_app(target, schema, attempts=attempts)
    barrier.wait(60)
    jobs = tasks.register()
    results.put({job.id: [job.revision, job.max_attempts] for job in jobs})
    tasks.close()
