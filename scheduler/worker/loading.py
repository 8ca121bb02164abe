"""``MODULE:ATTR`` → the handlers mapping a ``scheduler worker`` process runs."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any

from scheduler.contract.errors import invalid_argument


def load_handlers(reference: str) -> Mapping[str, Any]:
    """Import ``MODULE`` (the current directory is on the path, like ``python -m``) and return its
    ``ATTR``: a mapping of job kind to handler. Anything else is ``SCHEDULER_INVALID_ARGUMENT``."""
    module_name, separator, attribute = reference.partition(":")
    if not separator or not module_name or not attribute:
        raise invalid_argument(f"handlers must be given as MODULE:ATTR, not {reference!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise invalid_argument(f"cannot import {module_name!r}: {error}") from error
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise invalid_argument(f"{module_name!r} has no attribute {attribute!r}")
        value = getattr(value, part)
    if not isinstance(value, Mapping):
        raise invalid_argument(f"{reference} is not a mapping of job kind to handler")
    return value
