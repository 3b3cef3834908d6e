"""Tasks for tests/test_faults.py. Worker subprocesses import this module (TASK_MODULES).

Each handler appends one line, "<task id> <attempt>", to a ledger file the test names
(O_APPEND writes of one short line never interleave), so a test can count the runs of
every task without a database write that the fault under test might disturb.
"""

import os
import time
from collections import Counter
from pathlib import Path

from django.db import transaction

from django_pgqueue import TaskContext, task


def _log_run(context: TaskContext, ledger: str) -> None:
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{context.task_id} {context.attempt}\n".encode())
    finally:
        os.close(fd)


def runs(ledger: Path) -> Counter[int]:
    """How many times each task id ran, according to the ledger."""
    if not ledger.exists():
        return Counter()
    return Counter(int(line.split()[0]) for line in ledger.read_text().splitlines())


@task(takes_context=True)
def healthy(context: TaskContext, ledger: str) -> None:
    _log_run(context, ledger)


@task(takes_context=True, max_attempts=1)
def once(context: TaskContext, ledger: str) -> str:
    _log_run(context, ledger)
    return "ran"


@task(takes_context=True, max_attempts=3)
def sleep_then_succeed(context: TaskContext, ledger: str, seconds: float) -> float:
    _log_run(context, ledger)
    time.sleep(seconds)
    return seconds


@task(takes_context=True)
def nap(context: TaskContext, ledger: str, seconds: float) -> None:
    _log_run(context, ledger)
    time.sleep(seconds)


# Outcomes the settle statement cannot store as they are. The bad values are made by the
# handler: enqueue refuses them as arguments.
NUL_MESSAGE = "nul here:\x00:end"
SURROGATE_MESSAGE = "lone surrogate here:\ud800:end"


@task(takes_context=True, max_attempts=1)
def raise_nul_message(context: TaskContext, ledger: str) -> None:
    _log_run(context, ledger)
    raise ValueError(NUL_MESSAGE)


@task(takes_context=True, max_attempts=1)
def raise_lone_surrogate_message(context: TaskContext, ledger: str) -> None:
    _log_run(context, ledger)
    raise ValueError(SURROGATE_MESSAGE)


@task(takes_context=True, max_attempts=1)
def return_huge_int(context: TaskContext, ledger: str) -> int:
    _log_run(context, ledger)
    return 10**5000  # more digits than Python will turn into a string (4300)


@task(takes_context=True, timeout=0.5, max_attempts=1)
def hang_holding_row_lock(context: TaskContext, ledger: str, seconds: float) -> None:
    """Write progress inside its own transaction (locking its own row), then hang."""
    with transaction.atomic():
        context.report_progress({"step": 1})
        _log_run(context, ledger)
        time.sleep(seconds)
