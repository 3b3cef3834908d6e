"""Tasks the tests enqueue. Worker subprocesses import this module (TASK_MODULES).

Handlers record what they did in testapp.Run rows, so a test (another process) can see
which attempts ran, where, and when.
"""

import asyncio
import logging
import os
import signal
import time

from django.utils import timezone

from django_pgqueue import Cancelled, Continue, Retry, Snooze, TaskContext, task
from tests.testapp.models import Run


def _record(context: TaskContext, label: str = "") -> Run:
    return Run.objects.create(
        task_id=context.task_id,
        attempt=context.attempt,
        label=label,
        pid=os.getpid(),
        started_at=timezone.now(),
    )


@task
def noop(n: int = 0) -> int:
    return n


@task(takes_context=True)
def record(context: TaskContext, label: str = "") -> str:
    run = _record(context, label)
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now())
    return label


@task(takes_context=True)
def sleep_and_record(context: TaskContext, seconds: float, label: str = "") -> float:
    run = _record(context, label)
    time.sleep(seconds)
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now())
    return seconds


@task(takes_context=True, max_attempts=3)
def fail_always(context: TaskContext, message: str = "boom") -> None:
    _record(context)
    raise ValueError(f"{message} on attempt {context.attempt}")


@task(takes_context=True, max_attempts=5)
def fail_until(context: TaskContext, succeed_on: int) -> int:
    _record(context)
    if context.attempt < succeed_on:
        raise RuntimeError(f"not yet (attempt {context.attempt})")
    return context.attempt


@task(takes_context=True)
def retry_with_delay(context: TaskContext, delay: float) -> int:
    _record(context)
    if context.attempt == 1:
        raise Retry(delay=delay, reason="asked to retry later")
    return context.attempt


@task(takes_context=True, max_attempts=1)
def snooze_once(context: TaskContext, delay: float) -> int:
    runs = Run.objects.filter(task_id=context.task_id).count()
    _record(context)
    if runs == 0:
        raise Snooze(delay)
    return context.attempt


@task(takes_context=True, max_attempts=2)
def kill_my_worker(context: TaskContext) -> None:
    _record(context)
    os.kill(os.getpid(), signal.SIGKILL)


@task(takes_context=True, max_attempts=2)
def sliced(context: TaskContext, total: int) -> int:
    done = (context.checkpoint or {}).get("done", 0)
    _record(context, f"slice from {done}")
    if done < total:
        raise Continue(checkpoint={"done": done + 1})
    return done


@task(takes_context=True)
def wait_for_cancel(context: TaskContext, limit: float = 30) -> str:
    _record(context)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if context.refresh_cancel_requested():
            raise Cancelled("saw the cancel request")
        time.sleep(0.05)
    return "not cancelled"


@task(takes_context=True)
def report(context: TaskContext) -> dict:
    context.report_progress({"step": 1})
    context.save_checkpoint({"step": 1})
    return {
        "task_id": context.task_id,
        "attempt": context.attempt,
        "max_attempts": context.max_attempts,
        "queue": context.queue,
        "deadline": context.deadline.isoformat() if context.deadline else None,
        "claimed_at": context.claimed_at.isoformat(),
        "cancel_requested": context.cancel_requested,
    }


@task
async def async_double(n: int) -> int:
    await asyncio.sleep(0.01)
    return n * 2


@task(timeout=0.3, max_attempts=1)
async def async_too_slow() -> None:
    await asyncio.sleep(10)


@task(name="tests.versioned", version=1)
def versioned_v1() -> str:
    """The old handler, kept beside the new one while rows of version 1 remain."""
    return "v1"


@task(name="tests.versioned", version=2)
def versioned() -> str:
    return "v2"


@task(queue="other")
def other_queue(n: int) -> int:
    return n


@task
def return_unserializable() -> object:
    return object()


@task
def just_sleep(seconds: float) -> float:
    """Touches no database: its outcome only needs the settler."""
    time.sleep(seconds)
    return seconds


@task(max_attempts=1)
def calls_sys_exit() -> None:
    raise SystemExit(3)


@task
def logs_a_line() -> None:
    logging.getLogger("tests.tasks").info("hello from the handler")


@task
async def async_nap(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@task(takes_context=True)
def time_left_at_start(context: TaskContext) -> float:
    """Seconds left of the attempt's timeout when the handler starts."""
    return context.time_left().total_seconds()
