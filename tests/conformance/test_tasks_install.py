"""Tasks as installed without the ``[async]`` extra: SQLAlchemy 2.1 no longer brings ``greenlet``,
so its asyncio layer cannot load. ``from scheduler import Tasks``, ``defer``, ``result()`` and
``scheduler worker MODULE:ATTR`` must work all the same, as real processes on a real SQLite file
and on the real PostgreSQL server; an async form says which extra to install, writing nothing.

API §10.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from process_support import start_python, stop_gracefully
from store_places import StorePlace
from task_app import APP
from tasks_support import app_environment, count

WITHOUT_GREENLET = textwrap.dedent(
    """
    import os
    import runpy
    import sys

    sys.modules["greenlet"] = None  # import greenlet fails: as without scheduler-kernel[async]
    sys.path.insert(0, os.getcwd())
    if sys.argv[1] == "-m":
        sys.argv = [sys.argv[2], *sys.argv[3:]]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
    """
)

CLIENT = textwrap.dedent(
    """
    import asyncio
    import sys

    from app_module import tasks
    from scheduler import SchedulerKernelError

    run = tasks["app.urgent"].defer("hello")
    print(run.result(timeout_s=30))
    print("sqlalchemy.ext.asyncio" in sys.modules)
    try:
        asyncio.run(tasks["app.urgent"].defer_async("async"))
    except SchedulerKernelError as error:
        print(error.code, "scheduler-kernel[async]" in error.message)
    """
)


def test_tasks_and_the_worker_command_work_without_the_async_extra(tmp_path: Path, place: StorePlace) -> None:
    (tmp_path / "app_module.py").write_text(APP)
    runner = tmp_path / "without_greenlet.py"
    runner.write_text(WITHOUT_GREENLET)
    (tmp_path / "client.py").write_text(CLIENT)
    environment = app_environment(place)
    worker = start_python(
        tmp_path,
        runner,
        "-m",
        "scheduler",
        "worker",
        "app_module:tasks",
        "--poll-max-ms",
        "50",
        environment=environment,
    )
    try:
        client = start_python(tmp_path, runner, "client.py", environment=environment)
        out, err = client.communicate(timeout=60)
    finally:
        code, worker_err = stop_gracefully(worker)
    assert client.returncode == 0, err[-3000:]
    assert out.splitlines() == ["HELLO", "False", "SCHEDULER_INVALID_ARGUMENT True"], err[-3000:]
    assert code == 0, worker_err[-3000:]
    assert count(place, "occurrences") == 1  # the refused defer_async wrote nothing
