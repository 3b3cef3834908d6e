"""Django's Tasks framework on this queue: TASKS = {"BACKEND": "...PgQueueBackend"}.

Tasks are decorated with the framework's own @task (tests/framework_tasks.py); workers are
real ``runtaskworker`` subprocesses.
"""

import logging
import math
import signal
import sys
from datetime import datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_pgqueue import cancel, get_task
from django_pgqueue import signal as send_signal
from django_pgqueue.backends import PgQueueBackend
from django_pgqueue.core import exceptions as queue_errors
from django_pgqueue.core.compat import (
    FRAMEWORK,
    InvalidTaskBackendError,
    InvalidTaskError,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
    task_finished,
)
from django_pgqueue.core.exceptions import Cancelled
from django_pgqueue.framework import FinishedAnnouncer, LeaseExpired, RecordedError
from django_pgqueue.models import Task
from django_pgqueue.tasking.registry import registry
from tests import framework_tasks, tasks, workflow_tasks
from tests.conftest import wait_until
from tests.factories import TaskFactory
from tests.testapp.models import Run

READY = TaskResultStatus.READY
RUNNING = TaskResultStatus.RUNNING
SUCCESSFUL = TaskResultStatus.SUCCESSFUL
FAILED = TaskResultStatus.FAILED

FAST_LEASE = ("--lease", "2", "--heartbeat", "0.5", "--sweep-interval", "0.25")
MARKER = {"tasks_framework": {"backend": "default", "run_after": None}}

in_transaction = pytest.mark.django_db
with_worker = pytest.mark.django_db(transaction=True)


def run_burst(start_worker, *args: str) -> str:
    worker = start_worker("--burst", *args, wait=False)
    assert worker.wait(60) == 0, worker.log()
    return worker.log()


def wait_finished(result, timeout: float = 30.0):
    """Refresh ``result`` until the worker has finished with it."""

    def finished() -> bool:
        result.refresh()
        return result.is_finished

    wait_until(finished, timeout=timeout, message=f"task {result.id} to finish")
    return result


# -- the contract ---------------------------------------------------------------------
def test_the_backend_supports_defer_priority_get_result_and_async_tasks():
    backend = task_backends["default"]

    assert isinstance(backend, PgQueueBackend)
    assert backend.supports_defer is True
    assert backend.supports_priority is True
    assert backend.supports_get_result is True
    assert backend.supports_async_task is True


def test_decorating_a_framework_task_registers_it_for_workers_under_its_module_path():
    definition = registry.get("tests.framework_tasks.add")

    assert definition.func.framework_task is framework_tasks.add
    assert definition.takes_context is True
    assert registry.get("tests.framework_tasks.async_double").is_async is True


# -- enqueue and results --------------------------------------------------------------
@in_transaction
def test_enqueue_returns_a_ready_result_that_get_result_reads_back_field_by_field():
    result = framework_tasks.add.enqueue(2, b=3)

    fetched = framework_tasks.add.get_result(result.id)

    assert result.status == READY
    assert result.enqueued_at is not None
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None,) * 3
    assert (result.args, result.kwargs) == ([2], {"b": 3})
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    assert result.backend == "default"
    for field in (
        "task", "id", "status", "enqueued_at", "started_at", "finished_at",
        "last_attempted_at", "args", "kwargs", "backend", "errors", "worker_ids",
    ):  # fmt: skip
        assert getattr(fetched, field) == getattr(result, field), field
    assert fetched == result


@in_transaction
def test_a_deferred_prioritised_task_on_another_queue_round_trips():
    run_after = timezone.now() + timedelta(hours=1)

    result = framework_tasks.send_email.using(priority=-5, run_after=run_after).enqueue("a@b")

    fetched = framework_tasks.send_email.get_result(result.id)
    assert fetched == result
    assert fetched.task.run_after == run_after
    assert (fetched.task.priority, fetched.task.queue_name) == (-5, "emails")
    row = Task.objects.get(pk=int(result.id))
    assert (row.run_at, row.priority, row.queue) == (run_after, -5, "emails")


@in_transaction
def test_the_retry_policy_and_timeout_from_options_are_frozen_on_the_row():
    default = framework_tasks.add.enqueue(1, 1)
    patient = framework_tasks.add.using(backend="patient").enqueue(1, 1)

    default_row = Task.objects.get(pk=int(default.id))
    patient_row = Task.objects.get(pk=int(patient.id))
    assert default_row.max_attempts == 3
    assert default_row.retry_policy == {"base": 0.05, "factor": 1.0, "cap": 0.05, "jitter": 0.0}
    assert default_row.timeout == timedelta(hours=1)  # DEFAULT_TIMEOUT
    assert patient_row.max_attempts == 2
    assert patient_row.retry_policy == {"base": 3600, "factor": 1, "cap": 3600, "jitter": 0}
    assert patient_row.timeout == timedelta(seconds=1)
    assert patient.backend == "patient"


@in_transaction
def test_enqueue_joins_the_callers_transaction():
    before = Task.objects.count()

    with pytest.raises(RuntimeError), transaction.atomic():
        framework_tasks.add.enqueue(1, 2)
        raise RuntimeError("roll back")

    assert Task.objects.count() == before


@in_transaction
def test_a_cancelled_task_reads_failed():
    result = framework_tasks.add.enqueue(1, 2)

    cancel(int(result.id))
    result.refresh()

    assert result.status == FAILED
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


@in_transaction
def test_a_task_cancelled_before_it_started_lists_a_cancelled_error():
    result = framework_tasks.add.enqueue(1, 2)

    cancel(int(result.id))
    result.refresh()

    assert [e.exception_class for e in result.errors] == [Cancelled]
    assert f"task {result.id} was cancelled before it started" in result.errors[0].traceback


@in_transaction
def test_a_cancelled_task_whose_handler_raised_its_own_error_ends_with_a_cancelled_error():
    row = TaskFactory(
        task_name="tests.framework_tasks.fail",
        metadata=MARKER,
        state="cancelled",
        attempt=1,
        errors=[error_entry("builtins.ValueError", "stopping as asked")],
    )

    result = task_backends["default"].get_result(str(row.pk))

    assert [e.exception_class for e in result.errors] == [ValueError, Cancelled]
    assert f"task {row.pk} was cancelled after attempt 1" in result.errors[1].traceback
    assert result.attempts == 1


@in_transaction
def test_a_cancellation_the_worker_recorded_is_not_listed_twice():
    row = TaskFactory(
        task_name="tests.framework_tasks.fail",
        metadata=MARKER,
        state="cancelled",
        attempt=1,
        errors=[error_entry("Cancelled", "cancelled")],
    )

    result = task_backends["default"].get_result(str(row.pk))

    assert [e.exception_class for e in result.errors] == [Cancelled]


@in_transaction
def test_aenqueue_aget_result_and_arefresh_work_from_async_code():
    async def scenario():
        result = await framework_tasks.add.aenqueue(4, 5)
        fetched = await framework_tasks.add.aget_result(result.id)
        await fetched.arefresh()
        return result, fetched

    result, fetched = async_to_sync(scenario)()

    assert fetched == result
    assert Task.objects.get(pk=int(result.id)).args == [4, 5]


# -- validation -----------------------------------------------------------------------
@in_transaction
def test_a_queue_outside_the_backends_queues_is_refused_with_the_frameworks_error():
    before = Task.objects.count()

    with pytest.raises(InvalidTaskError, match="Queue 'nope' is not valid for backend"):
        framework_tasks.add.using(queue_name="nope").enqueue(1, 2)

    assert Task.objects.count() == before


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue_name": "nope"}, "Queue 'nope' is not valid for backend"),
        ({"priority": 101}, "priority must be a whole number between -100 and 100"),
        ({"takes_context": True}, "does not have a first argument of 'context'"),
    ],
)
def test_decoration_validates_the_task_with_the_frameworks_errors(options, message):
    with pytest.raises(InvalidTaskError, match=message):
        task(**options)(framework_tasks.plain)

    assert "tests.framework_tasks.plain" not in registry


@pytest.mark.parametrize(
    ("qualname", "message"),
    [
        ("f" * 250, "it is 272 characters long, and a task name holds at most 255"),
        ("nul\x00name", "must not contain NUL characters"),
    ],
    ids=["too long", "NUL"],
)
def test_registering_a_task_whose_module_path_cannot_be_a_task_name_is_refused(qualname, message):
    # given: a module-level function whose dotted path the task_name column cannot hold
    def func() -> None: ...

    func.__module__, func.__qualname__ = "tests.framework_tasks", qualname

    # when: it is decorated as a framework task
    with pytest.raises(InvalidTaskError, match=message) as caught:
        task(func)

    # then: the framework's error says why, and nothing is registered
    assert "its module_path is its task name in the queue" in str(caught.value)
    assert f"tests.framework_tasks.{qualname}" not in registry


@in_transaction
def test_validation_runs_again_on_enqueue():
    narrower = {**settings.TASKS["default"], "QUEUES": ["default"]}

    with (
        override_settings(TASKS={**settings.TASKS, "default": narrower}),
        pytest.raises(InvalidTaskError, match="Queue 'emails' is not valid for backend"),
    ):
        framework_tasks.send_email.enqueue("a@b")


@in_transaction
def test_arguments_follow_the_frameworks_json_rules():
    result = framework_tasks.send_email.enqueue(("x", "y"), subject=b"hello")

    row = Task.objects.get(pk=int(result.id))
    assert (row.args, row.kwargs) == ([["x", "y"]], {"subject": "hello"})
    assert (result.args, result.kwargs) == (row.args, row.kwargs)


@in_transaction
@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((math.nan, 1), {}, "args\\[0\\]: nan is not valid JSON"),
        ((1, math.inf), {}, "args\\[1\\]: inf is not valid JSON"),
        (("a\x00b",), {}, "must not contain NUL characters"),
        (("x",), {"subject": {1: "one"}}, "dict key 1 is a int"),
    ],
)
def test_values_jsonb_would_reject_or_change_are_refused_at_enqueue(args, kwargs, message):
    before = Task.objects.count()

    with pytest.raises(queue_errors.InvalidTaskError, match=message) as caught:
        framework_tasks.send_email.enqueue(*args, **kwargs)

    assert "cannot enqueue tests.framework_tasks.send_email" in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert Task.objects.count() == before


@in_transaction
def test_a_value_with_no_json_form_is_refused_with_a_type_error():
    with pytest.raises(TypeError, match="arguments must be JSON values"):
        framework_tasks.send_email.enqueue(datetime(2030, 1, 1))


def test_unknown_options_are_refused_when_the_backend_is_built():
    with pytest.raises(InvalidTaskBackendError, match=r"unknown key\(s\) \['retries'\]"):
        PgQueueBackend("broken", {"OPTIONS": {"retries": 3}})
    with pytest.raises(InvalidTaskBackendError, match="max_attempts must be an int >= 1"):
        PgQueueBackend("broken", {"OPTIONS": {"max_attempts": 0}})
    with pytest.raises(InvalidTaskBackendError, match="not a valid queue name"):
        PgQueueBackend("broken", {"QUEUES": ["no spaces please"]})


def test_check_warns_about_queues_no_default_worker_serves():
    backend = PgQueueBackend("default", settings.TASKS["default"])

    messages = list(backend.check())

    assert [m.id for m in messages] == ["django_pgqueue.W101"]
    assert "['emails']" in messages[0].msg


# -- reading results ------------------------------------------------------------------
@in_transaction
@pytest.mark.parametrize("result_id", ["999999999", "abc", "", "-1", "1.5", "9" * 20, "١٢"])
def test_get_result_of_an_unknown_or_malformed_id_raises_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result_id)


@in_transaction
def test_get_result_of_a_native_task_raises_does_not_exist():
    native_id = tasks.noop.enqueue(1)

    with pytest.raises(TaskResultDoesNotExist, match="django_pgqueue's own API"):
        task_backends["default"].get_result(str(native_id))


@in_transaction
def test_get_result_through_another_task_raises_the_frameworks_mismatch():
    result = framework_tasks.add.enqueue(1, 2)

    with pytest.raises(TaskResultMismatch):
        framework_tasks.send_email.get_result(result.id)


@in_transaction
def test_get_result_never_imports_the_module_a_row_names(tmp_path, monkeypatch):
    mark = tmp_path / "imported"
    monkeypatch.setenv("PGQUEUE_TEST_IMPORT_MARK", str(mark))
    row = TaskFactory(task_name="tests.framework_trap.trap", metadata=MARKER)

    with pytest.raises(TaskResultDoesNotExist, match="not registered in this process"):
        task_backends["default"].get_result(str(row.pk))

    assert "tests.framework_trap" not in sys.modules
    assert not mark.exists()


# -- signals at enqueue ---------------------------------------------------------------
@in_transaction
def test_task_enqueued_is_sent_with_the_backend_class_and_the_result():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result))

    task_enqueued.connect(receiver)
    try:
        result = framework_tasks.add.enqueue(1, 2)
    finally:
        task_enqueued.disconnect(receiver)

    assert seen == [(PgQueueBackend, result)]
    assert seen[0][1] is result


@in_transaction
def test_a_task_enqueued_receiver_that_raises_does_not_fail_the_enqueue():
    result = framework_tasks.noisy.enqueue()

    assert Task.objects.filter(pk=int(result.id), state="pending").exists()


# -- with a worker --------------------------------------------------------------------
@pytest.mark.slow
@with_worker
def test_a_worker_runs_a_framework_task_and_refresh_shows_the_outcome(start_worker):
    result = framework_tasks.add.enqueue(2, 3)

    run_burst(start_worker)
    result.refresh()

    assert result.status == SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1
    assert result.errors == []
    assert len(result.worker_ids) == 1
    assert result.started_at is not None and result.last_attempted_at is not None
    assert result.enqueued_at <= result.started_at <= result.finished_at


@with_worker
def test_the_context_sees_attempt_1_and_its_running_result(start_worker):
    result = framework_tasks.describe_context.enqueue(label="hello")

    run_burst(start_worker)
    result.refresh()

    seen = result.return_value
    assert seen["attempt"] == 1
    assert seen["id"] == result.id
    assert seen["status"] == "RUNNING"
    assert seen["module_path"] == "tests.framework_tasks.describe_context"
    assert (seen["queue_name"], seen["priority"], seen["backend"]) == ("default", 0, "default")
    assert (seen["args"], seen["kwargs"]) == ([], {"label": "hello"})
    assert seen["worker_ids"] == result.worker_ids
    assert seen["started"] is True


@with_worker
def test_async_tasks_run_on_the_workers_event_loop(start_worker):
    doubled = framework_tasks.async_double.enqueue(21)
    described = framework_tasks.async_describe.enqueue()

    run_burst(start_worker)
    doubled.refresh()
    described.refresh()

    assert (doubled.status, doubled.return_value) == (SUCCESSFUL, 42)
    assert described.return_value == {"attempt": 1, "status": "RUNNING"}


@with_worker
def test_higher_priority_framework_tasks_run_first(start_worker):
    low = framework_tasks.record.using(priority=-10).enqueue("low")
    mid = framework_tasks.record.enqueue("mid")
    high = framework_tasks.record.using(priority=50).enqueue("high")

    run_burst(start_worker, "--concurrency", "1")

    order = list(Run.objects.values_list("task_id", flat=True))
    assert order == [int(high.id), int(mid.id), int(low.id)]


@pytest.mark.slow
@with_worker
def test_a_deferred_task_does_not_start_before_run_after(start_worker):
    run_after = timezone.now() + timedelta(seconds=2)
    result = framework_tasks.record.using(run_after=run_after).enqueue("later")
    start_worker()

    wait_finished(result)

    assert result.status == SUCCESSFUL
    assert result.started_at >= run_after
    assert Run.objects.get(task_id=int(result.id)).started_at >= run_after


@with_worker
def test_a_task_on_another_queue_runs_on_a_worker_serving_that_queue(start_worker):
    result = framework_tasks.send_email.enqueue("a@b", subject="hi")

    run_burst(start_worker, "--queues", "default,emails")
    result.refresh()

    assert result.return_value == "sent 'hi' to a@b"


@with_worker
def test_a_failing_task_ends_failed_with_each_attempts_exception_and_traceback(start_worker):
    result = framework_tasks.fail.enqueue("kaput")
    start_worker()

    wait_finished(result)

    assert result.status == FAILED
    assert result.attempts == 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 3
    assert result.errors[0].exception_class is ValueError
    assert "ValueError: kaput" in result.errors[-1].traceback
    assert "in fail" in result.errors[-1].traceback
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


@with_worker
def test_a_retry_then_success_is_visible_through_refresh(start_worker):
    result = framework_tasks.fail_until.enqueue(3)
    start_worker()

    wait_finished(result)

    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 3, 3)
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"] * 2
    assert "not yet (attempt 1)" in result.errors[0].traceback
    assert "not yet (attempt 2)" in result.errors[1].traceback


@with_worker
def test_a_task_waiting_for_its_retry_reads_ready_with_its_earlier_errors(start_worker):
    result = framework_tasks.fail.using(backend="patient").enqueue("first try")
    start_worker()

    retrying = Task.objects.filter(pk=int(result.id), attempt=1, state="scheduled")
    wait_until(retrying.exists)
    result.refresh()

    assert result.status == READY
    assert result.attempts == 1
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"]
    assert "first try" in result.errors[0].traceback
    assert result.finished_at is None
    with pytest.raises(ValueError, match="not finished yet"):
        _ = result.return_value


@pytest.mark.slow
@with_worker
def test_the_timeout_from_options_ends_an_overrunning_attempt_as_a_timeout_error(start_worker):
    result = framework_tasks.async_sleep.using(backend="patient").enqueue(30)
    start_worker()

    retrying = Task.objects.filter(pk=int(result.id), attempt=1, state="scheduled")
    wait_until(retrying.exists)
    result.refresh()

    assert result.status == READY
    assert [e.exception_class for e in result.errors] == [TimeoutError]


@pytest.mark.slow
@with_worker
def test_crash_recovery_is_visible_through_refresh(start_worker):
    result = framework_tasks.crash_on_first_attempt.enqueue()
    doomed = start_worker(*FAST_LEASE, wait=False)
    assert doomed.wait(30) == -signal.SIGKILL

    survivor = start_worker(*FAST_LEASE)
    wait_finished(result)

    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 2, 2)
    assert result.errors[0].exception_class is LeaseExpired
    assert f"-{doomed.pid}-" in result.worker_ids[0]
    assert f"-{survivor.pid}-" in result.worker_ids[1]


@with_worker
def test_return_values_follow_the_frameworks_json_rules(start_worker):
    result = framework_tasks.returns_tuple.enqueue()

    run_burst(start_worker)
    result.refresh()

    assert result.return_value == [1, "two", "three"]


@with_worker
def test_a_return_value_that_cannot_be_stored_fails_as_a_type_error_without_retrying(
    start_worker,
):
    result = framework_tasks.returns_nan.enqueue()

    run_burst(start_worker)
    result.refresh()

    assert (result.status, result.attempts) == (FAILED, 1)
    assert result.errors[0].exception_class is TypeError
    assert "result: nan is not valid JSON" in result.errors[0].traceback


@with_worker
def test_a_return_value_of_a_type_json_lacks_fails_in_the_frameworks_words(start_worker):
    # Django's own test (test_complex_return_value) and log searches look for
    # normalize_json's "Unsupported type"; the message also names the value.
    result = framework_tasks.returns_a_function.enqueue()

    run_burst(start_worker)
    result.refresh()

    assert (result.status, result.attempts) == (FAILED, 1)
    assert result.errors[0].exception_class is TypeError
    assert "result: Unsupported type: <class 'function'>: <function " in result.errors[0].traceback
    assert "is not JSON serializable" in result.errors[0].traceback


@with_worker
def test_native_and_framework_tasks_share_the_table_and_the_worker(start_worker):
    native_id = tasks.noop.enqueue(7)
    result = framework_tasks.add.enqueue(3, 4)

    run_burst(start_worker)

    assert Task.objects.get(pk=native_id).result == 7
    assert Task.objects.get(pk=int(result.id)).result == 7
    assert Task.objects.get(pk=int(result.id)).task_name == "tests.framework_tasks.add"


@with_worker
def test_a_worker_never_imports_a_module_named_by_a_row(start_worker, tmp_path, monkeypatch):
    mark = tmp_path / "imported"
    monkeypatch.setenv("PGQUEUE_TEST_IMPORT_MARK", str(mark))
    trap = TaskFactory(task_name="tests.framework_trap.trap", metadata=MARKER)
    known = framework_tasks.add.enqueue(1, 1)

    run_burst(start_worker)

    trap.refresh_from_db()
    assert (trap.state, trap.attempt) == ("pending", 0)
    assert Task.objects.get(pk=int(known.id)).state == "succeeded"
    assert not mark.exists()


# -- signals from the worker ----------------------------------------------------------
def signal_labels(result) -> list[str]:
    return list(Run.objects.filter(task_id=int(result.id)).values_list("label", flat=True))


@with_worker
def test_task_started_and_task_finished_are_sent_with_the_backend_class(start_worker):
    result = framework_tasks.observed.enqueue()
    start_worker()

    wait_until(lambda: len(signal_labels(result)) == 3)

    assert signal_labels(result) == [
        "enqueued:READY:PgQueueBackend",
        "started:RUNNING:PgQueueBackend",
        "finished:SUCCESSFUL:PgQueueBackend",
    ]
    assert list(Run.objects.values_list("attempt", flat=True)) == [0, 1, 1]


@with_worker
def test_task_finished_is_sent_once_after_the_last_attempt_fails(start_worker):
    result = framework_tasks.observed.enqueue(fail=True)
    start_worker()

    wait_until(lambda: "finished:FAILED:PgQueueBackend" in signal_labels(result))
    wait_finished(result)

    assert signal_labels(result) == [
        "enqueued:READY:PgQueueBackend",
        *["started:RUNNING:PgQueueBackend"] * 3,
        "finished:FAILED:PgQueueBackend",
    ]
    assert Run.objects.last().attempt == 3


@with_worker
def test_receivers_that_raise_change_neither_the_outcome_nor_the_worker(start_worker):
    worker = start_worker()
    noisy = framework_tasks.noisy.enqueue()

    wait_finished(noisy)
    wait_until(lambda: "RuntimeError: finished receiver fails" in worker.log())
    after = wait_finished(framework_tasks.add.enqueue(1, 2))

    assert (noisy.status, noisy.return_value, noisy.attempts) == (
        SUCCESSFUL,
        "done despite the receivers",
        1,
    )
    assert after.return_value == 3
    assert worker.proc.poll() is None
    assert "RuntimeError: started receiver fails" in worker.log()


def error_entry(kind: str, message: str) -> dict:
    """An error entry as the worker writes it for an attempt (attempt 1)."""
    return {
        "attempt": 1,
        "type": kind,
        "message": message,
        "traceback": f"Traceback (most recent call last):\n  in fail\n{kind}: {message}\n",
        "worker_id": "host-1-abc123",
    }


def announce(task_id: int) -> None:
    """Send task_finished for a settled task as a worker does, and wait until it is sent."""
    announcer = FinishedAnnouncer()
    announcer.put(task_id)
    announcer.stop(timeout=10)


@with_worker  # the announcer reads the row on its own connection: it must be committed
def test_the_frameworks_log_line_for_a_failed_task_carries_its_exception(caplog):
    row = TaskFactory(
        task_name="tests.framework_tasks.fail",
        metadata=MARKER,
        state="failed",
        attempt=1,
        finished_at=timezone.now(),
        errors=[error_entry("builtins.ValueError", "kaput")],
    )

    with caplog.at_level(logging.INFO, logger=FRAMEWORK):
        announce(row.pk)

    [record] = [r for r in caplog.records if r.name == FRAMEWORK]
    assert f"Task id={row.pk} path=tests.framework_tasks.fail" in record.getMessage()
    assert record.levelno == logging.ERROR
    assert record.exc_info[0] is ValueError
    assert str(record.exc_info[1]) == "kaput"
    assert "ValueError: kaput" in caplog.text
    assert "in fail" in caplog.text  # the worker's traceback, as a note


@with_worker
def test_task_finished_names_an_exception_class_this_process_never_imported_without_importing_it():
    row = TaskFactory(
        task_name="tests.framework_tasks.fail",
        metadata=MARKER,
        state="failed",
        attempt=1,
        finished_at=timezone.now(),
        errors=[error_entry("tests.framework_trap.Declined", "card declined")],
    )
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(sys.exc_info()[1])

    task_finished.connect(receiver)
    try:
        announce(row.pk)
    finally:
        task_finished.disconnect(receiver)

    assert isinstance(seen[0], RecordedError)
    assert str(seen[0]) == "tests.framework_trap.Declined: card declined"
    assert "tests.framework_trap" not in sys.modules


@with_worker
def test_task_finished_for_a_successful_task_is_sent_outside_any_exception():
    row = TaskFactory(
        task_name="tests.framework_tasks.add",
        metadata=MARKER,
        state="succeeded",
        attempt=1,
        result=3,
        finished_at=timezone.now(),
    )
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((task_result.status, sys.exc_info()))

    task_finished.connect(receiver)
    try:
        announce(row.pk)
    finally:
        task_finished.disconnect(receiver)

    assert seen == [(SUCCESSFUL, (None, None, None))]


# -- waiting work (docs/workflows.md) ---------------------------------------------------
@with_worker
def test_a_framework_task_that_raises_suspend_reads_ready_and_resumes_on_a_signal_to_its_id(
    start_worker,
):
    # Given a framework task that suspends until the signal "approved"
    result = framework_tasks.await_signal.enqueue("approved")
    start_worker()
    wait_until(lambda: get_task(int(result.id)).state == "waiting",
               message="the task to suspend")  # fmt: skip
    result.refresh()
    assert (result.status, result.attempts, result.errors) == (READY, 0, [])

    # When the signal is sent to its result id
    assert send_signal(int(result.id), "approved", {"by": "ops"}) == "resumed"

    # Then it runs again and succeeds, on the attempt the suspension refunded
    wait_finished(result)
    assert result.status == SUCCESSFUL
    assert result.return_value == {"payload": {"by": "ops"}, "attempt": 1}
    assert result.attempts == 1


@with_worker
def test_a_native_task_enqueued_after_a_framework_result_reads_its_return_value(start_worker):
    # Given a framework task, and a native task that waits for it (after= takes the result)
    result = framework_tasks.add.enqueue(2, 3)
    callback = workflow_tasks.collect.using(after=[result]).enqueue("after add")
    assert get_task(callback).state == "waiting"

    # When a worker runs them
    start_worker()
    wait_until(lambda: get_task(callback).state == "succeeded", message="the callback to run")

    # Then the callback ran after the framework task and read its return value
    assert get_task(callback).result == {result.id: ["succeeded", 5]}
    assert get_task(callback).started_at >= get_task(int(result.id)).finished_at
