"""Django's own Tasks tests (its tests/tasks package, extracted by run.py), run against
PgQueueBackend.

Django writes one test case per reference backend. Three of them describe what any
backend must do, and are re-run here with TASKS pointing at PgQueueBackend:

- ``DummyBackendTestCase``: a backend that stores tasks without running them, which is
  what this queue is until a worker runs.
- ``ImmediateBackendTestCase``: a backend that runs each task, and whose result,
  signals and log lines the tests read back. A burst worker runs each task before
  ``enqueue`` returns (tests_django/backends.py).
- ``TaskTestCase``: the Task API (using, get_result, errors) on the default backend.

Each class names the tests it replaces or skips, with the reason; the rest run as
Django wrote them. docs/tasks-framework.md lists the same differences.
``test_custom_backend`` is not run: it tests BaseTaskBackend with backends of its own.
"""

from __future__ import annotations

from unittest import skip

from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist
from django.test import TestCase, TransactionTestCase, override_settings
from django.utils import timezone
from tasks import tasks as django_tasks
from tasks import test_dummy_backend, test_immediate_backend, test_tasks

from django_pgqueue.backends import PgQueueBackend
from tests_django.backends import WorkerOnEnqueueBackend, run_burst_worker

INSPECTABLE = "tests_django.backends.InspectablePgQueueBackend"
WORKER_ON_ENQUEUE = "tests_django.backends.WorkerOnEnqueueBackend"
# One try per task, as the reference backends: a failed task is FAILED at once.
ONE_TRY = {"max_attempts": 1}

RUN_BY_A_WORKER = (
    "a task runs in a worker, not in the caller of enqueue(): a KeyboardInterrupt the task "
    "raises is recorded as its failure, the worker goes on, and enqueue() returns normally"
)
RESULTS_ARE_ROWS = (
    "DummyBackend hands out its stored result objects, and the test edits one to fake an "
    "outcome; here the stored result is the row. The ImmediateBackend tests see refresh() "
    "pick up a worker's real outcome"
)
HAS_GET_RESULT = (
    "PgQueueBackend supports get_result() and refresh() (supports_get_result); the "
    "DummyBackend and TaskTestCase tests of get_result and refresh run against it"
)
HAS_DEFER = "PgQueueBackend supports run_after (supports_defer): see test_accepts_run_after"
SYNC_READ_IN_ASYNC = (
    "the test reads results synchronously inside async code (get_result(), refresh(), "
    "the results hook); a database read there raises SynchronousOnlyOperation, as with "
    "any database-backed backend. Async code uses aget_result() and arefresh(): see "
    "test_async_reads"
)


@override_settings(TASKS={"default": {"BACKEND": INSPECTABLE, "QUEUES": []}})
class QueueBeforeAWorkerRan(test_dummy_backend.DummyBackendTestCase, TestCase):
    """The queue as callers see it before a worker ran: READY results, read back."""

    def test_using_correct_backend(self) -> None:  # replaces: asserted DummyBackend
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], PgQueueBackend)
        self.assertEqual(default_task_backend.alias, "default")
        self.assertEqual(default_task_backend.options, {})

    async def test_async_reads(self) -> None:
        """Replaces the async tests that read synchronously (SYNC_READ_IN_ASYNC)."""
        result = await django_tasks.noop_task.aenqueue(1, two=3)

        fetched = await default_task_backend.aget_result(result.id)
        await fetched.arefresh()

        self.assertEqual(fetched, result)
        self.assertEqual(fetched.status, TaskResultStatus.READY)
        with self.assertRaises(TaskResultDoesNotExist):
            await django_tasks.noop_task.aget_result("123")

    @skip(RESULTS_ARE_ROWS)
    def test_refresh_result(self) -> None: ...

    @skip(RESULTS_ARE_ROWS)
    async def test_refresh_result_async(self) -> None: ...

    @skip(SYNC_READ_IN_ASYNC)
    async def test_enqueue_task_async(self) -> None: ...

    @skip(SYNC_READ_IN_ASYNC)
    async def test_get_missing_result(self) -> None: ...


@override_settings(
    TASKS={"default": {"BACKEND": WORKER_ON_ENQUEUE, "QUEUES": [], "OPTIONS": ONE_TRY}}
)
class WorkerRunsEachTask(test_immediate_backend.ImmediateBackendTestCase, TransactionTestCase):
    """Each task is run by a real worker; results, signals and log lines are read back."""

    def test_using_correct_backend(self) -> None:  # replaces: asserted ImmediateBackend
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], PgQueueBackend)
        self.assertEqual(default_task_backend.alias, "default")
        self.assertEqual(default_task_backend.options, ONE_TRY)

    def test_accepts_run_after(self) -> None:  # replaces test_cannot_pass_run_after
        later = django_tasks.noop_task.using(run_after=timezone.now())

        default_task_backend.validate_task(later)

        self.assertIs(default_task_backend.supports_defer, True)

    def test_waits_until_transaction_commit(self) -> None:
        """Replaces ImmediateBackendTransactionTestCase's test, which expects the task to
        run inside the caller's transaction: here enqueue() joins that transaction, and
        no worker can see the task before it commits."""
        with transaction.atomic():
            result = django_tasks.noop_task.enqueue()
            self.assertEqual(result.status, TaskResultStatus.READY)

        run_burst_worker(["default"])
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    @skip(RUN_BY_A_WORKER)
    def test_throws_keyboard_interrupt(self) -> None: ...

    @skip(HAS_GET_RESULT)
    async def test_cannot_get_result(self) -> None: ...

    @skip(HAS_GET_RESULT)
    async def test_cannot_refresh_result(self) -> None: ...

    @skip(HAS_DEFER)
    def test_cannot_pass_run_after(self) -> None: ...


@override_settings(
    TASKS={
        "default": {"BACKEND": INSPECTABLE, "QUEUES": ["default", "queue_1"]},
        "immediate": {"BACKEND": WORKER_ON_ENQUEUE, "QUEUES": [], "OPTIONS": ONE_TRY},
        "missing": {"BACKEND": "does.not.exist"},
    },
    USE_TZ=True,
)
class TaskApiOnTheQueue(test_tasks.TaskTestCase, TransactionTestCase):
    """The Task API, with the queue as the default backend and as "immediate"."""

    def test_using_correct_backend(self) -> None:  # replaces: asserted DummyBackend
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], PgQueueBackend)

    def test_get_backend(self) -> None:  # replaces: asserted DummyBackend, ImmediateBackend
        self.assertEqual(django_tasks.noop_task.backend, "default")
        self.assertIsInstance(django_tasks.noop_task.get_backend(), PgQueueBackend)

        other = django_tasks.noop_task.using(backend="immediate")

        self.assertEqual(other.backend, "immediate")
        self.assertIsInstance(other.get_backend(), WorkerOnEnqueueBackend)

    @skip(SYNC_READ_IN_ASYNC)
    async def test_enqueue_task_async(self) -> None: ...

    @skip(SYNC_READ_IN_ASYNC)
    async def test_get_missing_result(self) -> None: ...

    @skip(SYNC_READ_IN_ASYNC)
    async def test_refresh_result(self) -> None: ...
