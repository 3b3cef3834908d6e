"""Enqueue: what gets written, in which transaction, and what is refused."""

import re
from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_pgqueue import InvalidTaskError, call, task
from django_pgqueue.models import Task
from django_pgqueue.tasking.registry import registry
from tests import tasks

pytestmark = pytest.mark.django_db

ONE_HOUR = timedelta(hours=1)


def test_enqueue_inserts_a_pending_row_with_the_task_defaults():
    task_id = tasks.fail_always.enqueue("x")

    row = Task.objects.get(pk=task_id)
    assert row.state == "pending"
    assert row.task_name == "tests.tasks.fail_always"
    assert row.queue == "default"
    assert row.args == ["x"] and row.kwargs == {}
    assert row.attempt == 0 and row.max_attempts == 3
    assert row.retry_policy == {"base": 0.05, "factor": 2.0, "cap": 0.2, "jitter": 0.0}
    assert row.lease_token is None and row.worker_id is None


def test_using_overrides_queue_priority_attempts_timeout_and_backoff():
    task_id = tasks.noop.using(
        queue="emails", priority=100, max_attempts=7, timeout=12, backoff=3
    ).enqueue(n=1)

    row = Task.objects.get(pk=task_id)
    assert (row.queue, row.priority, row.max_attempts) == ("emails", 100, 7)
    assert row.timeout == timedelta(seconds=12)
    assert row.retry_policy == {"base": 3.0, "factor": 1.0, "cap": 3.0, "jitter": 0.0}
    assert row.kwargs == {"n": 1}


def test_a_task_without_a_timeout_gets_the_default_ceiling_of_one_hour():
    task_id = tasks.noop.enqueue(1)

    assert Task.objects.get(pk=task_id).timeout == ONE_HOUR


def test_timeout_none_on_the_task_means_no_ceiling_whatever_the_default():
    with override_settings(PGQUEUE={**settings.PGQUEUE, "DEFAULT_TIMEOUT": 60}):
        definition = task(name="tests.test_enqueue.unbounded", timeout=None)(lambda: None)
    try:
        task_id = definition.enqueue()
    finally:
        registry.unregister(definition.name)

    assert Task.objects.get(pk=task_id).timeout is None


def test_using_timeout_none_removes_the_tasks_ceiling_for_one_call():
    task_id = tasks.async_too_slow.using(timeout=None).enqueue()  # @task(timeout=0.3)

    assert Task.objects.get(pk=task_id).timeout is None


def test_using_without_a_timeout_keeps_the_tasks_own():
    task_id = tasks.async_too_slow.using(priority=5).enqueue()  # @task(timeout=0.3)

    assert Task.objects.get(pk=task_id).timeout == timedelta(seconds=0.3)


def test_default_timeout_none_in_settings_removes_the_default_ceiling():
    with override_settings(PGQUEUE={**settings.PGQUEUE, "DEFAULT_TIMEOUT": None}):
        definition = task(name="tests.test_enqueue.no_default_ceiling")(lambda: None)
    try:
        task_id = definition.enqueue()
    finally:
        registry.unregister(definition.name)

    assert Task.objects.get(pk=task_id).timeout is None


def test_delay_is_added_to_the_database_clock():
    task_id = tasks.noop.using(delay=60).enqueue()

    with connection.cursor() as cursor:
        cursor.execute("SELECT run_at - enqueued_at FROM pgqueue_task WHERE id = %s", [task_id])
        (gap,) = cursor.fetchone()
    assert gap == timedelta(seconds=60)


def test_run_at_is_stored_as_given():
    when = timezone.now() + timedelta(hours=1)

    task_id = tasks.noop.using(run_at=when).enqueue()

    assert Task.objects.get(pk=task_id).run_at == when


def test_enqueue_in_a_rolled_back_block_leaves_no_row():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.noop.enqueue(1)
        raise RuntimeError("roll back")

    assert Task.objects.count() == 0


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((object(),), {}, "args[0]: Unsupported type: <class 'object'>"),
        ((float("nan"),), {}, "NaN"),
        (("a\x00b",), {}, "NUL"),
        (({1: "x"},), {}, "dict key 1 is a int"),
        ((), {"when": datetime(2026, 1, 1)},
         "kwargs['when']: Unsupported type: <class 'datetime.datetime'>"),
        (([{"deep": {float("inf")}}],), {}, "args[0][0]['deep']: Unsupported type: <class 'set'>"),
    ],
)
def test_arguments_that_are_not_plain_json_are_refused_and_nothing_is_written(
    args, kwargs, message
):
    with pytest.raises(
        InvalidTaskError, match=re.escape(message)
    ):
        tasks.noop.enqueue(*args, **kwargs)

    assert Task.objects.count() == 0


@pytest.mark.parametrize("priority", [101, -101, 1.5, "high"])
def test_priority_outside_the_range_is_refused(priority):
    with pytest.raises(InvalidTaskError, match="priority"):
        tasks.noop.using(priority=priority).enqueue()
    assert Task.objects.count() == 0


def test_unknown_option_is_a_type_error_naming_the_valid_ones():
    with pytest.raises(TypeError, match=r"unknown enqueue option\(s\) \['prio'\].*priority"):
        tasks.noop.using(prio=5)


def test_naive_run_at_is_refused_under_use_tz():
    with pytest.raises(InvalidTaskError, match="naive datetime"):
        tasks.noop.using(run_at=datetime(2030, 1, 1, 12, 0)).enqueue()
    assert Task.objects.count() == 0


def test_run_at_and_delay_together_are_refused():
    with pytest.raises(InvalidTaskError, match="either run_at or delay"):
        tasks.noop.using(run_at=timezone.now(), delay=5)


@pytest.mark.parametrize("queue", ["", "has space", "x" * 101, None])
def test_invalid_queue_names_are_refused(queue):
    with pytest.raises(InvalidTaskError, match="queue"):
        tasks.noop.using(queue=queue)


def test_unique_key_returns_the_live_task_instead_of_inserting_another():
    first = tasks.noop.using(unique_key="order-7").enqueue(1)
    second = tasks.noop.using(unique_key="order-7").enqueue(2)

    assert second == first
    assert Task.objects.count() == 1


def test_unique_key_is_free_again_once_the_task_is_terminal():
    first = tasks.noop.using(unique_key="order-8").enqueue(1)
    Task.objects.filter(pk=first).update(state="succeeded", finished_at=timezone.now())

    second = tasks.noop.using(unique_key="order-8").enqueue(2)

    assert second != first
    assert Task.objects.count() == 2


def test_enqueue_many_inserts_every_call_in_order_in_one_statement(django_assert_num_queries):
    calls = [1, (2,), {"n": 3}, call(n=4)]

    with django_assert_num_queries(1):
        ids = tasks.noop.enqueue_many(calls)

    rows = {row.pk: row for row in Task.objects.all()}
    assert [(rows[i].args, rows[i].kwargs) for i in ids] == [
        ([1], {}),
        ([2], {}),
        ([], {"n": 3}),
        ([], {"n": 4}),
    ]
    assert ids == sorted(ids)


def test_enqueue_many_returns_existing_ids_for_live_unique_keys():
    existing = tasks.noop.using(unique_key="k1").enqueue(0)

    ids = tasks.noop.using(unique_key="k1").enqueue_many([1, 2])

    assert ids == [existing, existing]
    assert Task.objects.count() == 1


def test_enqueue_many_refuses_the_whole_batch_when_one_item_is_bad():
    with pytest.raises(InvalidTaskError, match=r"item 2: args\[0\]"):
        tasks.noop.enqueue_many([1, 2, object()])
    assert Task.objects.count() == 0


def test_enqueue_on_commit_returns_the_id_now_and_inserts_at_commit(
    django_capture_on_commit_callbacks,
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        task_id = tasks.noop.enqueue_on_commit(5)
        assert not Task.objects.filter(pk=task_id).exists()

    for callback in callbacks:
        callback()
    assert Task.objects.get(pk=task_id).args == [5]


def test_enqueue_on_commit_in_a_rolled_back_block_inserts_nothing(
    django_capture_on_commit_callbacks,
):
    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        tasks.noop.enqueue_on_commit(5)
        raise RuntimeError("roll back")
    assert callbacks == []
    assert Task.objects.count() == 0


def test_the_enqueuing_trace_context_is_captured_in_metadata():
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("tests")
    with tracer.start_as_current_span("view") as span:
        task_id = tasks.noop.enqueue(1)
        trace_id = format(span.get_span_context().trace_id, "032x")

    traceparent = Task.objects.get(pk=task_id).metadata["traceparent"]
    assert traceparent.split("-")[1] == trace_id


def test_no_trace_context_means_no_traceparent():
    task_id = tasks.noop.enqueue(1)

    assert "traceparent" not in Task.objects.get(pk=task_id).metadata
