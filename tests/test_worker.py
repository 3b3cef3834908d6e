"""A real worker process running tasks: outcomes, retries, context, routing."""

import signal
import socket
import time
from datetime import datetime, timedelta

import pytest
from django.db.models import Max, Min

from django_pgqueue import cancel, queue_overview
from django_pgqueue.models import Task
from django_pgqueue.ops.operations import retry_now
from tests import tasks
from tests.conftest import wait_until
from tests.factories import TaskFactory
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def run_burst(start_worker, *args: str) -> str:
    worker = start_worker("--burst", *args, wait=False)
    assert worker.wait(60) == 0, worker.log()
    return worker.log()


def test_burst_worker_runs_every_due_task_and_exits(start_worker):
    ids = tasks.noop.enqueue_many(range(50))

    log = run_burst(start_worker)

    assert Task.objects.filter(pk__in=ids, state="succeeded").count() == 50
    assert sorted(Task.objects.values_list("result", flat=True)) == list(range(50))
    assert "success=50" in log


def test_a_failing_task_is_retried_with_backoff_then_dead_lettered_with_every_error(
    start_worker,
):
    task_id = tasks.fail_always.enqueue("kaput")
    worker = start_worker()

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="failed").first())

    worker.stop()
    assert row.attempt == 3
    assert [e["attempt"] for e in row.errors] == [1, 2, 3]
    assert {e["type"] for e in row.errors} == {"builtins.ValueError"}
    assert row.errors[2]["message"] == "kaput on attempt 3"
    assert "Traceback" in row.errors[0]["traceback"] and "fail_always" in row.errors[0]["traceback"]
    assert row.finished_at is not None
    assert Run.objects.filter(task_id=task_id).count() == 3


@pytest.mark.parametrize(
    ("backoff", "spread"),
    [({"base": 600, "factor": 3, "cap": 2000, "jitter": 0}, 0.0),
     ({"base": 600, "factor": 3, "cap": 2000, "jitter": 0.25}, 0.25)],
    ids=["exact", "jitter"],
)  # fmt: skip
def test_each_retry_is_stored_due_after_the_backoff_frozen_at_enqueue(
    start_worker, backoff, spread
):
    """The delay each failure writes: run_at less the time of the settlement that wrote
    it (the error's "at": the same statement's now()). Retried at once by hand, to see
    the next one."""
    task_id = tasks.fail_always.using(backoff=backoff, max_attempts=4).enqueue("kaput")
    start_worker()

    for attempt, expected in [(1, 600), (2, 1800), (3, 2000)]:
        row = wait_until(
            lambda attempt=attempt: Task.objects.filter(
                pk=task_id, state="scheduled", attempt=attempt
            ).first(),
            message=f"the failure of attempt {attempt}",
        )
        (error,) = [e for e in row.errors if e["attempt"] == attempt]
        stored = (row.run_at - datetime.fromisoformat(error["at"])).total_seconds()
        # jsonb keeps the microseconds: "exact" is exact, "jitter" within its spread
        assert expected * (1 - spread) - 1e-6 <= stored <= expected * (1 + spread) + 1e-6
        assert retry_now([task_id]) == [task_id]

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="failed").first())
    assert row.attempt == 4


def test_a_task_that_fails_then_succeeds_keeps_its_earlier_errors(start_worker):
    task_id = tasks.fail_until.enqueue(3)
    start_worker()

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="succeeded").first())

    assert row.result == 3
    assert [e["attempt"] for e in row.errors] == [1, 2]


def test_retry_with_an_explicit_delay_reschedules_the_task(start_worker):
    task_id = tasks.retry_with_delay.enqueue(0.5)
    start_worker()

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="succeeded").first())

    runs = list(Run.objects.filter(task_id=task_id))
    assert row.result == 2
    assert (runs[1].started_at - runs[0].started_at).total_seconds() >= 0.5
    assert row.errors[0]["message"] == "asked to retry later"


def test_snooze_reschedules_without_counting_a_failure(start_worker):
    task_id = tasks.snooze_once.enqueue(0.3)  # max_attempts=1: a failure would dead-letter
    start_worker()

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="succeeded").first())

    assert row.errors == []
    assert row.attempt == 1
    assert Run.objects.filter(task_id=task_id).count() == 2


def test_continue_saves_the_checkpoint_and_resets_the_attempt_budget(start_worker):
    task_id = tasks.sliced.enqueue(4)  # max_attempts=2, but 5 slices
    start_worker()

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="succeeded").first())

    assert row.result == 4
    assert row.checkpoint == {"done": 4}
    labels = list(Run.objects.filter(task_id=task_id).values_list("label", flat=True))
    assert labels == [f"slice from {n}" for n in range(5)]


def test_the_context_carries_the_attempt_and_fenced_writes_land(start_worker):
    task_id = tasks.report.using(timeout=30, queue="default").enqueue()
    start_worker()

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="succeeded").first())

    assert row.result["task_id"] == task_id
    assert row.result["attempt"] == 1
    assert row.result["max_attempts"] == 3
    assert row.result["cancel_requested"] is False
    assert row.result["deadline"] is not None
    assert row.progress == {"step": 1}
    assert row.checkpoint == {"step": 1}


def test_async_handlers_run_on_the_event_loop(start_worker):
    ids = tasks.async_double.enqueue_many(range(5))

    run_burst(start_worker)

    assert sorted(Task.objects.filter(pk__in=ids).values_list("result", flat=True)) == [
        0,
        2,
        4,
        6,
        8,
    ]


def test_an_async_handler_past_its_timeout_is_cancelled_and_recorded_as_timeout(start_worker):
    task_id = tasks.async_too_slow.enqueue()

    run_burst(start_worker)

    row = Task.objects.get(pk=task_id)
    assert row.state == "failed"
    assert row.errors[0]["type"] == "TimeoutError"
    assert row.errors[0]["outcome"] == "timeout"


def test_a_result_that_is_not_json_dead_letters_with_the_reason(start_worker):
    task_id = tasks.return_unserializable.enqueue()

    run_burst(start_worker)

    row = Task.objects.get(pk=task_id)
    assert row.state == "failed" and row.attempt == 1
    assert "result: Unsupported type: <class 'object'>" in row.errors[0]["message"]


def test_stored_arguments_that_do_not_fit_the_function_fail_without_retrying(start_worker):
    bad = TaskFactory(task_name="tests.tasks.noop", args=[1, 2, 3])

    run_burst(start_worker)

    row = Task.objects.get(pk=bad.pk)
    assert row.state == "failed" and row.attempt == 1
    assert "do not fit tests.tasks.noop" in row.errors[0]["message"]


def test_cancelling_a_pending_task_is_immediate():
    task_id = tasks.noop.enqueue(1)

    assert cancel(task_id) == "cancelled"
    assert Task.objects.get(pk=task_id).state == "cancelled"
    assert cancel(task_id) is None


def test_cancelling_a_running_task_is_seen_by_its_handler_and_recorded(start_worker):
    task_id = tasks.wait_for_cancel.enqueue()
    start_worker()
    wait_until(lambda: Run.objects.filter(task_id=task_id).exists())

    assert cancel(task_id) == "cancel_requested"

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="cancelled").first())
    assert row.errors[-1]["outcome"] == "cancelled"


def test_higher_priority_runs_first_then_older_run_at(start_worker):
    low = tasks.record.using(priority=-10).enqueue("low")
    first_mid = tasks.record.enqueue("mid-1")
    high = tasks.record.using(priority=50).enqueue("high")
    second_mid = tasks.record.enqueue("mid-2")

    run_burst(start_worker, "--concurrency", "1")

    order = list(Run.objects.values_list("task_id", flat=True))
    assert order == [high, first_mid, second_mid, low]


def test_unknown_tasks_stay_pending_and_show_as_unroutable(start_worker):
    unknown = TaskFactory(task_name="billing.charge")
    wrong_version = TaskFactory(task_name="tests.versioned", handler_version=7)
    known = tasks.noop.enqueue(1)
    worker = start_worker()
    wait_until(lambda: Task.objects.filter(pk=known, state="succeeded").exists())

    overview = {(r["queue"], r["task_name"]): r for r in queue_overview()}

    worker.stop()
    for stuck in (unknown, wrong_version):
        stuck.refresh_from_db()
        assert (stuck.state, stuck.attempt) == ("pending", 0)
    assert overview[("default", "billing.charge")]["pending_unroutable"] == 1
    assert overview[("default", "tests.versioned")]["pending_unroutable"] == 1
    assert overview[("default", "billing.charge")]["pending_routable"] == 0


def test_a_worker_only_claims_from_its_queues(start_worker):
    mine = tasks.other_queue.enqueue(1)
    not_mine = tasks.noop.enqueue(1)

    run_burst(start_worker, "--queues", "other")

    assert Task.objects.get(pk=mine).state == "succeeded"
    assert Task.objects.get(pk=not_mine).state == "pending"


def test_a_handler_calling_sys_exit_fails_its_task_and_keeps_its_slot(start_worker):
    exiting = tasks.calls_sys_exit.enqueue()
    after = tasks.noop.enqueue_many(range(5))

    run_burst(start_worker, "--concurrency", "1")

    row = Task.objects.get(pk=exiting)
    assert row.state == "failed"
    assert row.errors[0]["type"] == "builtins.SystemExit"
    assert Task.objects.filter(pk__in=after, state="succeeded").count() == 5


def unreachable_database_url() -> str:
    """A URL whose port refuses connections (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgres://postgres@127.0.0.1:{port}/nowhere"


def test_a_signal_before_the_worker_started_says_it_stops_before_starting(start_worker):
    # given: a worker still trying to register, so not started
    worker = start_worker(database_url=unreachable_database_url(), wait=False)
    wait_until(lambda: "database unavailable" in worker.log(), message="a failed registration")

    # when: it is told to stop
    worker.signal(signal.SIGTERM)

    # then: it says it stops before starting, not that handlers get a grace period
    assert worker.wait(15) == 0, worker.log()
    log = worker.log()
    assert "signal SIGTERM: stopping before the worker has started" in log
    assert "to finish" not in log


@pytest.mark.slow
def test_async_handlers_wait_together_in_async_slots_not_threads(start_worker):
    """200 handlers that each await 1 s, on a worker with 2 thread slots: they hold no
    thread, so they run side by side (in thread slots they would take 100 s)."""
    ids = tasks.async_nap.enqueue_many([1.0] * 200)
    start_worker("--concurrency", "2", "--async-concurrency", "200")

    wait_until(
        lambda: Task.objects.filter(pk__in=ids, state="succeeded").count() == 200, timeout=30
    )
    spans = Task.objects.filter(pk__in=ids).aggregate(
        first=Min("started_at"), last=Max("finished_at")
    )
    assert spans["last"] - spans["first"] < timedelta(seconds=5)


@pytest.mark.slow
def test_sync_tasks_run_while_the_async_slots_are_full(start_worker):
    naps = tasks.async_nap.enqueue_many([3.0] * 4)
    start_worker("--concurrency", "2", "--async-concurrency", "4")
    wait_until(lambda: Task.objects.filter(pk__in=naps, state="running").count() == 4)

    sync_id = tasks.noop.enqueue(7)

    wait_until(lambda: Task.objects.get(pk=sync_id).state == "succeeded", timeout=2)
    assert Task.objects.filter(pk__in=naps, state="running").count() == 4


@pytest.mark.slow
def test_async_tasks_beyond_the_async_slots_wait_for_one(start_worker):
    ids = tasks.async_nap.enqueue_many([1.0] * 6)
    start_worker("--concurrency", "4", "--async-concurrency", "2")

    wait_until(lambda: Task.objects.filter(pk__in=ids, state="running").count() == 2)
    time.sleep(0.3)
    assert Task.objects.filter(pk__in=ids, state="running").count() == 2  # not 4, not 6
    wait_until(
        lambda: Task.objects.filter(pk__in=ids, state="succeeded").count() == 6, timeout=20
    )


def test_a_hard_cancel_interrupts_a_running_async_handler(start_worker):
    task_id = tasks.async_nap.enqueue(30.0)
    start_worker("--heartbeat", "0.5")
    wait_until(lambda: Task.objects.get(pk=task_id).state == "running")

    assert cancel(task_id, hard=True) == "cancel_requested"

    row = wait_until(
        lambda: Task.objects.filter(pk=task_id, state="cancelled").first(), timeout=5
    )
    assert row.errors[-1]["message"] == (
        "cancelled with hard=True: the async handler was interrupted at its await"
    )
