"""Operations on tasks outside the worker: read, cancel, and the queue overview."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import connections

from django_pgqueue.conf import get_settings
from django_pgqueue.exceptions import TaskDoesNotExist
from django_pgqueue.sql import QUERIES

if TYPE_CHECKING:
    from django_pgqueue.models import Task


def get_task(task_id: int) -> Task:
    """The task row with this id, or TaskDoesNotExist."""
    from django_pgqueue.models import Task

    try:
        return Task.objects.using(get_settings().DATABASE).get(pk=task_id)
    except (Task.DoesNotExist, ValueError, TypeError):
        raise TaskDoesNotExist(f"no task with id {task_id!r}") from None


def cancel(task_id: int) -> str | None:
    """Cancel a task. Returns ``"cancelled"`` (it was pending or waiting: done at once),
    ``"cancel_requested"`` (it is running: its handler sees ``context.cancel_requested``
    and its settlement records cancelled), or None (no such task, or already finished).
    """
    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["cancel_task"], {"id": task_id})
        row = cursor.fetchone()
    if row is None:
        return None
    return "cancel_requested" if row[1] == "running" else "cancelled"


def queue_overview() -> list[dict[str, Any]]:
    """Per (queue, task_name): pending routable / unroutable, scheduled, running,
    waiting, failed, and the age in seconds of the oldest due task."""
    conf = get_settings()
    with connections[conf.DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["queue_overview"], {"stale_seconds": conf.WORKER_STALE_AFTER})
        columns = [c[0] for c in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
