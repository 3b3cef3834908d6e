"""Celery's exceptions (``celery.exceptions``), under the same names, and the error
raised for what has no counterpart here.

A ported task raises and catches these as it did: ``raise self.retry(exc=exc)`` raises
``Retry``, a task past its ``max_retries`` raises ``MaxRetriesExceededError`` (or the
``exc`` it was given), ``AsyncResult.get(timeout=...)`` raises ``TimeoutError``.
"""

from __future__ import annotations

from typing import Any

from django_pgqueue.core.exceptions import PgQueueError


class Unsupported(PgQueueError, NotImplementedError):
    """A part of Celery's API with no counterpart on this queue; the message names
    what to use instead. Raised when the name is used, never a silent no-op."""


class UnsupportedImport(ImportError):
    """``from django_pgqueue.celery import X`` of a Celery name with no counterpart: an
    ImportError (so the import fails where it is written) whose message names the
    alternative."""


class CeleryError(Exception):
    """Base of Celery's own errors (celery.exceptions.CeleryError)."""


class TaskError(CeleryError):
    """Task related errors."""


class Retry(TaskError):
    """The task is to be retried: raised by ``self.retry()``. The worker turns it into
    the row's next attempt, ``when`` seconds (or at the datetime ``when``) later."""

    def __init__(
        self,
        message: str | None = None,
        exc: BaseException | None = None,
        when: Any = None,
        is_eager: bool = False,
        sig: Any = None,
        **kwargs: Any,
    ) -> None:
        self.message = message
        self.exc = exc
        self.when = when
        self.is_eager = is_eager
        self.sig = sig
        super().__init__(message, exc, when, **kwargs)

    def humanize(self) -> str:
        if isinstance(self.when, int | float):
            return f"in {self.when:g}s"
        return f"at {self.when}"

    def __str__(self) -> str:
        if self.message:
            return self.message
        if self.exc:
            return f"Retry {self.humanize()}: {self.exc!r}"
        return f"Retry {self.humanize()}"


RetryTaskError = Retry  # Celery's old name


class MaxRetriesExceededError(TaskError):
    """The task was retried ``max_retries`` times already and asked for one more."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.task_args = kwargs.pop("task_args", [])
        self.task_kwargs = kwargs.pop("task_kwargs", {})
        super().__init__(*args, **kwargs)


class TaskRevokedError(TaskError):
    """The task was revoked (cancelled here), so it has no result."""


class NotRegistered(KeyError, TaskError):
    """No task of this name is registered in this process."""


class TimeoutError(TaskError):
    """``AsyncResult.get(timeout=...)`` waited that long and the task is not ready."""


class ChordError(TaskError):
    """A chord's callback could not run because one of its members failed."""


class SoftTimeLimitExceeded(Exception):
    """Celery raises it inside a task at its soft time limit. This queue never raises
    it (a running thread cannot be interrupted): it is here so that ``except
    SoftTimeLimitExceeded`` still imports. See docs/celery.md, "Time limits"."""


class TimeLimitExceeded(Exception):
    """Celery's hard time limit. A task past its ``time_limit`` here ends as a timeout
    (docs/tasks.md, "Outcomes"); this class is never raised."""

