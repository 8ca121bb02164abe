"""The web dashboard (API §11): see and act on a scheduler database in a browser.

Needs the optional extra: ``pip install "scheduler-kernel[dashboard]"`` (Starlette, Jinja2, uvicorn).

```python
from scheduler.dashboard import create_app
app = create_app(store)                       # an ASGI application
host.mount("/scheduler", create_app(tasks))   # inside a FastAPI/Starlette application
```

``scheduler dashboard --db URL`` serves it with uvicorn (127.0.0.1:8787 by default). The
application module is imported on first use of ``create_app``, so importing this package needs
none of the extra's libraries; without them ``create_app`` raises ``ImportError`` naming the extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.dashboard.app import create_app

EXTRA_HINT = 'the dashboard needs its extra: pip install "scheduler-kernel[dashboard]"'


def __getattr__(name: str) -> Any:
    if name != "create_app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from scheduler.dashboard.app import create_app
    except ImportError as error:  # starlette or jinja2 missing
        raise ImportError(f"{EXTRA_HINT} ({error})") from error
    return create_app


__all__ = ["create_app"]
