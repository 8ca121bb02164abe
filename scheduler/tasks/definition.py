"""A task's definition, checked when the function is decorated (API §10).

A task is a job: its name is the job id, its queue the job kind, ``max_attempts`` the job's, a
periodic task's schedule the job's trigger document (API §9), and a pausable task's capability the
job's payload (``{"runtimeControl": …}``, so an operator or dashboard can pause its runs). The retry
policy and the time limit live in the code: every process that runs the task imports the same
definition.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler.contract.errors import invalid_argument
from scheduler.contract.runtime_control import normalize_runtime_control_capability
from scheduler.contract.scalars import MISSING, is_safe_int, normalize_max_attempts
from scheduler.contract.storable import normalize_key
from scheduler.worker.policy import RetryPolicy
from scheduler.worker.triggers import TriggerError, parse_trigger

RESERVED_PARAMETERS: Final = ("key", "run_at", "connection")
"""``defer``'s own keywords: a task function may not declare a parameter of these names."""
CONTEXT_PARAMETER: Final = "ctx"
DEFAULT_QUEUE: Final = "default"
MAX_TIMEOUT_MS: Final = 2**31 - 1
PAUSABLE_CAPABILITY: Final = normalize_runtime_control_capability(
    {"pauseResume": "checkpoint_v1", "safePoints": ["adapter_checkpoint", "before_execute"]}
)
"""The runtime-control capability of a task declared ``pausable=True``."""


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    """One task: its job fields and how a worker runs it. ``function`` is the decorated callable."""

    name: str
    queue: str
    max_attempts: int
    retry: RetryPolicy | None
    timeout_ms: int | None
    pausable: bool
    trigger: dict[str, Any] | None
    function: Callable[..., Any] = field(compare=False, repr=False)
    signature: inspect.Signature = field(compare=False, repr=False)
    """The function's signature without ``ctx``: what a deferred call is bound to."""
    wants_ctx: bool = False

    @property
    def periodic(self) -> bool:
        return self.trigger is not None

    @property
    def job_payload(self) -> Any:
        """The job's payload: the runtime-control capability of a pausable task, else ``None``."""
        return {"runtimeControl": PAUSABLE_CAPABILITY} if self.pausable else None

    def job_fields(self, authority: dict[str, Any]) -> dict[str, Any]:
        """``create_job``'s keyword arguments (without ``id``) for this task."""
        return {
            "kind": self.queue,
            "trigger": self.trigger or {},  # the store keeps "no trigger" as {}
            "payload": self.job_payload,
            "authority": authority,
            "max_attempts": self.max_attempts,
        }


def task_name(function: Callable[..., Any], name: Any) -> str:
    """``name`` or the function's ``module.qualname`` (a job id); ``__main__`` needs ``name``."""
    if name is not None:
        return normalize_key(name, "task name")
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise invalid_argument("a task needs name= when its function has no module and qualified name")
    if module == "__main__":
        raise invalid_argument(
            f"task {qualname!r} is defined in __main__: give it name= (workers import it under another name)"
        )
    return normalize_key(f"{module}.{qualname}", "task name")


def _signature(function: Callable[..., Any]) -> tuple[inspect.Signature, bool]:
    """The signature without ``ctx``, and whether the function declares ``ctx``."""
    if not callable(function):
        raise invalid_argument("a task must be a function")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as error:
        raise invalid_argument(f"cannot read the task function's signature: {error}") from error
    reserved = [name for name in signature.parameters if name in RESERVED_PARAMETERS]
    if reserved:
        raise invalid_argument(
            f"a task function may not declare a parameter named {', '.join(reserved)} "
            "(defer's own keywords: key, run_at, connection)",
            {"parameters": reserved},
        )
    wants_ctx = CONTEXT_PARAMETER in signature.parameters
    if wants_ctx and signature.parameters[CONTEXT_PARAMETER].kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.VAR_POSITIONAL,
    ):
        raise invalid_argument("the ctx parameter must be one that can be passed by keyword")
    parameters = [p for name, p in signature.parameters.items() if name != CONTEXT_PARAMETER]
    return signature.replace(parameters=parameters), wants_ctx


def periodic_trigger(cron: Any, timezone: Any, every_ms: Any) -> dict[str, Any]:
    """The trigger document of ``@tasks.periodic``: exactly one of ``cron`` (with an optional IANA
    ``timezone``) or ``every_ms``; one that could never fire is ``SCHEDULER_INVALID_ARGUMENT``."""
    if (cron is None) == (every_ms is None):
        raise invalid_argument("a periodic task needs exactly one of cron= or every_ms=")
    if cron is not None:
        if not isinstance(cron, str):
            raise invalid_argument("cron must be a cron expression of 5 fields")
        document: dict[str, Any] = {"type": "cron", "expression": " ".join(cron.split())}
        if timezone is not None:
            document["timezone"] = timezone
    else:
        if timezone is not None:
            raise invalid_argument("timezone applies to cron= only")
        if not is_safe_int(every_ms) or every_ms < 1:
            raise invalid_argument("every_ms must be a positive integer (milliseconds)")
        document = {"type": "interval", "everyMs": every_ms}
    try:
        parse_trigger(document, created_at=0)
    except TriggerError as error:
        raise invalid_argument(f"invalid periodic schedule: {error}", {"trigger": document}) from error
    return document


def tick_arguments(signature: inspect.Signature, tick_ms: int) -> list[int]:
    """What a periodic tick calls its function with: the tick's time (epoch ms) as the one
    positional argument when the function takes one, else nothing."""
    takes_one = any(
        parameter.kind
        in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.VAR_POSITIONAL,
        )
        for parameter in signature.parameters.values()
    )
    return [tick_ms] if takes_one else []


def _check_tick_call(signature: inspect.Signature) -> None:
    """A periodic function must be callable with the tick alone (else every tick would fail)."""
    try:
        signature.bind(*tick_arguments(signature, 0))
    except TypeError as error:
        raise invalid_argument(
            f"a periodic task's function is called with the tick (epoch ms) or nothing: {error}"
        ) from error


def _timeout(value: Any) -> int | None:
    if value is None:
        return None
    if not is_safe_int(value) or not 1 <= value <= MAX_TIMEOUT_MS:
        raise invalid_argument(f"timeout_ms must be an integer between 1 and {MAX_TIMEOUT_MS}")
    return value


def define_task(
    function: Callable[..., Any],
    *,
    name: Any = None,
    queue: Any = DEFAULT_QUEUE,
    max_attempts: Any = MISSING,
    retry: Any = None,
    timeout_ms: Any = None,
    pausable: Any = False,
    trigger: dict[str, Any] | None = None,
) -> TaskDefinition:
    """Check every option and the function's parameters; ``SCHEDULER_INVALID_ARGUMENT`` otherwise."""
    signature, wants_ctx = _signature(function)
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise invalid_argument("retry must be a RetryPolicy")
    if not isinstance(pausable, bool):
        raise invalid_argument("pausable must be True or False")
    if trigger is not None:
        _check_tick_call(signature)
    return TaskDefinition(
        name=task_name(function, name),
        queue=normalize_key(queue, "queue", 128),
        max_attempts=normalize_max_attempts(max_attempts),
        retry=retry,
        timeout_ms=_timeout(timeout_ms),
        pausable=pausable,
        trigger=trigger,
        function=function,
        signature=signature,
        wants_ctx=wants_ctx,
    )


__all__ = [
    "CONTEXT_PARAMETER",
    "DEFAULT_QUEUE",
    "PAUSABLE_CAPABILITY",
    "RESERVED_PARAMETERS",
    "TaskDefinition",
    "define_task",
    "periodic_trigger",
    "task_name",
    "tick_arguments",
]
