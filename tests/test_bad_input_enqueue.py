"""Bad input to enqueue, searched for (Hypothesis) rather than listed.

Properties: an argument is either stored, and received by the handler, as its JSON
round trip (tests/fuzzing.py ``stored``: the rule docs/tasks.md states), or refused
with InvalidTaskError naming its path; an option is either stored as given or refused
with InvalidTaskError (TypeError for an unknown option) naming it. A refusal writes
nothing and leaves the caller's transaction usable: the next query in the same
``atomic()`` block works. Inputs Hypothesis found that once broke a property are pinned
with ``@example``, and each fix has its own test below.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import transaction
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_pgqueue import InvalidTaskError, RetryPolicy, task
from django_pgqueue.models import Dependency, Task
from django_pgqueue.testing import run_tasks
from tests import tasks
from tests.fuzzing import (
    Refused,
    any_floats,
    big_ints,
    examples,
    hostile_text,
    json_ish,
    moments,
    nested,
    same,
    stored,
)

pytestmark = pytest.mark.django_db

RECEIVED: list[tuple[tuple, dict]] = []


@task(name="tests.bad_input.echo")
def echo(*args, **kwargs) -> None:
    RECEIVED.append((args, kwargs))


def expected_call(args: list, kwargs: dict) -> tuple[list, dict] | Refused:
    try:
        return stored(args, "args"), stored(kwargs, "kwargs")
    except Refused as refusal:
        return refusal


def enqueue_and_run(args: list, kwargs: dict) -> tuple[Task, tuple, dict]:
    """Enqueue echo, run it in this thread; the row, and what the handler received."""
    task_id = echo.enqueue(*args, **kwargs)
    row = Task.objects.get(pk=task_id)
    RECEIVED.clear()
    run_tasks(queues=["default"])
    [(received_args, received_kwargs)] = RECEIVED
    return row, received_args, received_kwargs


def check_call(args: list, kwargs: dict) -> None:
    """The property, in a block of the caller's transaction (rolled back after)."""
    expected = expected_call(args, kwargs)
    with transaction.atomic():
        try:
            row, received_args, received_kwargs = enqueue_and_run(args, kwargs)
        except InvalidTaskError as exc:
            assert isinstance(expected, Refused), f"refused, but the rule accepts it: {exc}"
            assert str(exc).startswith(f"{expected.path}: "), (str(exc), expected.path)
            assert Task.objects.count() == 0  # the block still queries; nothing written
        else:
            assert not isinstance(expected, Refused), f"accepted, the rule refuses {expected}"
            assert same(row.args, expected[0]) and same(row.kwargs, expected[1])
            assert same(list(received_args), expected[0])
            assert same(received_kwargs, expected[1])
        transaction.set_rollback(True)


@settings(max_examples=examples(200))
@given(
    args=st.lists(json_ish, max_size=3),
    kwargs=st.dictionaries(hostile_text, json_ish, max_size=3),
)
@example(args=[1e16, -0.0, 2**63, 10**999], kwargs={"n": 5e-324})
@example(args=[{1: "x"}], kwargs={})
@example(args=[(1, (2,))], kwargs={"t": ()})
@example(args=[], kwargs={"self": 1})  # enqueue(self, ...) used to take it as its own
def test_an_argument_round_trips_as_json_or_is_refused_naming_its_path(args, kwargs):
    check_call(args, kwargs)


@settings(max_examples=examples(30))
@given(depth=st.integers(min_value=95, max_value=105), as_dict=st.booleans())
def test_nesting_is_accepted_below_the_depth_limit_and_refused_at_it(depth, as_dict):
    check_call([nested(depth, as_dict=as_dict)], {})


# -- options ------------------------------------------------------------------------
PARENT, PARENT_TEXT = "<parent id>", "<parent id as text>"
exception_rules = st.one_of(
    st.none(),
    st.sampled_from(
        [ValueError, (ValueError, KeyError), [OSError], (), "ValueError", 1, object, ValueError()]
    ),
)
OPTIONS = {
    "queue": st.one_of(
        st.from_regex(r"[A-Za-z0-9_.:-]{1,100}", fullmatch=True),
        hostile_text,
        st.integers(),
        st.none(),
        st.just("q" * 101),
    ),
    "priority": st.one_of(
        st.integers(-150, 150), big_ints, any_floats, st.booleans(), hostile_text, st.none()
    ),
    "run_at": st.one_of(moments, st.none(), hostile_text, st.integers()),
    "delay": st.one_of(
        st.integers(-5, 10**9), big_ints, any_floats, st.timedeltas(), hostile_text, st.none()
    ),
    "unique_key": st.one_of(
        hostile_text, st.none(), st.integers(), st.sampled_from(["k" * 255, "k" * 256])
    ),
    "max_attempts": st.one_of(
        st.integers(-2, 2 * 10**6), big_ints, st.booleans(), any_floats, st.none()
    ),
    "timeout": st.one_of(st.integers(-1, 10**9), big_ints, any_floats, hostile_text, st.none()),
    "backoff": st.one_of(
        st.dictionaries(
            st.one_of(st.sampled_from(["base", "factor", "cap", "jitter"]), hostile_text,
                      st.integers()),
            st.one_of(st.floats(min_value=0, max_value=2), any_floats, big_ints, hostile_text,
                      st.none()),
            max_size=4,
        ),
        any_floats,
        big_ints,
        hostile_text,
        st.none(),
        st.builds(RetryPolicy),
    ),
    "metadata": st.one_of(st.dictionaries(hostile_text, json_ish, max_size=3), json_ish),
    "after": st.one_of(
        st.lists(
            st.one_of(st.sampled_from([PARENT, PARENT_TEXT]), big_ints, hostile_text,
                      st.booleans(), any_floats),
            max_size=3,
        ),
        st.sampled_from([PARENT, PARENT_TEXT]),
        st.binary(max_size=3),
        st.dictionaries(st.integers(), st.integers(), max_size=2),
        big_ints,
        st.none(),
    ),
    "expires": st.one_of(
        st.integers(-1, 10**9), big_ints, any_floats, st.timedeltas(), moments, hostile_text,
        st.none(),
    ),
    "retry_on": exception_rules,
    "discard_on": exception_rules,
    "after_failure": st.one_of(st.sampled_from(["cancel", "run"]), hostile_text, st.none()),
    "concurrency_key": st.one_of(st.none(), hostile_text),
    "commit_alias": st.one_of(
        st.none(), st.sampled_from(["default", "queue2", "nope"]), st.integers()
    ),
    "no_such_option": st.integers(),
}


def _resolve_after(value, parent: int):
    def one(item):
        return {PARENT: parent, PARENT_TEXT: str(parent)}.get(item, item) if isinstance(
            item, str
        ) else item

    return [one(item) for item in value] if isinstance(value, list) else one(value)


def assert_stored_as_given(row: Task, options: dict, parent: int) -> None:
    for name in ("queue", "priority", "max_attempts", "unique_key"):
        if name in options:
            assert getattr(row, name) == options[name], name
    if "timeout" in options:
        timeout = options["timeout"]
        assert row.timeout == (None if timeout is None else timedelta(seconds=float(timeout)))
    if options.get("run_at") is not None:
        assert row.run_at == options["run_at"]
    if "metadata" in options:
        assert same(row.metadata, stored(options["metadata"], "metadata"))
    if options.get("after"):  # [] waits for nothing
        parents = Dependency.objects.filter(child_id=row.pk).values_list("parent_id", flat=True)
        assert set(parents) == {parent}
    if "backoff" in options:
        policy = RetryPolicy.from_value(options["backoff"]).as_dict()
        assert {k: row.retry_policy[k] for k in policy} == policy
    if isinstance(options.get("expires"), datetime):
        assert row.expires_at == options["expires"]
    elif options.get("expires") is not None:
        assert row.expires_at is not None and row.expires_at > row.enqueued_at


@settings(max_examples=examples(250))
@given(options=st.fixed_dictionaries({}, optional=OPTIONS))
@example(options={"after": [2**70]})  # reached the INSERT: bigint out of range
@example(options={"after": ["²"]})  # isdigit() but not int(): ValueError
@example(options={"after": b"\x01"})  # bytes iterate as ints: taken as task ids
@example(options={"commit_alias": "nope"})  # ConnectionDoesNotExist at commit
@example(options={"backoff": {1: 1.0, "x": 1.0}})  # sorting the unknown keys: TypeError
@example(  # PostgreSQL refuses a UTC offset past 15:59: DataError in the block
    options={"run_at": datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=16)))}
)
@example(options={"run_at": datetime(9999, 12, 31, 23, 59, tzinfo=timezone(-timedelta(hours=23)))})
@example(options={"expires": datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=-20)))})
def test_an_option_is_stored_as_given_or_refused_naming_it(options):
    with transaction.atomic():
        parent = tasks.noop.enqueue(0)
        if "after" in options:
            options = {**options, "after": _resolve_after(options["after"], parent)}
        try:
            task_id = tasks.noop.using(**options).enqueue(1)
        except (InvalidTaskError, TypeError) as exc:
            assert any(name in str(exc) for name in options), str(exc)
            assert list(Task.objects.values_list("pk", flat=True)) == [parent]
        else:
            assert_stored_as_given(Task.objects.get(pk=task_id), options, parent)
        transaction.set_rollback(True)


@settings(max_examples=examples(60))
@given(alias=st.one_of(st.sampled_from(["default", "nope", ""]), hostile_text, st.integers()))
def test_enqueue_on_commit_defers_to_a_known_alias_or_is_refused_naming_commit_alias(alias):
    with transaction.atomic():
        try:
            tasks.noop.using(commit_alias=alias).enqueue_on_commit(1)
        except InvalidTaskError as exc:
            assert "commit_alias" in str(exc)
            assert Task.objects.count() == 0
        else:
            assert alias == "default"
        transaction.set_rollback(True)


# -- regressions: each input Hypothesis found, as a plain test --------------------------
def refused_in_a_usable_block(call, field: str) -> None:
    with transaction.atomic():
        with pytest.raises(InvalidTaskError, match=field):
            call()
        assert Task.objects.count() == 0  # the block still queries; nothing written


@pytest.mark.parametrize(
    ("after", "message"),
    [
        ([2**70], "after: an int of 71 bits is not a task id"),
        (["²"], "after: '²' is not a task id"),
        (b"\x01\x02", r"after must be a list of task ids, not b'\\x01\\x02'"),
        ({1: 2}, r"after must be a list of task ids, not \{1: 2\}"),
        ([0], "after: 0 is not a task id"),
    ],
)
def test_after_refuses_what_is_no_task_id_before_any_sql(after, message):
    refused_in_a_usable_block(lambda: tasks.noop.using(after=after).enqueue(1), message)


@pytest.mark.parametrize("alias", ["nope", 5])
def test_a_commit_alias_that_is_no_database_is_refused_naming_the_aliases(alias):
    refused_in_a_usable_block(
        lambda: tasks.noop.using(commit_alias=alias).enqueue_on_commit(1),
        r"commit_alias .* is not a database alias of DATABASES: use one of default, queue2",
    )


def test_unknown_backoff_keys_of_several_types_are_named():
    refused_in_a_usable_block(
        lambda: tasks.noop.using(backoff={1: 1.0, "x": 1.0}).enqueue(1),
        r"unknown backoff option\(s\) \['x', 1\]",
    )


def test_a_run_at_with_an_offset_postgresql_refuses_is_stored_as_the_same_instant():
    run_at = datetime(2030, 1, 1, 12, 0, tzinfo=timezone(timedelta(hours=20, minutes=30)))

    task_id = tasks.noop.using(run_at=run_at).enqueue(1)

    assert Task.objects.get(pk=task_id).run_at == run_at
    assert run_at.astimezone(UTC) == datetime(2029, 12, 31, 15, 30, tzinfo=UTC)


@pytest.mark.parametrize("option", ["run_at", "expires"])
def test_a_moment_outside_years_1_to_9999_in_utc_is_refused(option):
    moment = datetime(9999, 12, 31, 23, 59, tzinfo=timezone(-timedelta(hours=23)))
    refused_in_a_usable_block(
        lambda: tasks.noop.using(**{option: moment}).enqueue(1),
        f"{option} .* is out of range",
    )


def test_a_task_whose_parameter_is_named_self_takes_it_as_a_keyword():
    RECEIVED.clear()

    echo.enqueue(self=1)
    run_tasks(queues=["default"])

    assert RECEIVED == [((), {"self": 1})]


def test_a_float_of_1e16_or_more_comes_back_as_the_int_of_its_value():
    task_id = echo.enqueue(1e16, 1.5, -0.0, math.pi)

    assert same(Task.objects.get(pk=task_id).args, [10**16, 1.5, 0.0, math.pi])
