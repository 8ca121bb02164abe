"""``scheduler dashboard``: serve the web dashboard with uvicorn until SIGTERM/SIGINT (exit 0)."""

from __future__ import annotations

import ipaddress
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Final

import typer

from scheduler.cli.common import (
    EXIT_USAGE,
    CliFailure,
    DbOption,
    command,
    describe_target,
    require_database,
    resolve_target,
    write_store,
)

TOKEN_ENV: Final = "SCHEDULER_DASHBOARD_TOKEN"


def is_loopback(host: str) -> bool:
    """``127.0.0.1``, ``::1``, any ``127.x.y.z`` or ``localhost``: only this machine can connect."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@contextmanager
def _signals_end_the_run() -> Iterator[None]:
    """SIGTERM/SIGINT end the server and then the command with exit 0: uvicorn handles the first
    signal and, once stopped, raises it again for the handler it found, which is this no-op one
    (Python's own would turn SIGINT into KeyboardInterrupt and SIGTERM would kill the process)."""
    previous = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    for number in previous:
        signal.signal(number, lambda *_: None)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@command
def dashboard_command(
    db: DbOption = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on; anything but loopback needs --token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")] = 8787,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Show everything, act on nothing (every POST is refused).")
    ] = False,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar=TOKEN_ENV,
            help="Require this token on every request (Bearer header, or ?token= once). "
            f"Default: ${TOKEN_ENV}.",
            show_default=False,
        ),
    ] = None,
    root_path: Annotated[
        str, typer.Option("--root-path", help="Path prefix a reverse proxy serves the dashboard under.")
    ] = "",
) -> None:
    """Serve the web dashboard (overview, runs, jobs, dead letters, adjudication, paused runs,
    workers, and actions on them) until SIGTERM or SIGINT.

    It listens on 127.0.0.1 unless --host says otherwise; a non-loopback address refuses to start
    without --token (exit 2). The database must exist: the dashboard never creates one.
    """
    if token is not None and not token.strip():
        raise CliFailure("--token must not be empty", exit_code=EXIT_USAGE, code="CLI_USAGE")
    if not is_loopback(host) and token is None:
        raise CliFailure(
            f"--host {host} is reachable from other machines: give --token (or ${TOKEN_ENV}), "
            "or listen on 127.0.0.1",
            exit_code=EXIT_USAGE,
            code="CLI_USAGE",
        )
    if root_path and (not root_path.startswith("/") or root_path.endswith("/")):
        raise CliFailure(
            "--root-path must start with / and not end with /", exit_code=EXIT_USAGE, code="CLI_USAGE"
        )
    try:
        import uvicorn

        from scheduler.dashboard.app import create_app
        from scheduler.dashboard.security import LOOPBACK_HOSTS
    except ImportError as error:
        raise CliFailure(
            f'the dashboard needs its extra: pip install "scheduler-kernel[dashboard]" ({error})'
        ) from error
    require_database(db)
    with write_store(db) as store:
        allowed = None if token is not None else LOOPBACK_HOSTS
        app = create_app(store, read_only, token, allowed_hosts=allowed)
        shown = f"[{host}]" if ":" in host else host
        mode = " (read-only)" if read_only else ""
        where = describe_target(resolve_target(db))
        typer.echo(f"scheduler dashboard of {where}{mode}: http://{shown}:{port}{root_path}/", err=True)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            root_path=root_path,
            log_level="warning",
            proxy_headers=False,
            server_header=False,
            lifespan="off",
        )
        with _signals_end_the_run():
            uvicorn.Server(config).run()  # returns on SIGTERM/SIGINT; exits 1 if it cannot listen
