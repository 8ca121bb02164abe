"""A small TCP proxy in front of the test PostgreSQL server that the test controls.

It forwards bytes both ways. Armed with a ``fault``, it acts on the next COMMIT a client sends
(psycopg sends it as a simple ``Query`` message; the store's named statements send it at the end
of the query that carries the transaction's last writes):

* ``"lose_during_commit"``: forward the COMMIT, swallow the server's answer and close both sides
  (the transaction committed; the client cannot know);
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
COMMIT_AT_END = b"; COMMIT\x00"
"""The end of a simple query whose last statement is the COMMIT (the store's named statements send
the transaction's last writes and its COMMIT as one query)."""


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
        """Stop accepting connections: a new one is refused (``ECONNREFUSED``) from now on.

        (Closing alone would not wake the thread blocked in ``accept``, which would take one
        more connection.)"""
        self._stopped = True
        with suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    # ------------------------------------------------------------------ forwarding

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            pair = _Pair(client, socket.create_connection(self.target))
            threading.Thread(target=self._to_client, args=(pair,), daemon=True).start()
            threading.Thread(target=self._to_server, args=(pair,), daemon=True).start()

    def _to_client(self, pair: _Pair) -> None:
        """Server → client; once a COMMIT is to be lost, its answer is swallowed and both ends closed."""
        try:
            while data := pair.server.recv(65536):
                if pair.swallow.is_set():
                    break
                pair.client.sendall(data)
        except OSError:
            pass
        finally:
            pair.close()

    def _to_server(self, pair: _Pair) -> None:
        """Client → server, watching for the COMMIT an armed fault acts on."""
        try:
            while data := pair.client.recv(65536):
                if self.fault and (COMMIT_MESSAGE in data or COMMIT_AT_END in data) and self._act(pair):
                    if pair.swallow.is_set():
                        pair.server.sendall(data)  # the server commits; the answer is lost
                        continue
                    break
                pair.server.sendall(data)
        except OSError:
            pass
        finally:
            if not pair.swallow.is_set():
                pair.close()

    def _act(self, pair: _Pair) -> bool:
        """Apply the armed fault to a COMMIT; True when the connection is to be lost."""
        fault, self.fault = self.fault, None
        pid, xid = self._backend(pair.server.getsockname()[1])
        if xid is not None:
            self.xids.append(xid)
        self.acted.set()
        if fault == "terminate_before_commit":
            self._terminate(pid)
            return False  # forward the COMMIT to the dying backend
        if fault == "lose_during_commit":
            pair.swallow.set()
        return True

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


class _Pair:
    """One client connection and its server connection."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.swallow = threading.Event()

    def close(self) -> None:
        for end in (self.client, self.server):
            with suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                end.close()


def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
