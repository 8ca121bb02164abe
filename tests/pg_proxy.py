"""A small TCP proxy in front of the test PostgreSQL server that the test controls.

It forwards bytes both ways. Armed with a ``fault``, it acts on the next COMMIT a client sends
(psycopg sends it as a simple ``Query`` message):

* ``"lose_during_commit"``: forward the COMMIT, wait for the server's answer, then close both
  sides without passing the answer on (the transaction committed; the client cannot know);
* ``"lose_before_commit"``: close both sides instead of forwarding it (the server rolls back);
* ``"terminate_before_commit"``: have the server terminate the backend (``pg_terminate_backend``)
  and then forward the COMMIT (the client reads SQLSTATE 57P01 or a closed connection).

Before acting it records the transaction's id (``backend_xid`` of the client's backend, found
by the proxy's own client port in ``pg_stat_activity``) for ``pg_xact_status`` checks.
Everything stays on 127.0.0.1 and the proxy stops with the test.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import suppress
from typing import Any

from sqlalchemy import Engine

COMMIT_MESSAGE = b"Q\x00\x00\x00\x0bCOMMIT\x00"


class PgProxy:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine  # a direct connection to the server, for pg_stat_activity
        self.target = (engine.url.host or "127.0.0.1", engine.url.port or 5432)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.fault: str | None = None
        self.xids: list[int] = []
        self.acted = threading.Event()
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self) -> str:
        return self.engine.url.set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def arm(self, fault: str) -> None:
        self.acted.clear()
        self.fault = fault

    def close(self) -> None:
        self._stopped = True
        self.listener.close()

    # ------------------------------------------------------------------ forwarding

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(server, client, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(client, server, server), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, server: socket.socket | None) -> None:
        """Copy ``source`` to ``sink``; client→server copies (``server`` given) watch for COMMIT."""
        try:
            while data := source.recv(65536):
                watching = server is not None and self.fault and COMMIT_MESSAGE in data
                if watching and server is not None and self._act(data, source, server):
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with suppress(OSError):
                    end.close()

    def _act(self, data: bytes, client: socket.socket, server: socket.socket) -> bool:
        """Apply the armed fault to a COMMIT; True when the connection is gone."""
        fault, self.fault = self.fault, None
        pid, xid = self._backend(server.getsockname()[1])
        if xid is not None:
            self.xids.append(xid)
        try:
            if fault == "lose_before_commit":
                return _close(client, server)
            if fault == "terminate_before_commit":
                self._terminate(pid)
                return False  # forward the COMMIT to the dying backend
            server.sendall(data)  # lose_during_commit
            server.settimeout(10)
            server.recv(65536)  # the server's answer: CommandComplete + ReadyForQuery
            return _close(client, server)
        finally:
            self.acted.set()

    def _backend(self, client_port: int) -> tuple[int, int | None]:
        with self.engine.connect() as connection:
            row = connection.exec_driver_sql(
                "SELECT pid, backend_xid::text::bigint FROM pg_stat_activity WHERE client_port = %s",
                (client_port,),
            ).one()
            return int(row[0]), None if row[1] is None else int(row[1])

    def _terminate(self, pid: int) -> None:
        with self.engine.connect() as connection:
            connection.exec_driver_sql("SELECT pg_terminate_backend(%s, 10000)", (pid,))
            connection.commit()


def xact_status(engine: Engine, xid: int) -> str | None:
    """``pg_xact_status`` of a 32-bit transaction id of the current epoch."""
    with engine.connect() as connection:
        epoch = int(
            connection.exec_driver_sql("SELECT pg_current_xact_id()::text::bigint >> 32").scalar_one()
        )
        full = (epoch << 32) | xid
        status: Any = connection.exec_driver_sql(
            "SELECT pg_xact_status(%s::text::xid8)", (str(full),)
        ).scalar_one()
        connection.rollback()
        return None if status is None else str(status)


def _close(*ends: socket.socket) -> bool:
    for end in ends:
        with suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)
        with suppress(OSError):
            end.close()
    return True


def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
