"""The admin: tasks, the queue overview, and the live workers.

Nothing here writes a task row through a model form. Every change goes through
``operations`` (named, state-checked SQL), so an operator can never overwrite a row a
worker holds: retry and requeue only match pending or dead rows, cancel of a running
task only sets ``cancel_requested`` (and ``cancel_hard`` for "Cancel (kill the
handler)", which a process-mode worker acts on), delete only matches finished rows.

Permissions are Django's model permissions, staff only (the admin site's login):
viewing tasks, the overview and the workers needs ``view_task`` (or ``change_task``);
retry, cancel, requeue and sending a signal need ``change_task``; delete needs
``delete_task``; enqueueing a task needs ``enqueue_task`` (declared on Task); removing
stale worker rows needs ``delete_worker``; pausing and resuming queues from the
overview needs ``pause_queue`` (declared on the QueueOverview proxy).

The lists, the pages and the overview read from the read database (``READ_DATABASE``,
a replica, when it is set: ``get_queryset``); every change goes to ``DATABASE``. An
action re-selects its rows there (``queryset.using(DATABASE)``), so it acts on the
rows as they are now, never on a replica's older copy, and what an action reads back
of its own writes (the rows it logs) is read there too.
"""

from __future__ import annotations

from django.contrib import admin

from django_pgqueue.admin import schedules
from django_pgqueue.admin.overview import QueueOverviewAdmin
from django_pgqueue.admin.schedules import ScheduleAdmin
from django_pgqueue.admin.tasks import TaskAdmin
from django_pgqueue.admin.workers import WorkerAdmin
from django_pgqueue.models import QueueOverview, Schedule, Task, Worker

__all__ = [
    "QueueOverviewAdmin",
    "ScheduleAdmin",
    "TaskAdmin",
    "WorkerAdmin",
    "register",
    "schedules",
]


def register(site: admin.AdminSite) -> None:
    """Register the app's admin pages (tasks, the queue overview, workers, schedules) on
    a project's own ``AdminSite``; ``admin.site`` has them already (docs/admin.md).
    Their links stay on ``site``. Django's AlreadyRegistered if ``site`` has one of
    these models."""
    site.register(Task, TaskAdmin)
    site.register(QueueOverview, QueueOverviewAdmin)
    site.register(Worker, WorkerAdmin)
    site.register(Schedule, ScheduleAdmin)
