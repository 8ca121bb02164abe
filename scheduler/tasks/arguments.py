"""A deferred call's arguments: bound to the function's parameter names, stored as JSON, and
turned back into a call by the worker.

The run's payload is ``{"args": {parameter: value, …}}`` (plus ``"trace"``: the caller's trace
context, when OpenTelemetry is installed and a span is active). Positional arguments are stored
under their parameter names, so ``f(42)`` and ``f(user_id=42)`` are the same call; defaults are not
stored (the function applies them when it runs). A ``*args`` parameter holds a list, a
``**kwargs`` parameter an object.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Final

from scheduler.contract.canonical import canonical_json, normalize_json
from scheduler.contract.errors import SchedulerKernelError, invalid_argument
from scheduler.store.records import Occurrence
from scheduler.tasks.definition import TaskDefinition, tick_arguments
from scheduler.worker.triggers import PERIODIC_TYPES

ARGS: Final = "args"
TRACE: Final = "trace"
_TICK_PREFIXES: Final = tuple(f"{kind}:" for kind in PERIODIC_TYPES)


def bind_arguments(
    definition: TaskDefinition, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The call's arguments by parameter name, as normalized JSON; a call the function's signature
    does not accept, or a value that is not JSON, is ``SCHEDULER_INVALID_ARGUMENT``."""
    try:
        bound = definition.signature.bind(*args, **kwargs)
    except TypeError as error:
        raise invalid_argument(f"task {definition.name}: {error}") from error
    arguments: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = definition.signature.parameters[name].kind
        arguments[name] = list(value) if kind is inspect.Parameter.VAR_POSITIONAL else value
    normalized: Any = normalize_json(arguments, f"task {definition.name} arguments")
    return dict(normalized)


def payload_of(arguments: dict[str, Any], trace: dict[str, str] | None = None) -> dict[str, Any]:
    """The run's payload for bound ``arguments``."""
    return {ARGS: arguments} if not trace else {ARGS: arguments, TRACE: trace}


def _with_defaults(definition: TaskDefinition, arguments: Any) -> Any:
    """``arguments`` plus the function's JSON defaults of the parameters it does not name."""
    if not isinstance(arguments, dict):
        return arguments
    filled = dict(arguments)
    for name, parameter in definition.signature.parameters.items():
        if name in filled or parameter.default is inspect.Parameter.empty:
            continue
        try:
            filled[name] = normalize_json(parameter.default, name)
        except SchedulerKernelError:
            continue  # a default that is not JSON: no call can spell it out
    return filled


def same_call(definition: TaskDefinition, payload: Any, arguments: dict[str, Any]) -> bool:
    """Whether a stored run's payload holds the same call as these arguments: compared as
    canonical JSON with the function's defaults filled in on both sides, so ``f(42)`` and
    ``f(42, "en")`` are the same call when ``"en"`` is the default."""
    stored = payload.get(ARGS) if isinstance(payload, dict) else None
    return canonical_json(_with_defaults(definition, stored)) == canonical_json(
        _with_defaults(definition, arguments)
    )


def is_periodic_tick(occurrence: Occurrence) -> bool:
    """Whether the run is a tick of a periodic trigger (fired by a worker) rather than a ``defer``."""
    return occurrence.trigger_key.startswith(_TICK_PREFIXES)


def call_of(definition: TaskDefinition, occurrence: Occurrence) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments to call the task function with for this run.

    A periodic tick passes its time (``scheduled_for``, epoch ms) as the one positional argument
    when the function takes one. A deferred run's stored arguments are bound back by name.
    """
    if is_periodic_tick(occurrence):
        return tick_arguments(definition.signature, occurrence.scheduled_for), {}
    payload = occurrence.payload
    stored = payload.get(ARGS) if isinstance(payload, dict) else None
    if not isinstance(stored, dict):
        raise invalid_argument(f"run {occurrence.id} holds no task arguments")
    parameters = definition.signature.parameters
    unknown = [name for name in stored if name not in parameters]
    if unknown:
        raise invalid_argument(f"run {occurrence.id} has arguments the task no longer takes: {unknown}")
    bound = inspect.BoundArguments(
        definition.signature,
        {
            name: tuple(stored[name])
            if parameters[name].kind is inspect.Parameter.VAR_POSITIONAL
            else stored[name]
            for name in parameters
            if name in stored
        },
    )
    return list(bound.args), dict(bound.kwargs)


def trace_of(occurrence: Occurrence) -> dict[str, str] | None:
    """The trace context recorded with the run, if any."""
    payload = occurrence.payload
    trace = payload.get(TRACE) if isinstance(payload, dict) else None
    if isinstance(trace, dict) and all(isinstance(v, str) for v in trace.values()):
        return trace
    return None


__all__ = ["bind_arguments", "call_of", "is_periodic_tick", "payload_of", "same_call", "trace_of"]
