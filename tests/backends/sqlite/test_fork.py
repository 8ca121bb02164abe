"""A store opened before os.fork() is unusable in the child, and the child never touches the
inherited SQLite connection — not in calls, not in close(), not at garbage collection or
interpreter exit (issue 15, item 5). Real forks, in a fresh interpreter (so the child's exit is
a normal interpreter shutdown, not the test runner's); the parent keeps working.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hardening_support import new_store, orphan_occurrences, python_argv, raw_rows

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")

PRELUDE = """
import gc, json, os, sys
from sqlalchemy import create_engine, event
from scheduler import SchedulerKernelError, SchedulerStore, open_store
T0 = 1767225600000
PATH = sys.argv[1]

def requests(prefix, count):
    return [{"job_id": "job-a", "scheduled_for": T0, "trigger_key": f"{prefix}-{i}"} for i in range(count)]

def refusal(call):
    try:
        call()
    except SchedulerKernelError as error:
        return {"code": error.code, "details": error.details}
    except BaseException as error:
        return {"bare": repr(error)}
    return {"returned": True}

def fork_and_wait(child):
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            report = child()
        except BaseException as error:
            report = {"crashed": repr(error)}
        os.write(write_fd, json.dumps(report).encode())
        os.close(write_fd)
        sys.exit(0)  # normal interpreter shutdown: module teardown and garbage collection run
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        report = json.loads(pipe.read() or "{}")
    _, status = os.waitpid(pid, 0)
    report["exit"] = os.waitstatus_to_exitcode(status)
    return report
"""


def run_script(path: Path, body: str) -> dict[str, Any]:
    source = PRELUDE + textwrap.dedent(body)
    result = subprocess.run(
        [*python_argv(source), str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def test_every_call_from_the_child_is_refused_and_the_parent_is_unharmed(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    new_store(path).close()
    report = run_script(
        path,
        """
        store = open_store(PATH, clock=lambda: T0)
        store.enqueue_many(requests("parent", 3))

        def child():
            results = {
                "write": refusal(lambda: store.enqueue_many(requests("c", 1))),
                "read": refusal(lambda: store.get_job("job-a")),
                "batch": refusal(lambda: store.enqueue_many(requests("child", 2))),
                "block": refusal(lambda: store.transaction().__enter__()),
                "closed_before_close": store.closed,
                "close": refusal(store.close),
                "close_again": refusal(store.close),
            }
            results["after_close"] = refusal(lambda: store.get_job("job-a"))
            return results

        child_report = fork_and_wait(child)
        parent = {"closed": store.closed, "after": len(store.enqueue_many(requests("after", 5)))}
        store.close()
        print(json.dumps({"child": child_report, "parent": parent, "pid": os.getpid()}))
        """,
    )
    child, parent_pid = report["child"], report["pid"]
    assert child["exit"] == 0
    for name in ("write", "read", "batch", "block", "after_close"):
        assert child[name]["code"] == "SCHEDULER_STORE_CLOSED", child
        details = child[name]["details"]
        assert details["reason"] == "forked" and details["openedInPid"] == parent_pid
        assert details["pid"] != parent_pid
    assert child["closed_before_close"] is True
    assert child["close"] == child["close_again"] == {"returned": True}
    assert report["parent"] == {"closed": False, "after": 5}
    keys = [row[0] for row in raw_rows(path, "SELECT trigger_key FROM occurrences")]
    assert sorted(keys) == sorted([f"parent-{i}" for i in range(3)] + [f"after-{i}" for i in range(5)])
    assert raw_rows(path, "PRAGMA quick_check") == [("ok",)]
    assert orphan_occurrences(path) == []


def test_the_child_never_touches_the_inherited_connection(tmp_path: Path) -> None:
    """Pool events and the driver's statement trace, logged with the pid, show no activity of
    the child: not for its calls, close(), dropping the store, garbage collection, or exit."""
    path = tmp_path / "k.sqlite"
    new_store(path).close()
    log_path = tmp_path / "activity.log"
    report = run_script(
        path,
        f"""
        LOG = os.open({str(log_path)!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        def record(what, write=os.write, getpid=os.getpid):
            write(LOG, f"{{getpid()}} {{what}}\\n".encode())

        engine = create_engine(f"sqlite:///{{PATH}}")
        for name in ("checkin", "reset", "close", "invalidate", "close_detached", "detach"):
            event.listen(engine, name, lambda *args, name=name: record(name))
        holder = {{"store": open_store(engine, clock=lambda: T0)}}
        dbapi_connection = holder["store"].connection.connection.dbapi_connection
        dbapi_connection.set_trace_callback(lambda statement: record("sql " + statement.split()[0]))
        holder["store"].enqueue_many(requests("p", 2))

        def child():
            refusal(lambda: holder["store"].history())
            holder["store"].close()
            del holder["store"]
            gc.collect()
            return {{}}

        child_report = fork_and_wait(child)
        holder["store"].close()
        engine.dispose()
        print(json.dumps({{"child": child_report, "pid": os.getpid()}}))
        """,
    )
    assert report["child"]["exit"] == 0
    lines = log_path.read_text().splitlines()
    assert [line for line in lines if not line.startswith(f"{report['pid']} ")] == []
    assert f"{report['pid']} checkin" in lines  # the parent's own close() does release it


def test_a_store_opened_after_fork_works_in_the_child(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    new_store(path).close()
    report = run_script(
        path,
        """
        def child():
            with open_store(PATH, clock=lambda: T0) as store:
                occurrence = store.enqueue_occurrence(job_id="job-a", scheduled_for=T0, trigger_key="c")
                return {"deduplicated": occurrence.deduplicated}

        print(json.dumps(fork_and_wait(child)))
        """,
    )
    assert report == {"deduplicated": False, "exit": 0}
    assert raw_rows(path, "SELECT trigger_key FROM occurrences") == [("c",)]


def test_a_caller_connection_store_is_refused_in_the_child_too(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite"
    new_store(path).close()
    report = run_script(
        path,
        """
        engine = create_engine(f"sqlite:///{PATH}")
        with engine.connect() as connection:
            store = SchedulerStore.on_connection(connection, clock=lambda: T0)
            child = fork_and_wait(lambda: refusal(lambda: store.get_job("job-a")))
            parent = store.get_job("job-a") is not None
        engine.dispose()
        print(json.dumps({"child": child, "parent": parent}))
        """,
    )
    assert report["child"]["code"] == "SCHEDULER_STORE_CLOSED"
    assert report["child"]["details"]["reason"] == "forked"
    assert report["parent"] is True
