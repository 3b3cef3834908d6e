"""Tasks that record every run in the ledger (tests/ledger.py), outside the database.

Worker subprocesses import this module (TASK_MODULES). The handlers touch no database:
the crash tests stop the database under them, and the ledger must outlive that.
"""

import time

from django_pgqueue import TaskContext, task
from tests.ledger import record_run


def work_seconds(n: int) -> float:
    """How long task ``n`` works: 20-300 ms spread over n, and 1 s for every 100th."""
    if n % 100 == 99:
        return 1.0
    return 0.020 + (n * 7919 % 281) / 1000


@task(takes_context=True, max_attempts=25)
def ledger_run(context: TaskContext, n: int, seconds: float | None = None) -> int:
    """Work for ``seconds`` (default: work_seconds(n)) between a start and an end record.

    max_attempts is high because the chaos test burns attempts on purpose (every kill
    and every pause past the lease costs the tasks in flight one).
    """
    record_run("start", context.task_id, context.attempt, context.lease_token)
    time.sleep(work_seconds(n) if seconds is None else seconds)
    record_run("end", context.task_id, context.attempt, context.lease_token)
    return n


@task(takes_context=True, concurrency_key=lambda n, key, seconds=0.1: key)
def ledger_keyed(context: TaskContext, n: int, key: str, seconds: float = 0.1) -> int:
    """A ledger run limited to one at a time per key, fleet-wide (key_concurrency 1)."""
    record_run("start", context.task_id, context.attempt, context.lease_token)
    time.sleep(seconds)
    record_run("end", context.task_id, context.attempt, context.lease_token)
    return n


@task(takes_context=True, max_attempts=3)
def ledger_overrun(context: TaskContext, first_seconds: float, seconds: float = 0.05) -> int:
    """A handler that ignores its timeout on the first attempt: it sleeps ``first_seconds``
    through it (give it a short ``timeout``); later attempts work for ``seconds``."""
    record_run("start", context.task_id, context.attempt, context.lease_token)
    time.sleep(first_seconds if context.attempt == 1 else seconds)
    record_run("end", context.task_id, context.attempt, context.lease_token)
    return context.attempt


@task(takes_context=True, concurrency_key=lambda n, key, seconds=0.01: key, key_rate="4/2s")
def ledger_key_rated(context: TaskContext, n: int, key: str | None, seconds: float = 0.01) -> int:
    """A ledger run whose key starts at most 4 times per 2 s, fleet-wide (burst 1: one
    start every 0.5 s per key), with no limit on how many of a key run at once. A None
    key is not limited."""
    record_run("start", context.task_id, context.attempt, context.lease_token)
    time.sleep(seconds)
    record_run("end", context.task_id, context.attempt, context.lease_token)
    return n
