"""Tasks of tests/test_testing_helpers.py: code a project would test with
django_pgqueue.testing. Handlers record their runs in testapp.Run rows, written on the
handler's connection (inside a TestCase: the test's own transaction)."""

from __future__ import annotations

import os

from django.db import DatabaseError, connection
from django.utils import timezone

from django_pgqueue import Suspend, TaskContext, task
from tests.testapp.models import Run


def _record(context: TaskContext, label: str) -> None:
    Run.objects.create(
        task_id=context.task_id,
        attempt=context.attempt,
        label=label,
        pid=os.getpid(),
        started_at=timezone.now(),
    )


@task(queue="emails", takes_context=True)
def send_receipt(context: TaskContext, order_id: int, template: str = "receipt") -> str:
    _record(context, f"receipt {order_id}")
    return f"{template} for order {order_id}"


@task(takes_context=True)
def remember(context: TaskContext, label: str) -> str:
    _record(context, label)
    return label


@task(queue="reports", takes_context=True)
def build_report(context: TaskContext, label: str) -> str:
    _record(context, label)
    return label


def _explode(attempt: int) -> None:
    raise ValueError(f"payment provider refused (attempt {attempt})")


@task(takes_context=True, max_attempts=3)
def charge(context: TaskContext, order_id: int) -> None:
    _record(context, f"charge {order_id}")
    _explode(context.attempt)


@task(takes_context=True, max_attempts=3, backoff=3600)
def charge_later(context: TaskContext, order_id: int) -> None:
    """Fails; its retry comes an hour later."""
    _record(context, f"charge later {order_id}")
    _explode(context.attempt)


@task(takes_context=True, max_attempts=1)
def breaks_its_transaction(context: TaskContext) -> None:
    """Records a run, then a statement fails (and is caught) and the handler raises."""
    _record(context, "before the bad statement")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")
    except DatabaseError:
        pass
    raise RuntimeError("gave up after a failed statement")


@task(takes_context=True)
def await_approval(context: TaskContext, order_id: int) -> dict:
    """Suspends until the "approved" signal arrives; returns its payload."""
    if context.wake is None:
        raise Suspend("approved", checkpoint={"order": order_id})
    _record(context, f"approved {order_id}")
    return {"payload": context.signals["approved"], "checkpoint": context.checkpoint}


@task(takes_context=True)
def fan_out(context: TaskContext, labels: list[str]) -> int:
    """Enqueues one follow-up per label when its transaction commits."""
    for label in labels:
        remember.enqueue_on_commit(label)
    return len(labels)


@task
async def count_seen(label: str) -> int:
    """An async handler reading the ORM: counts the Run rows labelled ``label``."""
    return await Run.objects.filter(label=label).acount()
