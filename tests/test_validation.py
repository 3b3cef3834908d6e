"""Bad input never reaches the database.

Every refused value raises InvalidTaskError naming its field before any SQL runs, so
the caller's transaction stays usable and nothing is written. Rows that enqueue could
not have written (args not an array, kwargs not an object) are recognised by the check
the worker runs before spreading them into a call.
"""

import math
import re

import pytest
from django.db import transaction

from django_pgqueue import InvalidTaskError, RetryPolicy, call, task
from django_pgqueue.backends import PgQueueBackend
from django_pgqueue.core.compat import InvalidTaskBackendError
from django_pgqueue.core.payload import check_json, check_stored_call
from django_pgqueue.models import Task
from django_pgqueue.tasking.registry import registry
from tests import framework_tasks, tasks
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

SURROGATE = "caf\udce9"  # what errors="surrogateescape" makes of b"caf\xe9"
HUGE = 10**5000  # str() of it raises: more than sys.get_int_max_str_digits()


def _label(value):
    if isinstance(value, dict):
        return ",".join(f"{key}={_label(item)}" for key, item in value.items())
    if value is HUGE:
        return "huge-int"
    return repr(value)[:30]


def refuses_before_any_sql(bad_call, field, django_assert_num_queries):
    """Given a block in the caller's transaction, when ``bad_call`` is refused, then the
    error names ``field``, no SQL ran, the block can still query, and nothing is written."""
    with transaction.atomic():
        with django_assert_num_queries(0), pytest.raises(InvalidTaskError) as caught:
            bad_call()
        assert Task.objects.count() == 0  # the transaction is not aborted
    assert re.search(field, str(caught.value)), str(caught.value)


# -- options: these used to reach the INSERT and abort the caller's transaction -------
@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"timeout": math.nan}, "timeout"),
        ({"timeout": math.inf}, "timeout"),
        ({"timeout": 1e300}, "timeout"),
        ({"timeout": HUGE}, "timeout"),
        ({"delay": math.inf}, "delay"),
        ({"delay": 1e300}, "delay"),
        ({"delay": math.nan}, "delay"),
        ({"max_attempts": 2**40}, "max_attempts"),
        ({"max_attempts": 2**31}, "max_attempts"),
    ],
    ids=lambda value: _label(value),
)
def test_out_of_range_options_are_refused_before_the_insert(
    options, field, django_assert_num_queries
):
    refuses_before_any_sql(
        lambda: tasks.noop.using(**options).enqueue(1), field, django_assert_num_queries
    )


@pytest.mark.parametrize(
    "backoff",
    [
        {"base": math.nan},
        {"factor": math.nan},
        {"factor": math.inf},
        {"cap": math.inf},
        {"cap": 1e300},
        {"jitter": math.nan},
        math.nan,
        HUGE,
    ],
    ids=lambda value: _label(value),
)
def test_a_backoff_that_is_not_finite_is_refused(backoff, django_assert_num_queries):
    refuses_before_any_sql(
        lambda: tasks.noop.using(backoff=backoff).enqueue(1), "backoff", django_assert_num_queries
    )


def test_the_largest_accepted_values_are_stored():
    task_id = tasks.noop.using(
        timeout=10 * 365 * 24 * 3600, delay=10 * 365 * 24 * 3600, max_attempts=1_000_000
    ).enqueue(10**999)

    row = Task.objects.get(pk=task_id)
    assert (row.timeout.days, row.max_attempts, row.args) == (3650, 1_000_000, [10**999])


# -- arguments and unique_key: these used to raise unclear errors ---------------------
@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        ((SURROGATE,), {}, r"args\[0\]: the string has a lone surrogate '\\udce9' at index 3"),
        ((), {"name": SURROGATE}, r"kwargs\['name'\]: .*lone surrogate"),
        ((), {SURROGATE: 1}, r"kwargs: dict key 'caf\\udce9': .*lone surrogate"),
        ((), {"a\x00b": 1}, r"kwargs: dict key 'a\\x00b': .*NUL"),
        ((HUGE,), {}, r"args\[0\]: an int of 16610 bits is longer than 1000 digits"),
        ((), {"n": [1, -(10**1000)]}, r"kwargs\['n'\]\[1\]: an int of"),
    ],
    ids=["surrogate-arg", "surrogate-value", "surrogate-key", "nul-key", "huge-int", "nested"],
)
def test_arguments_postgresql_cannot_store_are_refused_naming_their_path(
    args, kwargs, field, django_assert_num_queries
):
    refuses_before_any_sql(
        lambda: tasks.noop.enqueue(*args, **kwargs), field, django_assert_num_queries
    )


def test_a_metadata_value_with_a_lone_surrogate_is_refused(django_assert_num_queries):
    refuses_before_any_sql(
        lambda: tasks.noop.using(metadata={"who": SURROGATE}).enqueue(1),
        r"metadata\['who'\]",
        django_assert_num_queries,
    )


@pytest.mark.parametrize("unique_key", ["order\x007", f"order-{SURROGATE}"])
def test_a_unique_key_postgresql_cannot_store_is_refused(unique_key, django_assert_num_queries):
    refuses_before_any_sql(
        lambda: tasks.noop.using(unique_key=unique_key).enqueue(1),
        "unique_key",
        django_assert_num_queries,
    )


def test_enqueue_on_commit_refuses_before_reserving_an_id_or_deferring_anything(
    django_assert_num_queries, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        refuses_before_any_sql(
            lambda: tasks.noop.enqueue_on_commit(SURROGATE),
            r"args\[0\]",
            django_assert_num_queries,
        )

    assert callbacks == []


@pytest.mark.parametrize(
    ("calls", "field"),
    [
        ([1, SURROGATE], r"item 1: args\[0\]: .*lone surrogate"),
        ([1, 2, call(n=HUGE)], r"item 2: kwargs\['n'\]: an int of"),
        ([{"n": 1}, {"\x00": 1}], r"item 1: kwargs: dict key .*NUL"),
    ],
    ids=["surrogate", "huge-int", "nul-key"],
)
def test_enqueue_many_names_the_item_that_is_refused(calls, field, django_assert_num_queries):
    refuses_before_any_sql(lambda: tasks.noop.enqueue_many(calls), field, django_assert_num_queries)


def test_enqueue_many_refuses_a_shared_unique_key_postgresql_cannot_store(
    django_assert_num_queries,
):
    refuses_before_any_sql(
        lambda: tasks.noop.using(unique_key="k\x00").enqueue_many([1, 2]),
        "unique_key",
        django_assert_num_queries,
    )


def test_the_tasks_framework_backend_refuses_through_the_same_checks(
    django_assert_num_queries,
):
    refuses_before_any_sql(
        lambda: framework_tasks.send_email.enqueue(SURROGATE),
        r"cannot enqueue tests.framework_tasks.send_email: args\[0\]: .*lone surrogate",
        django_assert_num_queries,
    )


@pytest.mark.parametrize(
    "options",
    [{"timeout": math.nan}, {"max_attempts": 2**40}, {"backoff": {"cap": math.inf}}],
    ids=["timeout", "max_attempts", "backoff"],
)
def test_the_tasks_framework_backend_refuses_bad_options_when_built(options):
    field = next(iter(options))

    with pytest.raises(InvalidTaskBackendError, match=f"TASKS\\['broken'\\]: .*{field}"):
        PgQueueBackend("broken", {"OPTIONS": options})


# -- @task options --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"name": ""}, "task name must be a non-empty string"),
        ({"name": "x" * 256}, "task name must be a non-empty string of at most 255"),
        ({"name": "a\x00b"}, "task name: .*NUL"),
        ({"name": SURROGATE}, "task name: .*lone surrogate"),
        ({"queue": ""}, "queue '' is not a valid queue name"),
        ({"queue": "default\n"}, r"queue 'default\\n' is not a valid queue name"),
        ({"timeout": math.nan}, "timeout"),
        ({"timeout": math.inf}, "timeout"),
        ({"max_attempts": 2**40}, "max_attempts"),
        ({"backoff": {"base": math.nan}}, "invalid backoff: backoff base and cap must be"),
    ],
    ids=lambda value: _label(value),
)
def test_task_options_are_refused_at_decoration_naming_the_function_and_field(options, field):
    def handler() -> None: ...

    with pytest.raises(InvalidTaskError, match=f"@task on .*handler: {field}"):
        task(**options)(handler)

    assert not [d for d in registry.all() if d.func is handler]


# -- the checks the worker runs on results, checkpoints and stored rows ---------------
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"text": SURROGATE}, r"result\['text'\]: .*lone surrogate"),
        ([1, HUGE], r"result\[1\]: an int of"),
        ({"ok": [math.inf]}, r"result\['ok'\]\[0\]: inf is not valid JSON"),
    ],
)
def test_check_json_refuses_results_postgresql_cannot_store(value, message):
    with pytest.raises(InvalidTaskError, match=message):
        check_json(value, "result")


def test_check_json_turns_tuples_into_lists_and_keeps_plain_values():
    value = {"a": (1, "é", None, True, 1.5), "b": [(2,)]}

    assert check_json(value, "result") == {"a": [1, "é", None, True, 1.5], "b": [[2]]}


def test_a_stored_array_and_object_can_be_called():
    assert check_stored_call([1, "x"], {"n": 1}) is None


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ({"n": 1}, {}, "the stored args are a JSON object, not an array"),
        (None, {}, "the stored args are a JSON null, not an array"),
        ("1", {}, "the stored args are a JSON string, not an array"),
        ([], [1], "the stored kwargs are a JSON array, not an object"),
        ([], 3, "the stored kwargs are a JSON number, not an object"),
        ([], {1: "x"}, "the stored kwargs have the key 1, which is not a string"),
    ],
)
def test_a_stored_call_enqueue_could_not_have_written_is_explained(args, kwargs, message):
    explanation = check_stored_call(args, kwargs)

    assert explanation is not None and explanation.startswith(message)
    assert "cannot be run" in explanation


@pytest.mark.django_db(transaction=True)
def test_a_stored_row_whose_args_are_an_object_fails_at_once_without_retry(start_worker):
    row = TaskFactory(task_name="tests.tasks.noop", args={"n": 1}, kwargs={}, max_attempts=3)

    worker = start_worker("--burst", wait=False)
    assert worker.wait(60) == 0, worker.log()

    row.refresh_from_db()
    assert (row.state, row.attempt, row.result) == ("failed", 1, None)
    assert row.errors[-1]["type"] == "InvalidTaskError"
    assert row.errors[-1]["message"].startswith(
        "the stored args are a JSON object, not an array: this row was written by hand"
    )


# -- retry delays stay finite however long a task retries -----------------------------
def test_a_backoff_delay_stops_at_its_cap_however_many_attempts_failed():
    policy = RetryPolicy(base=5.0, factor=2.0, cap=600.0, jitter=0.0)

    assert policy.delay(1) == 5.0
    assert policy.delay(5000) == 600.0  # 2.0 ** 4999 would overflow a float


def test_a_zero_backoff_stays_zero_however_many_attempts_failed():
    assert RetryPolicy(base=0.0, factor=10.0, cap=600.0, jitter=0.0).delay(5000) == 0.0
