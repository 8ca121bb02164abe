"""The web dashboard (API §11): see and act on a scheduler database in a browser.

Needs the optional extra: ``pip install "scheduler-kernel[dashboard]"`` (Starlette, Jinja2, uvicorn).

```python
from scheduler.dashboard import create_app
app = create_app(store)                       # an ASGI application
host.mount("/scheduler", create_app(tasks))   # inside a FastAPI/Starlette application
```

``scheduler dashboard --db URL`` serves it with uvicorn (127.0.0.1:8787 by default).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.applications import Starlette

EXTRA_HINT = 'the dashboard needs its extra: pip install "scheduler-kernel[dashboard]"'


def create_app(
    store_or_tasks: Any,
    read_only: bool = False,
    token: str | None = None,
    *,
    allowed_hosts: Iterable[str] | None = None,
    secret: bytes | None = None,
    refresh_ms: int = 5_000,
) -> Starlette:
    """The dashboard as an ASGI application (API §11).

    ``store_or_tasks``: an open ``SchedulerStore`` or a ``Tasks`` object (its store is used).
    ``read_only``: no action buttons, and every POST is refused with 403.
    ``token``: when set, every request needs ``Authorization: Bearer <token>`` or a session cookie
    obtained by visiting once with ``?token=<token>``; else 401.
    ``allowed_hosts``: host names the ``Host`` header may name (``None``: any; the CLI passes the
    loopback names when it runs without a token).
    ``secret``: the key that signs session cookies and CSRF tokens (default: derived from the
    token, else random per application — give one when several processes serve the dashboard
    without a token).
    ``refresh_ms``: how often the pages refresh their figures.

    Raises ``ImportError`` naming the extra when Starlette or Jinja2 is not installed, and
    ``SCHEDULER_INVALID_ARGUMENT`` for a bad argument.

    Mount it in a host with ``Mount("/scheduler", app=create_app(store))``; links follow the mount.
    """
    try:
        from scheduler.dashboard.app import create_app as build
    except ImportError as error:  # starlette or jinja2 missing
        raise ImportError(f"{EXTRA_HINT} ({error})") from error
    return build(
        store_or_tasks,
        read_only,
        token,
        allowed_hosts=allowed_hosts,
        secret=secret,
        refresh_ms=refresh_ms,
    )


__all__ = ["create_app"]
