"""What a handler's outcome becomes: retry backoff, error documents, and the handler exceptions.

``RetryPolicy`` computes ``retry_at`` for a retryable failure; :func:`error_document` turns an
exception into the ``{"code", "message"}`` the store records (API §9).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from scheduler.contract.errors import invalid_argument

MAX_ERROR_MESSAGE_CHARS: Final = 2_000
MAX_ERROR_CODE_CHARS: Final = 128
"""An error code longer than this is cut, so it stays usable as ``requeue_dead_letter``'s
``expected_error_code`` (an identifier of at most 128 characters)."""
RESULT_NOT_JSON: Final = "RESULT_NOT_JSON"


class PermanentError(Exception):
    """Raise from a handler to dead-letter the occurrence at once (no retry).

    ``code`` becomes the stored error's ``code`` (default: the exception class's qualified name).
    """

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class Paused(BaseException):
    """Raised by ``ctx.checkpoint(...)`` after the worker acknowledged a pause request.

    A ``BaseException``, so ``except Exception`` in a handler does not swallow it. Let it propagate:
    the occurrence is parked (``retry_wait`` with a ``paused`` control) and is not settled.
    """

    def __init__(self, occurrence_id: str, checkpoint: Any = None) -> None:
        super().__init__(f"occurrence paused at a checkpoint: {occurrence_id}")
        self.occurrence_id = occurrence_id
        self.checkpoint = checkpoint


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter, capped: the delay before retry ``n`` (``n = attempt``).

    ``delay = min(max_ms, base_ms * factor ** (attempt - 1))``, then multiplied by a uniform factor in
    ``[1 - jitter, 1 + jitter]`` and capped at ``max_ms`` again. All durations in milliseconds.
    Invalid values raise ``SCHEDULER_INVALID_ARGUMENT``.
    """

    base_ms: int = 1_000
    factor: float = 2.0
    max_ms: int = 300_000
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if type(self.base_ms) is not int or self.base_ms < 0:
            raise invalid_argument("RetryPolicy.base_ms must be an integer >= 0")
        if type(self.max_ms) is not int or self.max_ms < self.base_ms:
            raise invalid_argument("RetryPolicy.max_ms must be an integer >= base_ms")
        if isinstance(self.factor, bool) or not isinstance(self.factor, (int, float)) or not self.factor >= 1:
            raise invalid_argument("RetryPolicy.factor must be a number >= 1")
        if (
            isinstance(self.jitter, bool)
            or not isinstance(self.jitter, (int, float))
            or not 0 <= self.jitter <= 1
        ):
            raise invalid_argument("RetryPolicy.jitter must be a number between 0 and 1")

    def delay_ms(self, attempt: int, uniform: Callable[[], float] = random.random) -> int:
        """The backoff after failed attempt ``attempt`` (1-based); ``uniform`` returns [0, 1)."""
        exponent = max(0, attempt - 1)
        try:
            raw = self.base_ms * self.factor**exponent
        except OverflowError:
            raw = float(self.max_ms)
        delay = min(float(self.max_ms), raw)
        jittered = delay * (1 + self.jitter * (2 * uniform() - 1))
        return max(0, min(self.max_ms, round(jittered)))


def _printable(text: str) -> str:
    return "".join(character if ord(character) > 31 and ord(character) != 127 else "?" for character in text)


def error_code(error: BaseException) -> str:
    """``PermanentError(code=…)``'s code, else the exception class's qualified name (≤ 128 characters,
    control characters replaced, never empty)."""
    chosen = getattr(error, "code", None) if isinstance(error, PermanentError) else None
    fallback = type(error).__qualname__
    text = _printable(str(chosen)).strip() if chosen is not None else ""
    return (text or fallback)[:MAX_ERROR_CODE_CHARS]


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # a broken __str__ must not make the occurrence unsettleable
        return f"<unprintable {type(error).__qualname__}>"


def error_document(error: BaseException) -> dict[str, str]:
    """``{"code", "message"}`` for a failed handler; the message is cut to 2,000 characters."""
    return {"code": error_code(error), "message": _message(error)[:MAX_ERROR_MESSAGE_CHARS]}


def result_not_json(reason: str) -> dict[str, str]:
    """The error a non-JSON handler result settles with (not retryable)."""
    return {
        "code": RESULT_NOT_JSON,
        "message": f"handler result is not JSON: {reason}"[:MAX_ERROR_MESSAGE_CHARS],
    }
