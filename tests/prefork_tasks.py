"""Tasks for tests/test_prefork.py: handlers that run in the prefork pool's processes.

The ones that take a ledger append ``start`` / ``end`` lines to the file named by
PGQUEUE_TEST_LEDGER (tests/ledger.py), with their pid. A ``start`` also lists which
pids of this task's earlier runs are still alive at that moment (``alive``): a run that
overlaps an earlier one, whose process was supposed to be killed first, shows there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from django_pgqueue import Cancelled, TaskContext, task
from tests import ledger


def _start(context: TaskContext) -> None:
    earlier = [
        e["pid"]
        for e in ledger.read(ledger.ledger_path())
        if e["event"] == "start" and e["task"] == context.task_id
    ]
    ledger.append(
        ledger.ledger_path(),
        {
            "event": "start",
            "task": context.task_id,
            "attempt": context.attempt,
            "token": context.lease_token,
            "pid": os.getpid(),
            "t": time.time(),
            "alive": [pid for pid in earlier if _alive(pid)],
        },
    )


def _end(context: TaskContext) -> None:
    ledger.record_run("end", context.task_id, context.attempt, context.lease_token)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@task
def double(n: int) -> dict:
    return {"n": 2 * n, "pid": os.getpid()}


@task
async def async_double(n: int) -> dict:
    await asyncio.sleep(0.01)
    return {"n": 2 * n, "pid": os.getpid()}


@task(max_attempts=1)
def fail(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True)
def sleep(context: TaskContext, seconds: float) -> int:
    """Sleeps ``seconds``, in the ledger."""
    _start(context)
    time.sleep(seconds)
    _end(context)
    return os.getpid()


@task(takes_context=True)
def stubborn_on_first_attempt(context: TaskContext, seconds: float) -> int:
    """On its first attempt, sleeps ``seconds`` and swallows whatever tries to stop it
    (the pool's terminate order included): only SIGKILL ends it. Later attempts return."""
    _start(context)
    if context.attempt == 1:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with contextlib.suppress(BaseException):  # the point of this handler
                time.sleep(max(0.0, end - time.monotonic()))
    _end(context)
    return os.getpid()


@task(takes_context=True)
def slow_on_first_attempt(context: TaskContext, seconds: float) -> int:
    """On its first attempt, sleeps ``seconds``; later attempts return at once."""
    _start(context)
    if context.attempt == 1:
        time.sleep(seconds)
    _end(context)
    return os.getpid()


@task(takes_context=True, max_attempts=1)
def wait_for_cancel_flag(context: TaskContext, limit: float = 30) -> str:
    """Polls ``context.cancel_requested`` only (no database read): it changes only if
    the worker passes the heartbeat's news to this process."""
    _start(context)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if context.cancel_requested:
            raise Cancelled("saw the cancel request")
        time.sleep(0.02)
    return "not cancelled"


@task(max_attempts=1)
def exit_process(code: int) -> None:
    os._exit(code)


@task(max_attempts=1)
def kill_own_process() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
