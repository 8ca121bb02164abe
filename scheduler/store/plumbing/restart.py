"""The signal by which a store-owned call asks to be run again from the start."""

from __future__ import annotations


class RestartTransaction(Exception):
    """Raised in a call the store may run again (``CallMode.may_run_again``) where a claim would need a
    savepoint it did not take, or where what it decided on changed under it: the runner rolls the
    transaction back and runs the call again, with savepoints and the same injected clock sample
    (``clock_sample``, set by the runner). Never reaches a caller."""

    clock_sample: int | None = None


class WholeCycleMissed(RestartTransaction):
    """A call left whole to one statement (a cycle, a claim or a settle: PostgreSQL's
    ``cycle_statement``, ``claim_statement``, ``settle_statement``) found a case that statement
    does not decide (its check failed, nothing written): the runner runs the call again
    in a call the store may run again that does not try the statement, before any savepoint path."""
