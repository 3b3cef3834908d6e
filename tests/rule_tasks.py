"""Tasks with exception rules (retry_on / discard_on) and expiry, for
tests/test_retry_rules.py and tests/test_expiry.py. Worker subprocesses import this
module (TASK_MODULES). Each handler records its runs in testapp.Run rows."""

import time

from django_pgqueue import TaskContext, task
from tests.tasks import _record


class Transient(ConnectionError):
    """A subclass of a retry_on type: retried through its MRO."""


class Fatal(ValueError):
    """A discard_on type."""


class SubFatal(Fatal):
    """A subclass of a discard_on type: discarded through its MRO."""


# The handlers raise by a short name: a row names no class of its own.
ERRORS = {
    "transient": Transient,
    "fatal": Fatal,
    "subfatal": SubFatal,
    "value": ValueError,
    "key": KeyError,
}


@task(takes_context=True, max_attempts=3, backoff=0, discard_on=Fatal)
def discard_fatal(context: TaskContext, kind: str) -> None:
    _record(context, kind)
    raise ERRORS[kind](f"{kind} on attempt {context.attempt}")


@task(takes_context=True, max_attempts=3, backoff=0, retry_on=(ConnectionError, KeyError))
def retry_transient(context: TaskContext, kind: str) -> None:
    _record(context, kind)
    raise ERRORS[kind](f"{kind} on attempt {context.attempt}")


@task(takes_context=True, max_attempts=3, backoff=0, retry_on=Exception, discard_on=Fatal)
def both_rules(context: TaskContext, kind: str) -> None:
    _record(context, kind)
    raise ERRORS[kind](f"{kind} on attempt {context.attempt}")


@task(takes_context=True, max_attempts=3, backoff=0)
def no_rules(context: TaskContext, kind: str) -> None:
    _record(context, kind)
    raise ERRORS[kind](f"{kind} on attempt {context.attempt}")


@task(takes_context=True, max_attempts=3, backoff=0, timeout=0.5, discard_on=TimeoutError)
def too_slow_discarded(context: TaskContext) -> None:
    _record(context)
    time.sleep(5)


@task(takes_context=True, max_attempts=2, backoff=0, timeout=0.5, retry_on=KeyError)
def too_slow_retry_on(context: TaskContext) -> None:
    _record(context)
    time.sleep(5)
@task(takes_context=True)
def expiring(context: TaskContext, label: str = "") -> str:
    _record(context, label)
    return label


@task(takes_context=True, expires=3600)
def expiring_by_default(context: TaskContext, label: str = "") -> str:
    _record(context, label)
    return label
