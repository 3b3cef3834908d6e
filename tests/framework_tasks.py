"""Tasks written for Django's Tasks framework, decorated with the framework's own @task
(django.tasks on Django 6, django_tasks on 5.2) and run by this queue through the TASKS
setting in tests/settings.py. Worker subprocesses import this module (TASK_MODULES).

Handlers and signal receivers that need to tell a test (another process) what they saw
write testapp.Run rows.
"""

import asyncio
import os
import signal

from django.utils import timezone

from django_pgqueue import Suspend, get_task
from django_pgqueue.core.compat import (
    TaskContext,
    TaskResult,
    task,
    task_enqueued,
    task_finished,
    task_started,
)
from tests.testapp.models import Run


def _record(task_id: str, attempt: int, label: str) -> None:
    Run.objects.create(
        task_id=int(task_id),
        attempt=attempt,
        label=label,
        pid=os.getpid(),
        started_at=timezone.now(),
    )


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails", priority=10)
def send_email(to: str, subject: str = "") -> str:
    return f"sent {subject!r} to {to}"


@task(takes_context=True)
def describe_context(context: TaskContext, label: str = "") -> dict:
    result = context.task_result
    return {
        "attempt": context.attempt,
        "id": result.id,
        "status": result.status.value,
        "module_path": result.task.module_path,
        "queue_name": result.task.queue_name,
        "priority": result.task.priority,
        "backend": result.backend,
        "args": result.args,
        "kwargs": result.kwargs,
        "worker_ids": result.worker_ids,
        "started": result.started_at is not None,
    }


@task(takes_context=True)
def record(context: TaskContext, label: str) -> str:
    _record(context.task_result.id, context.attempt, label)
    return label


@task
async def async_double(n: int) -> int:
    await asyncio.sleep(0.01)
    return n * 2


@task(takes_context=True)
async def async_describe(context: TaskContext) -> dict:
    await asyncio.sleep(0)
    return {"attempt": context.attempt, "status": context.task_result.status.value}


@task
async def async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@task
def fail(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True)
def fail_until(context: TaskContext, succeed_on: int) -> int:
    if context.attempt < succeed_on:
        raise RuntimeError(f"not yet (attempt {context.attempt})")
    return context.attempt


@task(takes_context=True)
def crash_on_first_attempt(context: TaskContext) -> int:
    _record(context.task_result.id, context.attempt, "crash")
    if context.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return context.attempt


@task
def returns_tuple() -> tuple:
    return (1, "two", b"three")


@task
def returns_nan() -> float:
    return float("nan")


@task
def returns_a_function() -> object:
    return lambda: True  # neither JSON nor picklable, as Django's complex_return_value


@task
def observed(fail: bool = False) -> str:
    if fail:
        raise RuntimeError("observed failure")
    return "observed"


@task
def noisy() -> str:
    return "done despite the receivers"


@task(takes_context=True)
def await_signal(context: TaskContext, name: str) -> dict:
    """Waits for the signal ``name`` (django_pgqueue's Suspend, raised from a framework
    task), then returns its payload, read from the row's signals."""
    row = get_task(int(context.task_result.id))
    if name not in row.signals:
        raise Suspend(name, timeout=60)
    return {"payload": row.signals[name], "attempt": context.attempt}


def plain(n: int) -> int:
    """Module level and undecorated: tests decorate it with invalid settings."""
    return n


def _on_signal(name: str):
    def receiver(sender: type, task_result: TaskResult, **kwargs: object) -> None:
        if task_result.task.func is observed.func:
            label = f"{name}:{task_result.status.value}:{sender.__name__}"
            _record(task_result.id, task_result.attempts, label)
        elif task_result.task.func is noisy.func:
            raise RuntimeError(f"{name} receiver fails")

    return receiver


on_enqueued = _on_signal("enqueued")
on_started = _on_signal("started")
on_finished = _on_signal("finished")
task_enqueued.connect(on_enqueued)
task_started.connect(on_started)
task_finished.connect(on_finished)
