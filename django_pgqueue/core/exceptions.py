"""Exceptions: what a handler raises to steer its outcome, and what the API raises."""

from __future__ import annotations

import math
from typing import Any

# The longest delay a handler may ask for (ten years; as retry.MAX_SECONDS).
_MAX_DELAY = 10 * 365 * 24 * 3600.0
# A checkpoint left out (None is a checkpoint value).
_UNSET: Any = object()


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


class TransactionDatabaseError(InvalidTaskError):
    """Enqueue was refused: the caller is inside a transaction on another database than
    the task's queue, so the task would not be part of it (docs/databases.md). Nothing
    was written."""


class PayloadTooLarge(InvalidTaskError):
    """A JSON value is larger than its limit (``PGQUEUE['MAX_ARGS_BYTES']`` and the
    others of docs/settings.md, "Limits on sizes"); the message names the limit and its
    setting. Nothing was written."""


class TaskNotRegistered(PgQueueError, LookupError):
    """A task name is not in the registry of decorated functions."""


class TaskDoesNotExist(PgQueueError, LookupError):
    """No task row has this id."""


class LeaseLost(PgQueueError):
    """A fenced write matched no row: another worker (or a sweep) owns the task now."""


class AtomicWriteRefused(PgQueueError):
    """An atomic task's handler wrote through another database alias than its task's:
    that write would not be part of the transaction that commits with the task's
    success (docs/guarantees.md). The statement was not run."""


class EncryptionError(PgQueueError):
    """An encrypted task's payload could not be encrypted or decrypted: ``cryptography``
    is not installed, ``PGQUEUE["ENCRYPTION_KEYS"]`` is empty or holds a value that is
    not a key, or none of its keys decrypts a stored value (docs/security.md,
    "Encrypted payloads"). An enqueue or a signal that raises it wrote nothing; a row
    that cannot be decrypted is left as it is."""


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


class Suspend(HandlerSignal):
    """Suspend this task until the signal ``signal`` arrives (``django_pgqueue.signal``),
    or ``timeout`` seconds pass: the row waits, holds no slot and no lease, and burns no
    attempt. The next attempt finds the signal's payload in ``context.signals`` and what
    woke it in ``context.wake``; ``checkpoint`` (if given) is saved for it. A signal
    sent before the task suspends is kept, and resumes it at once.

    To wait for another task's end instead, call ``context.wait_for(task_id)``.
    """

    def __init__(
        self, signal: str, *, timeout: float | None = None, checkpoint: Any = _UNSET
    ) -> None:
        if not isinstance(signal, str) or not 1 <= len(signal) <= 255:
            raise ValueError(f"Suspend needs a signal name of 1-255 characters, not {signal!r}")
        if timeout is not None:
            _check_delay(timeout, "Suspend timeout")
        self.reason = "signal"
        self.signal = signal
        self.timeout = timeout
        self.checkpoint = checkpoint
        super().__init__(f"suspended until signal {signal!r}")

    @classmethod
    def for_tasks(
        cls, task_ids: list[int], timeout: float | None, checkpoint: Any = _UNSET
    ) -> Suspend:
        """Waiting for other tasks to end (``context.wait_for`` wrote the edges)."""
        suspend = cls("tasks", timeout=timeout, checkpoint=checkpoint)
        suspend.reason, suspend.signal = "child", None
        suspend.args = (f"suspended until task(s) {', '.join(map(str, task_ids))} end",)
        return suspend


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


# Rows name an exception class by ``module.qualname``: an error's type, and a task's
# retry_on and discard_on rules (retry.exception_name), which a worker compares with
# the raised exception's classes. These classes keep the name of their public path
# (django_pgqueue/exceptions.py), so a rule or an error stored by an earlier release
# still matches, and an error names a path a project can import.
for _class in list(globals().values()):
    if isinstance(_class, type) and _class.__module__ == __name__:
        _class.__module__ = "django_pgqueue.exceptions"
del _class
