"""Exceptions: what a handler raises to steer its outcome, and what the API raises."""

from __future__ import annotations

import math
from typing import Any

# The longest delay a handler may ask for (ten years; as retry.MAX_SECONDS).
_MAX_DELAY = 10 * 365 * 24 * 3600.0


def _check_delay(delay: Any, what: str) -> None:
    if (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not math.isfinite(delay)
        or not 0 <= delay <= _MAX_DELAY
    ):
        raise ValueError(
            f"{what} delay must be a number of seconds between 0 and {_MAX_DELAY:.0f} "
            f"(ten years), not {delay!r}"
        )


class PgQueueError(Exception):
    """Base class of every error this package raises."""


class InvalidTaskError(PgQueueError, ValueError):
    """Enqueue was refused: bad arguments or options. Nothing was written."""


class TaskNotRegistered(PgQueueError, LookupError):
    """A task name is not in the registry of decorated functions."""


class TaskDoesNotExist(PgQueueError, LookupError):
    """No task row has this id."""


class LeaseLost(PgQueueError):
    """A fenced write matched no row: another worker (or a sweep) owns the task now."""


class HandlerSignal(Exception):
    """Base of the exceptions a handler raises to choose its outcome."""


class Retry(HandlerSignal):
    """Retry this task (counts as a failed attempt); ``delay`` overrides the backoff."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        if delay is not None:
            _check_delay(delay, "Retry")
        self.delay = delay
        self.reason = reason
        super().__init__(reason or f"retry requested (delay={delay})")


class Snooze(HandlerSignal):
    """Run this task again after ``delay`` seconds; not a failure, burns no attempt."""

    def __init__(self, delay: float) -> None:
        _check_delay(delay, "Snooze")
        self.delay = delay
        super().__init__(f"snoozed for {delay}s")


class Continue(HandlerSignal):
    """Sliced work: save ``checkpoint`` and run again at once, with a fresh attempt budget.

    Raise it only after the slice made progress: the attempt counter is reset, so a
    handler that raises Continue without advancing would never dead-letter.
    """

    def __init__(self, checkpoint: Any = None) -> None:
        self.checkpoint = checkpoint
        super().__init__("continue")


class Cancelled(HandlerSignal):
    """The handler stops because cancellation was requested; the task ends cancelled."""

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
