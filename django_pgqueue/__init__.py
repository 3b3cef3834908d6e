"""django_pgqueue: a durable task queue in one PostgreSQL table.

Public API::

    from django_pgqueue import task, Retry, Snooze, Continue, Cancelled, TaskContext

    @task(queue="emails", max_attempts=5, timeout=60)
    def send_receipt(order_id: int) -> None: ...

    send_receipt.enqueue(order.id)            # in the caller's transaction
    send_receipt.enqueue_on_commit(order.id)  # when the outermost atomic block commits
    send_receipt.enqueue_many([1, 2, 3])      # one statement
    send_receipt.using(priority=10, delay=30).enqueue(order.id)

    periodic(send_digest, cron="0 7 * * mon", timezone="Europe/Paris")  # docs/periodic.md
    add_schedule("nightly", "shop.tasks.report", cron="0 2 * * *")      # at runtime

Everything else is private by name or lives in a submodule documented in docs/. The
modules' layers, and what may import what: docs/architecture.md.
"""

# The release, read by the packaging too (pyproject.toml); docs/versioning.md.
__version__ = "0.2.0.dev0"

from django_pgqueue.core.exceptions import (
    Cancelled,
    Continue,
    EncryptionError,
    InvalidTaskError,
    LeaseLost,
    PayloadTooLarge,
    Retry,
    Snooze,
    Suspend,
    TaskDoesNotExist,
    TaskNotRegistered,
)
from django_pgqueue.core.options import call
from django_pgqueue.core.retry import RetryPolicy
from django_pgqueue.ops.operations import (
    cancel,
    get_task,
    pause,
    queue_overview,
    resume,
    signal,
)

# From the public path, not tasking.periodic: importing it binds the attribute
# django_pgqueue.periodic to that submodule, which this import then replaces with the
# function for good (docs/periodic.md); a later first import of the submodule would not.
from django_pgqueue.periodic import periodic
from django_pgqueue.tasking.batch import BatchCall
from django_pgqueue.tasking.context import TaskContext
from django_pgqueue.tasking.registry import TaskDefinition, task
from django_pgqueue.tasking.runtime_schedules import (
    InvalidScheduleError,
    ScheduleDoesNotExist,
    add_schedule,
    pause_schedule,
    remove_schedule,
    resume_schedule,
    update_schedule,
)

__all__ = [
    "BatchCall",
    "Cancelled",
    "Continue",
    "EncryptionError",
    "InvalidScheduleError",
    "InvalidTaskError",
    "LeaseLost",
    "PayloadTooLarge",
    "Retry",
    "RetryPolicy",
    "ScheduleDoesNotExist",
    "Snooze",
    "Suspend",
    "TaskContext",
    "TaskDefinition",
    "TaskDoesNotExist",
    "TaskNotRegistered",
    "add_schedule",
    "call",
    "cancel",
    "get_task",
    "pause",
    "pause_schedule",
    "periodic",
    "queue_overview",
    "remove_schedule",
    "resume",
    "resume_schedule",
    "signal",
    "task",
    "update_schedule",
]
