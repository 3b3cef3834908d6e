"""Celery's API on django_pgqueue: a Celery project ports by changing its imports.

::

    from celery import Celery, shared_task, chain, group, chord   # before
    from celery.result import AsyncResult
    from celery.schedules import crontab
    from django_pgqueue.celery import (                            # after
        Celery, shared_task, chain, group, chord, AsyncResult, crontab,
    )

``celery.exceptions`` (Retry, MaxRetriesExceededError, SoftTimeLimitExceeded...) and
``celery.signals`` (task_prerun, task_postrun, task_success, task_failure, task_retry,
before_task_publish, after_task_publish) are here too, and as
``django_pgqueue.celery.signals`` / ``.states``. Celery is not a dependency: these are
this queue's enqueue, rows, workflows and periodic schedules behind Celery's names
(docs/celery.md says where they differ). A name with no counterpart (``app.control``,
``chunks``, ``Ignore``...) raises an error naming what to use instead.
"""

from __future__ import annotations

import uuid as _uuid
from typing import Any

from django_pgqueue.celery import states
from django_pgqueue.celery.app import Celery, current_app, current_task, shared_task
from django_pgqueue.celery.canvas import (
    Signature,
    chain,
    chord,
    chunks,
    group,
    maybe_signature,
    signature,
    subtask,
    xmap,
    xstarmap,
)
from django_pgqueue.celery.exceptions import (
    CeleryError,
    ChordError,
    MaxRetriesExceededError,
    NotRegistered,
    Retry,
    SoftTimeLimitExceeded,
    TaskError,
    TaskRevokedError,
    TimeLimitExceeded,
    TimeoutError,  # noqa: F401 - celery.exceptions.TimeoutError; not in __all__ (a builtin's name)
    Unsupported,
    UnsupportedImport,
)
from django_pgqueue.celery.result import AsyncResult, EagerResult, GroupResult, ResultSet
from django_pgqueue.celery.schedules import crontab, schedule, solar
from django_pgqueue.celery.signals import (
    after_task_publish,
    before_task_publish,
    task_failure,
    task_postrun,
    task_prerun,
    task_retry,
    task_success,
)
from django_pgqueue.celery.task import Task

__all__ = [
    "AsyncResult",
    "Celery",
    "CeleryError",
    "ChordError",
    "EagerResult",
    "GroupResult",
    "MaxRetriesExceededError",
    "NotRegistered",
    "ResultSet",
    "Retry",
    "Signature",
    "SoftTimeLimitExceeded",
    "Task",
    "TaskError",
    "TaskRevokedError",
    "TimeLimitExceeded",
    "Unsupported",
    "UnsupportedImport",
    "after_task_publish",
    "before_task_publish",
    "chain",
    "chord",
    "chunks",
    "crontab",
    "current_app",
    "current_task",
    "group",
    "maybe_signature",
    "schedule",
    "shared_task",
    "signature",
    "solar",
    "states",
    "subtask",
    "task_failure",
    "task_postrun",
    "task_prerun",
    "task_retry",
    "task_success",
    "uuid",
    "xmap",
    "xstarmap",
]


def uuid() -> str:
    """A new random task id (``celery.uuid``), for ``apply_async(task_id=...)``."""
    return str(_uuid.uuid4())


# Celery's names with no counterpart, and what to use instead.
_UNSUPPORTED = {
    "Ignore": (
        "to end a task without a result, return None; to stop it for good, raise "
        "django_pgqueue.Cancelled (REVOKED)"
    ),
    "Reject": (
        "to run the task again later, raise django_pgqueue.Snooze(delay); to fail it, "
        "raise an exception"
    ),
    "WorkerLostError": (
        "a task whose worker died is run again once its lease lapses "
        "(docs/guarantees.md); its error entry says LeaseExpired"
    ),
    "allow_join_result": (
        "waiting for another task's result inside a task is refused; use a chain or a "
        "chord, or self.request.task_context.wait_for(...), which holds no slot"
    ),
    "result_from_tuple": "rebuild a result from its id: AsyncResult(id)",
    "bugreport": "python manage.py pgqueue_status shows the queue and its workers",
    "maybe_schedule": "a beat entry's schedule is a crontab, a number of seconds or a timedelta",
}


def __getattr__(name: str) -> Any:
    if name in _UNSUPPORTED:
        raise UnsupportedImport(
            f"celery's {name} has no counterpart in django_pgqueue.celery: "
            f"{_UNSUPPORTED[name]} (docs/celery.md)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
