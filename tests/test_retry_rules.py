"""Retrying by exception: ``retry_on`` and ``discard_on``, frozen on the row at enqueue
and judged by the worker against the raised exception's classes (its MRO).

Real worker subprocesses (burst workers: they run every due task and exit); the
handlers are in tests/rule_tasks.py. In process execution mode the same code judges the
exception, in the handler's child process: the cases that depend on what reaches the
child (an exception's MRO, retries, the row's own rules) run in both modes, the others
in thread mode only.
"""

import dataclasses
import json

import pytest

from django_pgqueue import task
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.models import Task
from django_pgqueue.tasking.registry import registry
from tests import rule_tasks
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

# One slot in process mode: each slot is a child process that sets Django up, and one
# task at a time is all these tests run.
MODES = {"thread": (), "process": ("--execution", "process", "--concurrency", "1")}


def burst(start_worker, mode: str) -> str:
    """Run a burst worker (in thread or process execution mode) until nothing is due."""
    worker = start_worker("--burst", *MODES[mode], wait=False)
    assert worker.wait(60) == 0, worker.log()
    return worker.log()


@pytest.fixture(params=list(MODES))
def run_burst(request, start_worker):
    """A burst worker in each execution mode."""
    return lambda: burst(start_worker, request.param)


@pytest.fixture
def run_burst_in_threads(start_worker):
    """A burst worker in thread execution mode."""
    return lambda: burst(start_worker, "thread")


def attempts_run(task_id: int) -> list[int]:
    return list(Run.objects.filter(task_id=task_id).values_list("attempt", flat=True))


def test_an_exception_of_a_discard_on_type_fails_the_task_at_once_with_attempts_left(
    run_burst_in_threads,
):
    # given a task with three attempts that discards on Fatal
    task_id = rule_tasks.discard_fatal.enqueue("fatal")

    # when its handler raises Fatal
    run_burst_in_threads()

    # then it is dead-lettered after one attempt, the error and the rule recorded
    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt, row.max_attempts) == ("failed", 1, 3)
    assert attempts_run(task_id) == [1]
    [error] = row.errors
    assert error["type"] == "tests.rule_tasks.Fatal"
    assert error["message"] == "fatal on attempt 1"
    assert error["rule"] == "discard_on"
    assert "Traceback" in error["traceback"]


@pytest.mark.slow
def test_a_subclass_of_a_discard_on_type_is_discarded_through_its_mro(run_burst):
    task_id = rule_tasks.discard_fatal.enqueue("subfatal")

    run_burst()

    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt) == ("failed", 1)
    assert row.errors[-1]["type"] == "tests.rule_tasks.SubFatal"
    assert row.errors[-1]["rule"] == "discard_on"


def test_an_exception_not_in_discard_on_retries_as_usual(run_burst_in_threads):
    task_id = rule_tasks.discard_fatal.enqueue("value")

    run_burst_in_threads()

    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt) == ("failed", 3)
    assert attempts_run(task_id) == [1, 2, 3]
    assert all("rule" not in e for e in row.errors)


@pytest.mark.slow
def test_retry_on_retries_the_listed_types_and_their_subclasses(run_burst):
    # Transient subclasses ConnectionError, which retry_on lists
    task_id = rule_tasks.retry_transient.enqueue("transient")

    run_burst()

    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt) == ("failed", 3)
    assert attempts_run(task_id) == [1, 2, 3]
    assert [e["type"] for e in row.errors] == ["tests.rule_tasks.Transient"] * 3


def test_retry_on_fails_any_other_exception_at_once(run_burst_in_threads):
    task_id = rule_tasks.retry_transient.enqueue("value")

    run_burst_in_threads()

    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt) == ("failed", 1)
    assert attempts_run(task_id) == [1]
    assert row.errors[-1]["type"] == "builtins.ValueError"
    assert row.errors[-1]["rule"] == "retry_on"


def test_discard_on_wins_over_retry_on(run_burst_in_threads):
    # both_rules retries on Exception (Fatal is one) but discards on Fatal
    discarded = rule_tasks.both_rules.enqueue("fatal")
    retried = rule_tasks.both_rules.enqueue("value")

    run_burst_in_threads()

    assert Task.objects.get(pk=discarded).attempt == 1
    assert Task.objects.get(pk=discarded).errors[-1]["rule"] == "discard_on"
    assert Task.objects.get(pk=retried).attempt == 3


@pytest.mark.slow
def test_the_rule_is_frozen_on_the_row_at_enqueue_not_read_from_the_workers_definition(
    run_burst,
):
    # given a row enqueued by a definition without rules (an older deploy), of a task
    # whose worker definition now discards Fatal; and a row of a task without rules in
    # the worker, enqueued with a discard_on for this call
    older = dataclasses.replace(rule_tasks.discard_fatal, discard_on=())
    before_deploy = older.enqueue("fatal")
    per_call = rule_tasks.no_rules.using(discard_on=rule_tasks.Fatal).enqueue("fatal")

    # when the worker runs them
    run_burst()

    # then each row follows the rule it was enqueued with
    assert Task.objects.get(pk=before_deploy).attempt == 3
    assert Task.objects.get(pk=per_call).attempt == 1
    assert Task.objects.get(pk=per_call).errors[-1]["rule"] == "discard_on"


def run_burst_killing(start_worker) -> None:
    """Process mode: a handler past its timeout is killed (a thread would only be
    written off after TIMEOUT_GRACE), so the timeout is settled at once."""
    worker = start_worker("--burst", *MODES["process"], wait=False)
    assert worker.wait(60) == 0, worker.log()


@pytest.mark.slow
def test_a_timeout_is_discarded_when_discard_on_names_timeout_error(start_worker):
    task_id = rule_tasks.too_slow_discarded.enqueue()

    run_burst_killing(start_worker)

    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt) == ("failed", 1)
    assert row.errors[-1]["type"] == "TimeoutError"
    assert row.errors[-1]["rule"] == "discard_on"


@pytest.mark.slow
def test_a_timeout_retries_whatever_retry_on_lists(start_worker):
    # retry_on lists KeyError only: a timeout is not the handler's exception
    task_id = rule_tasks.too_slow_retry_on.enqueue()

    run_burst_killing(start_worker)

    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt) == ("failed", 2)
    assert [e["type"] for e in row.errors] == ["TimeoutError", "TimeoutError"]


# -- what is stored, and what is refused (no worker) ----------------------------------


def test_the_rules_are_stored_as_exception_names_beside_the_backoff():
    task_id = rule_tasks.both_rules.enqueue("fatal")

    policy = Task.objects.get(pk=task_id).retry_policy

    assert policy["retry_on"] == ["builtins.Exception"]
    assert policy["discard_on"] == ["tests.rule_tasks.Fatal"]
    assert policy["base"] == 0.0  # the backoff is kept beside them


def test_a_task_without_rules_stores_none():
    task_id = rule_tasks.no_rules.enqueue("value")

    assert set(Task.objects.get(pk=task_id).retry_policy) == {"base", "factor", "cap", "jitter"}


def test_using_replaces_the_tasks_rules_for_one_call():
    task_id = rule_tasks.discard_fatal.using(
        retry_on=[KeyError, KeyError], discard_on=()
    ).enqueue("key")

    policy = Task.objects.get(pk=task_id).retry_policy

    assert policy["retry_on"] == ["builtins.KeyError"]
    assert "discard_on" not in policy


@pytest.mark.parametrize(
    "value",
    ["ValueError", ValueError("not a class"), (ValueError, "KeyError"), int, object, [None]],
    ids=["a name", "an instance", "a tuple with a name", "not an exception", "object", "None"],
)
@pytest.mark.parametrize("option", ["retry_on", "discard_on"])
def test_a_rule_that_is_not_exception_classes_is_refused_at_decoration(option, value):
    def handler() -> None: ...

    with pytest.raises(InvalidTaskError, match=f"{option} must be an exception class"):
        task(name="tests.rules.refused", **{option: value})(handler)

    assert "tests.rules.refused" not in registry


@pytest.mark.parametrize("option", ["retry_on", "discard_on"])
def test_a_rule_that_is_not_exception_classes_is_refused_by_using_and_nothing_is_written(
    option,
):
    with pytest.raises(InvalidTaskError, match=f"{option} must be an exception class"):
        rule_tasks.no_rules.using(**{option: "builtins.ValueError"}).enqueue("value")

    assert not Task.objects.exists()


def test_the_rules_json_is_what_the_worker_reads():
    # The claimed row carries the rules as JSON text (retry_policy_json): plain names.
    task_id = rule_tasks.retry_transient.enqueue("value")

    stored = Task.objects.values_list("retry_policy", flat=True).get(pk=task_id)

    assert json.loads(json.dumps(stored))["retry_on"] == [
        "builtins.ConnectionError",
        "builtins.KeyError",
    ]
