"""Exceptions: what a handler raises to steer its outcome, and what the API raises."""

from __future__ import annotations

from typing import Any


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
        self.delay = delay
        self.reason = reason
        super().__init__(reason or f"retry requested (delay={delay})")


class Snooze(HandlerSignal):
    """Run this task again after ``delay`` seconds; not a failure, burns no attempt."""

    def __init__(self, delay: float) -> None:
        if delay < 0:
            raise ValueError("Snooze delay must be >= 0 seconds")
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
