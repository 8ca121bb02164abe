"""Storage failures on the real PostgreSQL server (API §8): each is SCHEDULER_STORAGE_UNAVAILABLE
with the SQLSTATE (or CONNECTION_LOST), a truthful commitState and retryable, and the store
works again on its next call (reconnecting after a lost connection).

Lost connections go through :class:`pg_proxy.PgProxy`, a socket proxy the test controls; whether
a transaction the client could not hear about committed is checked with ``pg_xact_status``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pg_proxy import PgProxy, wait_until, xact_status
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from scheduler import SchedulerKernelError, SchedulerStore, open_store
from scheduler.schema.target import quote_identifier

T0 = 1767225600000
AUTHORITY = {"principal": {"type": "user", "id": "u"}, "workspaceId": "ws", "requestedCapabilities": ["a"]}


def retryable(storage_code: str) -> dict[str, Any]:
    """The details of a failure that provably changed nothing in the store's own transaction."""
    return {"phase": "write", "storageCode": storage_code, "commitState": "not_committed", "retryable": True}


def storage_error(call: Callable[[], Any]) -> dict[str, Any]:
    with pytest.raises(SchedulerKernelError) as caught:
        call()
    assert caught.value.code == "SCHEDULER_STORAGE_UNAVAILABLE", caught.value
    details: dict[str, Any] = caught.value.details
    return details


def backend_pid(store: SchedulerStore) -> int:
    pid = int(store.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
    store.connection.rollback()
    return pid


def waiting_on_a_lock(engine: Engine, pid: int) -> bool:
    with engine.connect() as connection:
        query = text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid")
        return connection.execute(query, {"pid": pid}).scalar() == "Lock"


@pytest.fixture
def store(pg_engine: Engine, pg_schema: str) -> Iterator[SchedulerStore]:
    with open_store(pg_engine, schema=pg_schema, clock=lambda: T0, busy_timeout_ms=60_000) as opened:
        opened.create_job(id="job-1", kind="email", authority=AUTHORITY)
        yield opened


@pytest.fixture
def proxy(pg_engine: Engine) -> Iterator[PgProxy]:
    running = PgProxy(pg_engine)
    yield running
    running.close()


def hold_job_row(pg_engine: Engine, schema: str) -> Any:
    """A second connection holding job-1's row lock until it rolls back."""
    holder = pg_engine.connect()
    holder.exec_driver_sql(f"SELECT 1 FROM {quote_identifier(schema)}.jobs WHERE job_id = 'job-1' FOR UPDATE")
    return holder


def test_lock_timeout_is_55P03_and_retryable(pg_engine: Engine, pg_schema: str) -> None:
    with open_store(pg_engine, schema=pg_schema, clock=lambda: T0, busy_timeout_ms=100) as store:
        store.create_job(id="job-1", kind="email", authority=AUTHORITY)
        holder = hold_job_row(pg_engine, pg_schema)
        try:
            details = storage_error(lambda: store.update_job("job-1", 1, payload={"n": 1}))
        finally:
            holder.close()
        assert details == retryable("55P03")
        assert store.update_job("job-1", 1, payload={"n": 1}).revision == 2


def test_a_commit_the_server_refuses_committed_nothing_and_is_retryable(
    pg_engine: Engine, pg_schema: str
) -> None:
    """A COMMIT the server answers with an error has rolled the transaction back: here a deferred
    trigger waits at COMMIT for a row another transaction holds, as a NOTIFY's COMMIT waits for
    the notification queue's lock, until the lock timeout."""
    schema, gate = quote_identifier(pg_schema), quote_identifier(f"{pg_schema}_gate")
    with open_store(pg_engine, schema=pg_schema, clock=lambda: T0, busy_timeout_ms=100) as store:
        with pg_engine.begin() as connection:
            for statement in (
                f"CREATE SCHEMA {gate}",
                f"CREATE TABLE {gate}.gate (id integer PRIMARY KEY)",
                f"INSERT INTO {gate}.gate VALUES (1)",
                f"CREATE FUNCTION {gate}.wait() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN PERFORM 1 FROM {gate}.gate WHERE id = 1 FOR UPDATE; RETURN NULL; END $$",
                f"CREATE CONSTRAINT TRIGGER wait_at_commit AFTER INSERT ON {schema}.jobs "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {gate}.wait()",
            ):
                connection.exec_driver_sql(statement)
        holder = pg_engine.connect()
        try:
            holder.exec_driver_sql(f"SELECT 1 FROM {gate}.gate WHERE id = 1 FOR UPDATE")
            details = storage_error(lambda: store.create_job(id="job-1", kind="email", authority=AUTHORITY))
        finally:
            holder.rollback()
            holder.close()
        try:
            assert details == retryable("55P03")
            assert store.get_job("job-1") is None
            assert store.create_job(id="job-1", kind="email", authority=AUTHORITY).revision == 1
            holder = pg_engine.connect()
            holder.exec_driver_sql(f"SELECT 1 FROM {gate}.gate WHERE id = 1 FOR UPDATE")
            with pytest.raises(SchedulerKernelError) as block, store.transaction() as tx:  # its COMMIT
                tx.create_job(id="job-2", kind="email", authority=AUTHORITY)
            holder.rollback()
            holder.close()
            assert block.value.details == {
                "phase": "commit",
                "storageCode": "55P03",
                "commitState": "not_committed",
                "retryable": False,  # the block's work is the caller's to run again
            }
            assert store.get_job("job-2") is None
        finally:
            with pg_engine.begin() as connection:
                connection.exec_driver_sql(f"DROP TRIGGER wait_at_commit ON {schema}.jobs")
                connection.exec_driver_sql(f"DROP SCHEMA {gate} CASCADE")


def test_statement_cancel_is_57014_and_retryable(
    store: SchedulerStore, pg_engine: Engine, pg_schema: str
) -> None:
    pid = backend_pid(store)
    holder = hold_job_row(pg_engine, pg_schema)
    outcome: dict[str, Any] = {}

    def update() -> None:
        outcome.update(storage_error(lambda: store.update_job("job-1", 1, payload={"n": 1})))

    worker = threading.Thread(target=update)
    worker.start()
    try:
        wait_until(lambda: waiting_on_a_lock(pg_engine, pid))
        with pg_engine.connect() as connection:
            connection.exec_driver_sql("SELECT pg_cancel_backend(%s)", (pid,))
        worker.join(30)
    finally:
        holder.close()
    assert outcome == retryable("57014")
    assert store.update_job("job-1", 1, payload={"n": 1}).revision == 2


def test_deadlock_is_40P01_and_retryable(store: SchedulerStore, pg_engine: Engine, pg_schema: str) -> None:
    """once-per-trigger holds the job row, then waits for the enqueue key another transaction
    holds while it waits for the job row: the server breaks the cycle in the store's call."""
    from scheduler.backends.postgresql.backend import key_space
    from scheduler.store.capabilities.occurrences import ENQUEUE_LOCKS

    pid = backend_pid(store)
    store.connection.exec_driver_sql("SET deadlock_timeout = '50ms'")
    store.connection.commit()
    other = pg_engine.connect()
    other.exec_driver_sql("SET deadlock_timeout = '10s'")
    key = f"job-1\x1f{T0}\x1ftick"
    other.exec_driver_sql(
        "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (key_space(pg_schema, ENQUEUE_LOCKS), key)
    )
    outcome: dict[str, Any] = {}

    def enqueue() -> None:
        call = lambda: store.enqueue_occurrence_once_per_trigger(  # noqa: E731
            job_id="job-1", scheduled_for=T0, trigger_key="tick"
        )
        outcome.update(storage_error(call))

    worker = threading.Thread(target=enqueue)
    worker.start()
    try:
        wait_until(lambda: waiting_on_a_lock(pg_engine, pid))
        blocked = threading.Thread(
            target=lambda: other.exec_driver_sql(
                f"SELECT 1 FROM {quote_identifier(pg_schema)}.jobs WHERE job_id = 'job-1' FOR UPDATE"
            )
        )
        blocked.start()
        worker.join(30)
        blocked.join(30)
    finally:
        other.close()
    assert outcome == retryable("40P01")
    assert store.enqueue_occurrence_once_per_trigger(job_id="job-1", scheduled_for=T0, trigger_key="tick")


def test_serialization_failure_is_40001_and_not_retryable_in_the_callers_transaction(
    store: SchedulerStore, pg_engine: Engine, pg_schema: str
) -> None:
    caller = pg_engine.connect().execution_options(isolation_level="SERIALIZABLE")
    try:
        with caller.begin():
            tx_store = SchedulerStore.on_connection(caller, schema=pg_schema, clock=lambda: T0)
            assert tx_store.get_job("job-1") is not None  # the snapshot is taken
            store.update_job("job-1", 1, payload={"n": 1})  # another transaction commits meanwhile
            details = storage_error(lambda: tx_store.update_job("job-1", 1, payload={"n": 2}))
            assert details == {
                "phase": "write",
                "storageCode": "40001",
                "commitState": "not_committed",
                "retryable": False,
            }
            caller.rollback()
    finally:
        caller.close()


def test_terminated_backend_between_calls_is_retryable_and_the_store_reconnects(
    store: SchedulerStore, pg_engine: Engine
) -> None:
    pid = backend_pid(store)
    with pg_engine.connect() as connection:
        connection.exec_driver_sql("SELECT pg_terminate_backend(%s, 10000)", (pid,))
    details = storage_error(lambda: store.update_job("job-1", 1, payload={"n": 1}))
    assert details["storageCode"] in ("57P01", "CONNECTION_LOST")
    assert details["commitState"] == "not_committed" and details["retryable"] is True
    assert store.update_job("job-1", 1, payload={"n": 1}).revision == 2  # a new connection
    assert backend_pid(store) != pid


def test_terminated_backend_at_commit_is_unknown(proxy: PgProxy, pg_engine: Engine, pg_schema: str) -> None:
    with open_store(proxy.url(), schema=pg_schema, clock=lambda: T0) as store:
        proxy.arm("terminate_before_commit")
        details = storage_error(lambda: store.create_job(id="job-1", kind="email", authority=AUTHORITY))
        assert details["storageCode"] in ("57P01", "CONNECTION_LOST")
        assert details["commitState"] == "unknown" and details["retryable"] is False
        assert xact_status(pg_engine, proxy.xids[-1]) == "aborted"
        assert store.get_job("job-1") is None  # reconnected; the write did not happen


def test_connection_lost_during_commit_is_unknown_and_may_have_committed(
    proxy: PgProxy, pg_engine: Engine, pg_schema: str
) -> None:
    with open_store(proxy.url(), schema=pg_schema, clock=lambda: T0) as store:
        proxy.arm("lose_during_commit")
        details = storage_error(lambda: store.create_job(id="job-1", kind="email", authority=AUTHORITY))
        assert details == {
            "phase": "write",
            "storageCode": "CONNECTION_LOST",
            "commitState": "unknown",
            "retryable": False,
        }
        assert xact_status(pg_engine, proxy.xids[-1]) == "committed"
        assert store.get_job("job-1") is not None  # reconnected: the write is there


def test_connection_lost_before_commit_reached_the_server(
    proxy: PgProxy, pg_engine: Engine, pg_schema: str
) -> None:
    with open_store(proxy.url(), schema=pg_schema, clock=lambda: T0) as store:
        proxy.arm("lose_before_commit")
        details = storage_error(lambda: store.create_job(id="job-1", kind="email", authority=AUTHORITY))
        assert details["storageCode"] == "CONNECTION_LOST"
        assert details["commitState"] == "unknown" and details["retryable"] is False  # raised by COMMIT
        wait_until(lambda: xact_status(pg_engine, proxy.xids[-1]) == "aborted")
        assert store.get_job("job-1") is None
        assert store.create_job(id="job-1", kind="email", authority=AUTHORITY).revision == 1


def test_an_unreachable_server_after_a_lost_connection_is_classified_on_every_call(
    proxy: PgProxy, pg_engine: Engine, pg_schema: str
) -> None:
    """The failed call's rollback checked the driver's state, which reconnected: the reconnect's
    ``OperationalError`` escaped bare (only the next call was classified)."""
    with open_store(proxy.url(), schema=pg_schema, clock=lambda: T0) as store:
        store.create_job(id="job-1", kind="email", authority=AUTHORITY)
        pid = backend_pid(store)
        proxy.close()  # new connections are refused from now on
        with pg_engine.connect() as connection:
            connection.exec_driver_sql("SELECT pg_terminate_backend(%s, 10000)", (pid,))
        first = storage_error(lambda: store.get_job("job-1"))
        assert first["storageCode"] in ("57P01", "CONNECTION_LOST")
        assert first["commitState"] == "not_committed" and first["retryable"] is True
        for call in (lambda: store.get_job("job-1"), lambda: store.update_job("job-1", 1, payload={})):
            assert storage_error(call) == retryable("CONNECTION_LOST")
        with pytest.raises(SchedulerKernelError) as caught, store.transaction():
            pass
        assert caught.value.details == retryable("CONNECTION_LOST")


def test_a_callers_aborted_transaction_is_25P02_and_must_be_rolled_back(
    store: SchedulerStore, pg_engine: Engine, pg_schema: str
) -> None:
    with pg_engine.connect() as caller:
        caller.begin()
        with pytest.raises(DBAPIError):  # the caller's own statement fails: its transaction is aborted
            caller.exec_driver_sql("SELECT 1 / 0")
        tx_store = SchedulerStore.on_connection(caller, schema=pg_schema, clock=lambda: T0)
        for call, phase in (
            (lambda: tx_store.create_job(id="job-2", kind="email", authority=AUTHORITY), "write"),
            (lambda: tx_store.get_job("job-1"), "read"),
        ):
            with pytest.raises(SchedulerKernelError) as caught:
                call()
            assert caught.value.code == "SCHEDULER_STORAGE_UNAVAILABLE"
            assert caught.value.details == {
                "phase": phase,
                "storageCode": "25P02",
                "commitState": "not_committed",
                "retryable": False,
            }
            assert "caller's transaction is aborted" in caught.value.message
            assert "roll it back" in caught.value.message
        caller.rollback()
        assert tx_store.get_job("job-1") is not None  # usable again once rolled back


_LISTENING_PROCESS = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
from scheduler import SchedulerKernelError, open_store
from scheduler.worker import ListenWaker

store = open_store(sys.argv[1], schema=sys.argv[2])
waker = ListenWaker(store)
waker.start()
assert waker.wait_listening(30)
print("ready", flush=True)
while sys.stdin.readline().strip() == "call":
    try:
        store.get_job("job-1")
        print("no error", flush=True)
    except SchedulerKernelError as error:
        store.get_job("job-1")  # the store connects again
        print(error.code, error.details["storageCode"], flush=True)
waker.close()
store.close()
print("closed", flush=True)
"""


def test_killed_backends_print_no_pool_traceback(postgres_server: Any, pg_schema: str) -> None:
    """Every backend of a process with a store and a ``ListenWaker`` (a worker's connections) is
    terminated, twice: the store's next call raises the classified error, the listener logs one
    ``scheduler.worker`` warning and listens again, and nothing else reaches stderr. (SQLAlchemy's
    pool used to log "Exception during reset or similar" with a traceback at ERROR for the
    listener's dead connection.)"""
    import subprocess
    import sys
    from pathlib import Path

    name = f"scheduler-kill-{pg_schema}"
    url = postgres_server.url.update_query_dict({"application_name": name})
    engine = postgres_server.engine
    child = subprocess.Popen(
        [sys.executable, "-c", _LISTENING_PROCESS, url.render_as_string(hide_password=False), pg_schema],
        cwd=Path(__file__).resolve().parents[3],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None

    def listeners() -> set[int]:
        with engine.connect() as connection:
            query = text(
                "SELECT pid FROM pg_stat_activity WHERE application_name = :name AND query LIKE 'LISTEN %'"
            )
            return set(connection.execute(query, {"name": name}).scalars())

    try:
        assert child.stdout.readline().strip() == "ready"
        answers = []
        for _ in range(2):
            before = listeners()
            assert before
            with engine.connect() as connection:
                terminate = "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                connection.execute(text(f"{terminate} WHERE application_name = :n"), {"n": name})
            child.stdin.write("call\n")
            child.stdin.flush()
            answers.append(child.stdout.readline().split()[0])
            wait_until(lambda before=before: bool(listeners() - before), timeout=30)  # listening again
        child.stdin.write("end\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    assert answers == ["SCHEDULER_STORAGE_UNAVAILABLE"] * 2
    assert out.strip() == "closed"
    assert "Traceback" not in err and "sqlalchemy" not in err, err
    lines = err.splitlines()
    assert lines and all(line.startswith("WARNING scheduler.worker: LISTEN ") for line in lines), err
