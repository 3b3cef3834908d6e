"""django_pgqueue.testing (docs/testing.md): the helpers a project tests its own
enqueueing code with. Each behaviour is pinned twice: inside a transaction rolled back
at the end of the test (a Django TestCase, pytest-django's ``db``), where no other
connection sees the test's rows, and with committed data (TransactionTestCase,
``transactional_db``). Real PostgreSQL throughout; run_tasks goes through the worker's
own claim and settle statements."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback

import pytest
from django.conf import settings
from django.db import transaction
from django.test import TestCase, TransactionTestCase, override_settings
from django.utils import timezone

from django_pgqueue import InvalidTaskError, pause, resume, signal
from django_pgqueue.models import Task
from django_pgqueue.tasking.workflows import chain, chord
from django_pgqueue.testing import (
    TaskFailed,
    assert_enqueued,
    drain,
    enqueued,
    refute_enqueued,
    run_tasks,
)
from django_pgqueue.testing import runner as runner_module
from tests.settings import TEST_DATABASES
from tests.tasks import noop, sliced
from tests.testapp.models import Run
from tests.testing_tasks import (
    await_approval,
    breaks_its_transaction,
    build_report,
    charge,
    charge_later,
    count_seen,
    fan_out,
    remember,
    send_receipt,
)

# Every test below runs in both modes.
BOTH = pytest.mark.parametrize(
    "mode",
    [
        pytest.param("in_transaction", marks=pytest.mark.django_db, id="in_transaction"),
        pytest.param(
            "committed", marks=pytest.mark.django_db(transaction=True), id="committed"
        ),
    ],
)


def place_order(order_id: int, *, express: bool = False) -> None:
    """Application code under test: the order's tasks enqueued in its transaction."""
    with transaction.atomic():
        send_receipt.enqueue(order_id, template="express" if express else "receipt")
        remember.enqueue(f"order {order_id} placed")


def labels() -> list[str]:
    return list(Run.objects.order_by("id").values_list("label", flat=True))


def assert_nothing_running() -> None:
    assert not Task.objects.filter(state="running").exists()


# -- assert_enqueued / refute_enqueued / enqueued ---------------------------------------
@BOTH
def test_assert_enqueued_matches_kwargs_partially(mode: str) -> None:
    # Given application code that enqueued a task with keyword arguments
    send_receipt.enqueue(order_id=42, template="receipt")
    # When the test names only some of them, then it matches (the others are ignored)
    [row] = assert_enqueued(send_receipt, kwargs={"order_id": 42}, queue="emails")
    assert row.kwargs == {"order_id": 42, "template": "receipt"}
    assert row.state == "pending"
    # and a differing value does not match
    refute_enqueued(send_receipt, kwargs={"order_id": 42, "template": "express"})


@BOTH
def test_assert_enqueued_matches_args_exactly_and_accepts_a_task_name(mode: str) -> None:
    # Given a task enqueued by a function, with positional and keyword arguments
    place_order(7, express=True)
    # Then args match exactly (a tuple matches the stored list), by definition or by name
    assert_enqueued(send_receipt, args=(7,), kwargs={"template": "express"})
    assert_enqueued("tests.testing_tasks.send_receipt", args=[7], queue="emails")
    refute_enqueued(send_receipt, args=[7, "express"])
    refute_enqueued(send_receipt, args=[])


@BOTH
def test_refute_enqueued_fails_listing_the_matching_tasks(mode: str) -> None:
    # Given one receipt enqueued
    task_id = send_receipt.enqueue(5)
    # Then refuting another passes, and refuting this one fails naming it
    refute_enqueued(send_receipt, args=[6])
    refute_enqueued(send_receipt, queue="default")
    with pytest.raises(AssertionError) as failure:
        refute_enqueued(send_receipt, args=[5])
    assert str(failure.value) == (
        "expected no tests.testing_tasks.send_receipt(5) (scheduled, pending or waiting); "
        f"found 1: #{task_id} tests.testing_tasks.send_receipt(5) in 'emails' [pending]"
    )


@BOTH
def test_count_requires_exactly_that_many_matching_tasks(mode: str) -> None:
    # Given two receipts for order 1 and one for order 2
    send_receipt.enqueue_many([1, 1, 2])
    # Then count= counts the matching rows exactly
    assert len(assert_enqueued(send_receipt, args=[1], count=2)) == 2
    assert_enqueued(send_receipt, count=3)
    assert_enqueued(send_receipt, args=[3], count=0)
    with pytest.raises(AssertionError, match=r"expected 1 task\(s\) matching .*; 2 match"):
        assert_enqueued(send_receipt, args=[1], count=1)


@BOTH
def test_a_failing_assertion_lists_what_was_enqueued_for_that_task(mode: str) -> None:
    # Given a receipt for order 41 in "emails"
    task_id = send_receipt.enqueue(41)
    # When the test expects one for order 42
    with pytest.raises(AssertionError) as failure:
        assert_enqueued(send_receipt, args=[42], queue="emails")
    # Then the message says what was expected and what was found instead
    assert str(failure.value) == (
        "expected tests.testing_tasks.send_receipt(42) in queue 'emails' "
        "(scheduled, pending or waiting); found 1 tests.testing_tasks.send_receipt "
        f"task(s): #{task_id} tests.testing_tasks.send_receipt(41) in 'emails' [pending]"
    )


@BOTH
def test_a_failing_assertion_lists_other_tasks_when_none_of_that_task_is_enqueued(
    mode: str,
) -> None:
    remember.enqueue("unrelated")
    with pytest.raises(AssertionError) as failure:
        assert_enqueued(send_receipt, kwargs={"order_id": 1})
    message = str(failure.value)
    assert message.startswith("expected tests.testing_tasks.send_receipt(..., order_id=1)")
    assert "found no tests.testing_tasks.send_receipt task; other tasks: " in message
    assert "tests.testing_tasks.remember('unrelated') in 'default' [pending]" in message


@BOTH
def test_tasks_that_ran_are_not_enqueued_any_more(mode: str) -> None:
    # Given a task enqueued, then run
    send_receipt.enqueue(3)
    run_tasks()
    # Then it no longer counts as enqueued, unless its state is asked for
    refute_enqueued(send_receipt)
    assert enqueued(send_receipt) == []
    [row] = assert_enqueued(send_receipt, args=[3], states=["succeeded"])
    assert row.result == "receipt for order 3"


@BOTH
def test_enqueued_returns_every_enqueued_task_oldest_first(mode: str) -> None:
    first = remember.enqueue("a")
    second = send_receipt.using(delay=3600).enqueue(9)
    assert [row.id for row in enqueued()] == [first, second]
    assert [row.state for row in enqueued()] == ["pending", "scheduled"]
    assert [row.id for row in enqueued(remember)] == [first]


@pytest.mark.django_db
def test_helpers_refuse_bad_input_saying_what_was_wrong() -> None:
    with pytest.raises(TypeError, match="task must be a task"):
        assert_enqueued(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidTaskError, match=r"args\[0\]"):
        assert_enqueued(send_receipt, args=[object()])
    with pytest.raises(TypeError, match="count must be an int >= 0"):
        assert_enqueued(send_receipt, count=-1)
    with pytest.raises(TypeError, match="args must be a list or tuple"):
        enqueued(send_receipt, args="42")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_tasks must be an int >= 0"):
        run_tasks(max_tasks=-1)


# -- run_tasks -------------------------------------------------------------------------
@BOTH
def test_run_tasks_runs_a_task_and_stores_its_result(mode: str) -> None:
    # Given an order placed: two tasks enqueued in its transaction
    place_order(42)
    # When the test runs what is due
    result = run_tasks()
    # Then both ran once, in the test's process, and their results are stored
    assert result.counts == {"success": 2}
    assert sorted(labels()) == ["order 42 placed", "receipt 42"]
    receipt = Task.objects.get(task_name=send_receipt.name)
    assert (receipt.state, receipt.result, receipt.attempt) == (
        "succeeded",
        "receipt for order 42",
        1,
    )
    assert receipt.id in result.ids
    assert {row.state for row in result.tasks()} == {"succeeded"}
    assert_nothing_running()


@BOTH
def test_run_tasks_never_runs_an_expired_task_and_runs_the_next_one(mode: str) -> None:
    # Given a task that expired before anything ran it, and one that has not
    past = timezone.now() - timezone.timedelta(seconds=1)
    stale = remember.using(priority=50, expires=past).enqueue("stale")
    fresh = remember.enqueue("fresh")
    # When the test runs what is due
    result = run_tasks()
    # Then only the fresh task ran; the expired one ended cancelled, as a worker ends it
    assert result.ids == [fresh]
    assert labels() == ["fresh"]
    row = Task.objects.get(id=stale)
    assert (row.state, row.attempt, row.errors[-1]["type"]) == ("cancelled", 0, "Expired")
    assert_nothing_running()


@BOTH
def test_run_tasks_runs_higher_priority_first(mode: str) -> None:
    low = remember.enqueue("low")
    high = remember.using(priority=50).enqueue("high")
    assert run_tasks().ids == [high, low]


@BOTH
def test_a_task_that_keeps_raising_is_retried_then_dead_lettered_with_scheduled(
    mode: str,
) -> None:
    # Given a task that always raises, with three attempts
    task_id = charge.enqueue(8)
    # When the test runs due tasks, retries waiting out their backoff included
    result = run_tasks(scheduled=True)
    # Then it ran three times: two retries scheduled, then the dead letter
    assert [(run.attempt, run.outcome, run.state) for run in result.runs] == [
        (1, "failure", "scheduled"),
        (2, "failure", "scheduled"),
        (3, "failure", "failed"),
    ]
    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt) == ("failed", 3)
    assert [e["message"] for e in row.errors] == [
        f"payment provider refused (attempt {n})" for n in (1, 2, 3)
    ]
    assert all(e["type"] == "builtins.ValueError" for e in row.errors)
    assert labels() == ["charge 8"] * 3
    assert_nothing_running()


@BOTH
def test_without_scheduled_a_retry_waits_for_its_backoff(mode: str) -> None:
    # Given a failing task whose retry comes an hour later
    task_id = charge_later.enqueue(1)
    # When due tasks run, then it ran once and its retry is scheduled
    result = run_tasks()
    assert [(run.outcome, run.state) for run in result.runs] == [("failure", "scheduled")]
    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt) == ("scheduled", 1)
    assert row.run_at > timezone.now()
    assert len(run_tasks()) == 0
    # and drain() (scheduled=True) runs the retries to the end
    assert drain().states == {"scheduled": 1, "failed": 1}


@BOTH
def test_raise_errors_reraises_with_the_handlers_traceback_after_settling(mode: str) -> None:
    # Given a task that raises in a function it calls
    task_id = charge.enqueue(13)
    # When the test runs it with raise_errors=True, then the handler's exception is raised
    with pytest.raises(ValueError, match=r"payment provider refused \(attempt 1\)") as raised:
        run_tasks(raise_errors=True)
    frames = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert frames[-2:] == ["charge", "_explode"]
    # and the failure was written first: the retry is scheduled, nothing is left running
    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt, len(row.errors)) == ("scheduled", 1, 1)
    assert_nothing_running()


@BOTH
def test_raise_errors_reports_a_failure_without_an_exception(mode: str) -> None:
    # Given a stored call that does not fit the function (a row written by hand)
    task_id = send_receipt.enqueue(1)
    Task.objects.filter(pk=task_id).update(args=[1, 2, 3, 4])
    # Then raise_errors raises, naming the task and why it failed
    with pytest.raises(InvalidTaskError, match="the stored arguments do not fit"):
        run_tasks(raise_errors=True)
    assert Task.objects.get(pk=task_id).state == "failed"


@BOTH
def test_raise_errors_treats_retry_snooze_and_suspend_as_outcomes(mode: str) -> None:
    from tests.tasks import retry_with_delay

    retry_with_delay.enqueue(3600)
    await_approval.enqueue(1)
    result = run_tasks(raise_errors=True)
    assert result.counts == {"failure": 1, "suspended": 1}


@BOTH
def test_a_failure_without_a_python_exception_raises_task_failed(mode: str) -> None:
    # Given a handler whose result is not JSON (a set)
    from django_pgqueue import task

    @task(name="tests.test_testing_helpers.returns_a_set")
    def returns_a_set() -> set:
        return {1}

    try:
        returns_a_set.enqueue()
        with pytest.raises(TaskFailed, match="cannot be stored"):
            run_tasks(raise_errors=True)
    finally:
        from django_pgqueue.tasking.registry import registry

        registry.unregister(returns_a_set.name)


@BOTH
def test_a_chain_runs_in_order(mode: str) -> None:
    # Given a chain of three steps
    ids = chain(remember.step("first"), remember.step("second"), remember.step("third"))
    assert [row.state for row in enqueued(remember)] == ["pending", "waiting", "waiting"]
    # When due tasks run, then each step ran after the one before (released by the trigger)
    result = run_tasks()
    assert result.ids == ids
    assert labels() == ["first", "second", "third"]


@BOTH
def test_a_chord_calls_back_once_its_members_have_ended(mode: str) -> None:
    members, callback = chord([remember.step("a"), remember.step("b")], remember.step("done"))
    result = run_tasks()
    assert result.ids == [*members, callback]
    assert Task.objects.get(pk=callback).state == "succeeded"


@BOTH
def test_a_failed_chain_step_cancels_the_rest(mode: str) -> None:
    first, second = chain(charge.using(max_attempts=1).step(1), remember.step("never"))
    result = run_tasks()
    assert result.ids == [first]
    assert Task.objects.get(pk=second).state == "cancelled"


@BOTH
def test_suspend_waits_until_signal_then_run_tasks_resumes_it(mode: str) -> None:
    # Given a task that suspends until it is approved
    task_id = await_approval.enqueue(77)
    result = run_tasks()
    assert [(run.outcome, run.state) for run in result.runs] == [("suspended", "waiting")]
    assert_enqueued(await_approval, args=[77])  # waiting counts as enqueued
    # When nothing has signalled it, it stays waiting
    assert len(run_tasks(scheduled=True)) == 0
    # When the signal arrives, the next run resumes it with the payload
    assert signal(task_id, "approved", {"by": "ops"}) == "resumed"
    result = run_tasks()
    assert result.states == {"succeeded": 1}
    row = Task.objects.get(pk=task_id)
    assert row.result == {"payload": {"by": "ops"}, "checkpoint": {"order": 77}}
    assert row.attempt == 1  # a suspension refunds its attempt


@BOTH
def test_continue_requeues_until_the_work_is_done(mode: str) -> None:
    task_id = sliced.enqueue(3)
    result = run_tasks()
    assert result.counts == {"continued": 3, "success": 1}
    assert Task.objects.get(pk=task_id).result == 3


@BOTH
def test_enqueue_on_commit_is_seen_with_capture_on_commit_callbacks(
    mode: str, django_capture_on_commit_callbacks
) -> None:
    # Given application code that enqueues when its transaction commits
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with transaction.atomic():
            task_id = send_receipt.enqueue_on_commit(11)
        if mode == "in_transaction":
            # The test's transaction never commits: nothing is inserted until the
            # captured callbacks run
            refute_enqueued(send_receipt)
    # Then the task is enqueued once the callbacks ran (or the commit did), and runs
    [row] = assert_enqueued(send_receipt, args=[11])
    assert row.id == task_id
    assert len(callbacks) == (1 if mode == "in_transaction" else 0)
    assert run_tasks().ids == [task_id]


@BOTH
def test_a_handlers_enqueue_on_commit_follow_ups_run_too(mode: str) -> None:
    # Given a handler that enqueues its follow-ups with enqueue_on_commit
    fan_out.enqueue(["x", "y"])
    # When due tasks run, then the follow-ups were enqueued (as in a worker, whose
    # handler runs in autocommit) and ran in the same call
    result = run_tasks()
    assert result.counts == {"success": 3}
    assert labels() == ["x", "y"]


@BOTH
def test_max_tasks_limits_how_many_run(mode: str) -> None:
    ids = [remember.enqueue(label) for label in "abc"]
    assert run_tasks(max_tasks=2).ids == ids[:2]
    assert_enqueued(remember, count=1)
    assert run_tasks(max_tasks=0).ids == []
    assert run_tasks().ids == ids[2:]


@BOTH
def test_queues_limits_which_queues_run(mode: str) -> None:
    # Given tasks in three queues
    receipt = send_receipt.enqueue(1)
    report = build_report.enqueue("weekly")
    other = remember.enqueue("default queue")
    # When only "reports" and "emails" run, then the default queue's task waits
    assert sorted(run_tasks(queues=["reports", "emails"]).ids) == sorted([receipt, report])
    assert_enqueued(remember, queue="default")
    assert run_tasks(queues="default").ids == [other]


@BOTH
def test_a_paused_queue_does_not_run(mode: str) -> None:
    # Given a report enqueued in a paused queue
    report = build_report.enqueue("monthly")
    pause("reports")
    # Then run_tasks leaves it, as a worker's claim would, until the queue resumes
    assert len(run_tasks()) == 0
    resume("reports")
    assert run_tasks().ids == [report]


@BOTH
def test_an_async_handler_runs_on_the_tests_connection(mode: str) -> None:
    # Given a row the test wrote (inside a TestCase, visible to its connection only)
    Run.objects.create(task_id=0, attempt=0, label="seen", pid=0, started_at=timezone.now())
    task_id = count_seen.enqueue("seen")
    # When an async handler reads it through the ORM, then it sees it
    result = run_tasks()
    assert result.counts == {"success": 1}
    assert Task.objects.get(pk=task_id).result == 1


@BOTH
def test_a_handler_that_aborted_the_transaction_is_still_settled(mode: str) -> None:
    # Given a handler that runs a failing statement, catches it, then raises
    task_id = breaks_its_transaction.enqueue()
    # When it runs, then its failure is written and the test's connection still works
    result = run_tasks()
    assert result.states == {"failed": 1}
    assert Task.objects.get(pk=task_id).errors[0]["message"] == "gave up after a failed statement"
    # Inside the test's transaction the handler's writes went with its savepoint; in
    # autocommit its first statement had committed on its own, as in a worker
    assert labels() == ([] if mode == "in_transaction" else ["before the bad statement"])


@BOTH
def test_a_task_requeueing_itself_forever_stops_with_an_error(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "RUN_LIMIT", 5)
    sliced.enqueue(100)
    with pytest.raises(RuntimeError, match=r"ran 5 tasks .* Pass max_tasks=N"):
        run_tasks()
    assert_nothing_running()


@BOTH
def test_unregistered_tasks_are_left_enqueued(mode: str) -> None:
    Task.objects.create(task_name="not.registered.anywhere")
    assert len(run_tasks()) == 0
    assert_enqueued("not.registered.anywhere")


# -- the pgqueue fixture ---------------------------------------------------------------
def test_the_pgqueue_fixture_exposes_the_helpers(pgqueue) -> None:
    place_order(3)
    pgqueue.assert_enqueued(send_receipt, args=[3])
    pgqueue.refute_enqueued(send_receipt, args=[4])
    assert len(pgqueue.enqueued()) == 2
    assert pgqueue.run_tasks().counts == {"success": 2}
    assert len(pgqueue.drain()) == 0


@pytest.mark.django_db(transaction=True)
def test_the_pgqueue_fixture_works_with_committed_data(pgqueue) -> None:
    noop.enqueue(5)
    assert pgqueue.run_tasks().counts == {"success": 1}
    assert pgqueue.enqueued(noop, states=["succeeded"])[0].result == 5


# -- Django's test classes -------------------------------------------------------------
class HelpersInATestCase(TestCase):
    """The plain functions in a django.test.TestCase."""

    def test_an_order_enqueues_its_receipt_which_runs(self) -> None:
        place_order(21)
        assert_enqueued(send_receipt, args=[21], kwargs={"template": "receipt"})
        result = run_tasks()
        self.assertEqual(result.counts, {"success": 2})
        self.assertEqual(Task.objects.get(task_name=send_receipt.name).state, "succeeded")

    def test_enqueue_on_commit_with_capture_on_commit_callbacks(self) -> None:
        with self.captureOnCommitCallbacks(execute=True):
            with transaction.atomic():
                send_receipt.enqueue_on_commit(22)
            refute_enqueued(send_receipt)
        assert_enqueued(send_receipt, args=[22])
        self.assertEqual(len(run_tasks()), 1)


class HelpersInATransactionTestCase(TransactionTestCase):
    """The plain functions in a django.test.TransactionTestCase (committed data)."""

    def test_an_order_enqueues_its_receipt_which_runs(self) -> None:
        place_order(31)
        assert_enqueued(send_receipt, args=[31])
        self.assertEqual(run_tasks().counts, {"success": 2})
        refute_enqueued(send_receipt)

    def test_a_failing_task_is_dead_lettered_by_drain(self) -> None:
        task_id = charge.enqueue(32)
        self.assertEqual(drain().states, {"scheduled": 2, "failed": 1})
        self.assertEqual(Task.objects.get(pk=task_id).state, "failed")


@pytest.mark.slow
def test_the_plugin_does_not_disturb_a_pytest_run_without_django(tmp_path) -> None:
    # Given a project without Django settings, in an environment where the plugin loads
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    # When pytest runs there, then the plugin is loaded and the test passes
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--trace-config"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "django_pgqueue.pytest_plugin" in done.stdout
    assert "1 passed" in done.stdout


@pytest.mark.django_db(databases=["default", "queue2"])
def test_helpers_follow_a_queue_to_its_database() -> None:
    # Given queue "q2" on the second database (PGQUEUE["DATABASES"])
    pgqueue = {**settings.PGQUEUE, "DATABASES": TEST_DATABASES}
    with override_settings(PGQUEUE=pgqueue):
        task_id = remember.using(queue="q2").enqueue("elsewhere")
        # Then the helpers look for it, and run it, on that database
        [row] = assert_enqueued(remember, queue="q2")
        assert row.id == task_id
        refute_enqueued(remember)  # the task's default queue is on "default"
        result = run_tasks(queues="q2")
        assert (result.database, result.ids) == ("queue2", [task_id])
        assert [t.state for t in result.tasks()] == ["succeeded"]
        assert len(run_tasks()) == 0  # DATABASE's queues: nothing there


@BOTH
def test_run_tasks_runs_the_tasks_of_a_sequence_one_after_another(mode: str) -> None:
    from tests.tenant_tasks import ordered_job

    # Given two accounts' tasks enqueued in the test (in its transaction, or committed)
    a = ordered_job.enqueue_many([("a", 1), ("a", 2), ("a", 3)])
    b = ordered_job.enqueue("b", 1)
    # When the test runs what is due
    result = run_tasks()
    # Then each account's ran in order, each started once the one before had ended
    assert [i for i in result.ids if i in a] == a
    assert sorted(result.ids) == sorted([*a, b])
    assert not Task.objects.exclude(state="succeeded").exists()


@BOTH
def test_run_tasks_runs_a_batch_handlers_calls_as_batches_of_one(
    mode: str, tmp_path, monkeypatch
) -> None:
    from tests import ledger
    from tests.tenant_tasks import batch_send

    monkeypatch.setenv(ledger.LEDGER_ENV, str(tmp_path / "ledger.jsonl"))
    ids = batch_send.enqueue_many([(1,), (2,)])

    result = run_tasks()

    assert sorted(result.ids) == ids
    assert [run.result for run in sorted(result.runs, key=lambda r: r.id)] == [2, 4]
