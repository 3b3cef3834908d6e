"""The project's signal receivers, as Celery's documentation writes them; each writes
what it was given to the test's ledger."""

import os

from django_pgqueue.celery.signals import (  # was: from celery.signals import ...
    task_failure,
    task_postrun,
    task_prerun,
    task_retry,
    task_success,
)
from tests.ledger import LEDGER_ENV, append, ledger_path


def note(signal, **fields):
    if os.environ.get(LEDGER_ENV):
        append(ledger_path(), {"event": "signal", "signal": signal, "pid": os.getpid(), **fields})


@task_prerun.connect
def task_prerun_handler(sender=None, task_id=None, task=None, args=None, kwargs=None, **kw):
    note("task_prerun", task=sender.name, task_id=task_id, args=list(args), same=task is sender)


@task_postrun.connect
def task_postrun_handler(sender=None, task_id=None, task=None, args=None, kwargs=None,
                         retval=None, state=None, **kw):  # fmt: skip
    note("task_postrun", task=sender.name, task_id=task_id, state=state, retval=repr(retval))


@task_success.connect
def task_success_handler(sender=None, result=None, **kwargs):
    note("task_success", task=sender.name, task_id=sender.request.id, result=repr(result))


@task_failure.connect
def task_failure_handler(sender=None, task_id=None, exception=None, args=None, kwargs=None,
                         traceback=None, einfo=None, **kw):  # fmt: skip
    note("task_failure", task=sender.name, task_id=task_id, exception=repr(exception),
         has_traceback=traceback is not None, einfo=type(einfo.exception).__name__)  # fmt: skip


@task_retry.connect
def task_retry_handler(sender=None, request=None, reason=None, einfo=None, **kwargs):
    note("task_retry", task=sender.name, task_id=request.id, retries=request.retries,
         reason=str(reason))  # fmt: skip
