"""PgQueueBackend with the test hooks Django's own Tasks tests expect.

Django's tests inspect its reference backends through hooks that only tests use:
DummyBackend keeps the ``results`` it was given and can ``clear()`` them, and
ImmediateBackend has run the task by the time ``enqueue`` returns. The subclasses here
give PgQueueBackend the same hooks, built on the real table and a real worker; every
other method is PgQueueBackend's own.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import connections

from django_pgqueue import framework
from django_pgqueue.backends import PgQueueBackend
from django_pgqueue.core.compat import Task, TaskResult, task_finished
from django_pgqueue.core.conf import get_settings
from django_pgqueue.models import Task as Row
from django_pgqueue.worker.worker import Worker, WorkerOptions

FINISH_TIMEOUT = 30.0


class InspectablePgQueueBackend(PgQueueBackend):
    """DummyBackend's hooks: ``results`` (every framework task in the table, oldest
    first, as ``get_result`` reads it) and ``clear()`` (empty the table)."""

    @property
    def results(self) -> list[TaskResult]:
        rows = Row.objects.using(get_settings().DATABASE).filter(metadata__has_key=framework.MARKER)
        return [framework.result_from_row(row) for row in rows.order_by("id")]

    def clear(self) -> None:
        Row.objects.using(get_settings().DATABASE).all().delete()


class WorkerOnEnqueueBackend(InspectablePgQueueBackend):
    """ImmediateBackend's promise: the TaskResult ``enqueue`` returns is final.

    After the INSERT, a burst worker (django_pgqueue's own Worker, in this process, so
    that ``task_started`` and ``task_finished`` and Django's log lines for them reach the
    test) runs the task; ``enqueue`` waits for ``task_finished`` and refreshes the result.
    Inside ``atomic()`` no worker can see the uncommitted row, and a task deferred with
    ``run_after`` is not due: both return READY, as they would on a real queue.
    """

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        result = super().enqueue(task, args, kwargs)
        if connections[get_settings().DATABASE].in_atomic_block or task.run_after is not None:
            return result
        finished = _watch_finished(result.id)
        run_burst_worker([task.queue_name])
        if not finished.wait(FINISH_TIMEOUT):
            raise AssertionError(
                f"task {result.id} ({task.module_path}) sent no task_finished within "
                f"{FINISH_TIMEOUT:g}s of the burst worker's exit: see the worker's log above"
            )
        result.refresh()
        return result


def run_burst_worker(queues: list[str]) -> None:
    """Run a worker in this thread until no task is due on ``queues``."""
    options = WorkerOptions.from_settings(queues=queues, burst=True, prune=False)
    Worker(options).run(install_signals=False)


_finished: dict[str, threading.Event] = {}
_finished_lock = threading.Lock()


def _watch_finished(result_id: str) -> threading.Event:
    with _finished_lock:
        return _finished.setdefault(result_id, threading.Event())


def _on_task_finished(sender: type, task_result: TaskResult, **kwargs: Any) -> None:
    # Connected after Django's own receivers: its log line is written before this fires.
    with _finished_lock:
        event = _finished.pop(task_result.id, None)
    if event is not None:
        event.set()


task_finished.connect(_on_task_finished, dispatch_uid="tests_django.backends.finished")
