"""One import shim for Django's Tasks framework: ``django.tasks`` (Django 6) or the
``django_tasks`` backport (Django 5.2).

The two have the same classes and contract; only their homes and two names differ
(Django 6 calls the validation error ``InvalidTask``, the backport ``InvalidTaskError``).
Everything in django_pgqueue that touches the framework imports it from here, so a
project moving from 5.2 to 6 changes its own imports and nothing else.
"""

from __future__ import annotations

try:
    from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import InvalidTaskBackend as InvalidTaskBackendError
    from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
except ImportError:
    try:
        from django_tasks import DEFAULT_TASK_BACKEND_ALIAS, task, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django_tasks.exceptions import (
            InvalidTaskBackendError,
            InvalidTaskError,
            TaskResultDoesNotExist,
            TaskResultMismatch,
        )
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
    except ImportError as exc:
        raise ImportError(
            "django_pgqueue.backends needs Django's Tasks framework: upgrade to Django 6, "
            "or on Django 5.2 install the backport (pip install 'django-pgqueue-tasks[tasks]', "
            "which pulls in django-tasks)"
        ) from exc

    FRAMEWORK = "django_tasks"

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTaskBackendError",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
