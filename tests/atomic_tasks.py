"""Tasks of tests/test_atomic.py and tests/test_atomic_chaos.py: handlers that write an
Effect row in the task's database (kept or rolled back with an atomic attempt), and,
where a test needs the runs that really happened, a line in the ledger file
(tests/ledger.py), which no rollback reaches.

Worker subprocesses import this module (TASK_MODULES). A handler told to ``wait_for``
a file waits until the test creates it: the test acts on the task's row meanwhile.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from django_pgqueue import Continue, Retry, Snooze, TaskContext, task
from tests.ledger import LEDGER_ENV, record_run
from tests.testapp.models import Effect


def effect(context: TaskContext, label: str = "") -> Effect:
    return Effect.objects.using(context.database).create(
        task_id=context.task_id,
        attempt=context.attempt,
        token=context.lease_token,
        label=label,
        pid=os.getpid(),
    )


def wait_for_file(path: str | None, timeout: float = 60.0) -> None:
    """Wait until ``path`` exists; say so first, in ``<path>.waiting``."""
    if path is None:
        return
    Path(f"{path}.waiting").touch()
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:g}s")
        time.sleep(0.01)


def _ledger(event: str, context: TaskContext) -> None:
    if os.environ.get(LEDGER_ENV):
        record_run(event, context.task_id, context.attempt, context.lease_token)


@task(takes_context=True, atomic=True, max_attempts=25)
def atomic_effect(
    context: TaskContext,
    n: int,
    seconds: float = 0.0,
    wait_for: str | None = None,
    fail: str | None = None,
    progress: bool = False,
) -> int:
    """One Effect row, then (optionally) a report of progress, a wait and a way to end
    other than success (``fail``: raise, retry, snooze, continue). The ledger file gets
    a start and an end line, when the test set one."""
    _ledger("start", context)
    effect(context, f"n={n}")
    if progress:
        context.report_progress({"n": n, "done": 1})
    wait_for_file(wait_for)
    if seconds:
        time.sleep(seconds)
    if fail == "raise":
        raise RuntimeError(f"task {n} fails")
    if fail == "retry":
        raise Retry(delay=0, reason=f"task {n} retries")
    if fail == "snooze":
        raise Snooze(0)
    if fail == "continue" and context.checkpoint is None:
        raise Continue({"slice": 1})
    _ledger("end", context)
    return n


@task(takes_context=True, max_attempts=25)
def plain_effect(context: TaskContext, n: int, seconds: float = 0.0,
                 wait_for: str | None = None, fail: str | None = None,
                 progress: bool = False) -> int:
    """atomic_effect without atomic=True: what the tests compare it with."""
    return atomic_effect.func(context, n, seconds, wait_for, fail, progress)


@task(takes_context=True, atomic=True)
def atomic_parent(context: TaskContext, n: int, fail: bool = False,
                  unique_key: str | None = None) -> int:
    """Writes an Effect and enqueues a child (which writes its own, and holds
    ``unique_key`` if given), then fails or not."""
    effect(context, f"parent {n}")
    atomic_child.using(unique_key=unique_key).enqueue(n)
    if fail:
        raise RuntimeError("the parent fails after enqueueing its child")
    return n


@task(takes_context=True, atomic=True)
def atomic_child(context: TaskContext, n: int) -> int:
    effect(context, f"child {n}")
    return n


@task(takes_context=True, atomic=True)
def atomic_elsewhere(context: TaskContext, alias: str) -> None:
    """Writes through another database alias than its task's."""
    Effect.objects.using(alias).create(
        task_id=context.task_id, attempt=context.attempt, token=context.lease_token,
        label="elsewhere", pid=os.getpid(),
    )


@task(takes_context=True, atomic=True)
def atomic_reads_elsewhere(context: TaskContext, alias: str) -> int:
    """Reads through another alias (allowed), writes through its own."""
    effect(context, "read elsewhere")
    return Effect.objects.using(alias).count()


@task(takes_context=True)
def idempotency_key(context: TaskContext) -> str:
    """Returns its idempotency key; fails its first attempt."""
    effect(context, context.idempotency_key)
    if context.attempt == 1:
        raise Retry(delay=0)
    return context.idempotency_key


@task(takes_context=True, atomic=True, timeout=0.2)
def atomic_overrun(context: TaskContext) -> None:
    """Writes an Effect, then returns past its timeout."""
    effect(context, "overrun")
    time.sleep(0.3)


@task(takes_context=True, atomic=True)
def atomic_checkpoint(context: TaskContext, fail: bool) -> None:
    context.save_checkpoint({"step": 2})
    context.report_progress({"done": 2})
    if fail:
        raise RuntimeError("fails after saving a checkpoint")



@task(takes_context=True, atomic=True)
def atomic_waits_for_child(context: TaskContext, n: int) -> str:
    """Enqueues a child and waits for it (Suspend), then, woken, reads its result."""
    if context.wake is None:
        effect(context, f"before waiting {n}")
        child = atomic_child.enqueue(n)
        context.wait_for(child)
    (parent,) = context.parent_results().values()
    return f"child {parent['state']}"


@task(takes_context=True, atomic=True)
def atomic_enqueues_into(context: TaskContext, queue: str) -> None:
    """Writes an Effect, then enqueues a child into ``queue``."""
    effect(context, "before the enqueue")
    atomic_child.using(queue=queue).enqueue(1)
