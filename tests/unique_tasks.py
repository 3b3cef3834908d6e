"""Tasks of the unique-jobs tests (tests/test_unique.py). Worker subprocesses import
this module (TASK_MODULES)."""

import os

from django_pgqueue import TaskContext, task
from tests.ledger import LEDGER_ENV, append


@task(takes_context=True)
def debounced(context: TaskContext, n: int) -> int:
    """Write the arguments this run was given (its claim's) to the ledger file."""
    append(os.environ[LEDGER_ENV], {"task": context.task_id, "n": n})
    return n


@task(unique_for=3600, on_conflict="replace")
def digest(user_id: int, note: str = "") -> None:
    """A task whose calls with a unique_key are unique for an hour and replace a queued
    duplicate, by default."""
