"""Reliability suite: crash safety, full disk, worker races, state-machine fuzzing, tampering.

Sizes come from ``SCHEDULER_RELIABILITY_SCALE`` (``ci``, the default, or ``full``); see
``conftest.py`` and ``docs/design/reliability.md``.
"""
