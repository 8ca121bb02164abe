"""``MODULE:ATTR`` → what a ``scheduler worker`` process runs (a handlers mapping, or a ``Tasks`` object)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any

from scheduler.contract.errors import invalid_argument


def load_attribute(reference: str) -> Any:
    """Import ``MODULE`` (the current directory is on the path, like ``python -m``) and return its
    ``ATTR`` (dotted attributes allowed); ``SCHEDULER_INVALID_ARGUMENT`` if either is missing."""
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
    return value


def load_handlers(reference: str) -> Mapping[str, Any]:
    """:func:`load_attribute`, which must be a mapping of job kind to handler
    (else ``SCHEDULER_INVALID_ARGUMENT``)."""
    value = load_attribute(reference)
    if not isinstance(value, Mapping):
        raise invalid_argument(f"{reference} is not a mapping of job kind to handler")
    return value
