"""Test helpers for code that enqueues tasks (docs/testing.md).

In a Django ``TestCase`` or a pytest test with the ``db`` fixture (or with committed
data: ``TransactionTestCase``, ``transactional_db``)::

    from django_pgqueue.testing import assert_enqueued, refute_enqueued, run_tasks

    response = client.post("/orders/", {"email": "a@example.com"})
    assert_enqueued(send_receipt, kwargs={}, queue="emails")
    result = run_tasks()                 # the worker's claim, outcome policy and settle
    assert result.counts["success"] == 2

With pytest, the ``pgqueue`` fixture (the plugin ``django_pgqueue.pytest_plugin``)
gives the same functions: ``pgqueue.assert_enqueued(...)``, ``pgqueue.run_tasks()``.
"""

from django_pgqueue.testing.assertions import (
    ENQUEUED_STATES,
    assert_enqueued,
    enqueued,
    refute_enqueued,
)
from django_pgqueue.testing.runner import RunResult, TaskFailed, TaskRun, drain, run_tasks

__all__ = [
    "ENQUEUED_STATES",
    "RunResult",
    "TaskFailed",
    "TaskRun",
    "assert_enqueued",
    "drain",
    "enqueued",
    "refute_enqueued",
    "run_tasks",
]
