"""Tasks for tests/test_task_logs.py: handlers that log while they run.

They log on ``tests.task_log_tasks``, which tests/settings.py sets to DEBUG (the root
logger stays at Python's WARNING, as in most projects).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
import time

from django_pgqueue import TaskContext, task

log = logging.getLogger(__name__)


@task
def logs_two(order: int) -> None:
    log.info("charging order %s", order)
    log.warning("card declined for order %s", order)


@task
def logs_below_the_level(order: int) -> None:
    log.debug("a debug record of order %s", order)
    log.info("an info record of order %s", order)


@task(takes_context=True, max_attempts=2)
def fails_then_succeeds(context: TaskContext) -> str:
    log.info("attempt %s begins", context.attempt)
    if context.attempt == 1:
        try:
            raise ValueError("the first attempt fails")
        except ValueError:
            log.exception("attempt %s failed", context.attempt)
            raise
    log.info("attempt %s succeeds", context.attempt)
    return "done"


@task
def logs_many(count: int, size: int) -> None:
    for number in range(count):
        log.info("record %d %s", number, "x" * size)


@task
def logs_bad_text() -> None:
    log.info("a NUL \x00 here")
    log.info("%s", "y" * 100_000)


@task
async def logs_async(order: int) -> None:
    log.info("async handler starts order %s", order)
    await asyncio.sleep(0.01)
    log.warning("async handler ends order %s", order)


@task
def logs_from_threads() -> None:
    log.info("from the handler")
    plain = threading.Thread(target=log.info, args=("from a plain thread",))
    plain.start()
    plain.join()
    context = contextvars.copy_context()
    copied = threading.Thread(target=context.run, args=(log.info, "from a thread in a copy"))
    copied.start()
    copied.join()


@task(takes_context=True)
def logs_then_waits(context: TaskContext, pause: float) -> int:
    """Logs which attempt runs, in which process; the first attempt then waits
    ``pause`` seconds (the test stops its worker meanwhile)."""
    log.info("attempt %s in process %s", context.attempt, os.getpid())
    if context.attempt == 1:
        time.sleep(pause)
        log.info("attempt %s in process %s after the pause", context.attempt, os.getpid())
    return os.getpid()


@task(max_attempts=5)
def logs_and_fails(count: int, size: int) -> None:
    logs_many.func(count, size)
    raise RuntimeError("this attempt fails")


@task(atomic=True)
def logs_atomically(order: int) -> None:
    log.info("atomic handler of order %s", order)
