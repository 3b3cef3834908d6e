"""The payload checks (payload.py) a person or a stored row meets: JSON typed in the
admin, and stored calls a worker cannot run. Pinned in this process (mutmut's tests of
the checks, CONTRIBUTING.md); the enqueue path's checks are in test_bad_input_enqueue.py
and test_validation.py."""

from __future__ import annotations

import pytest

from django_pgqueue.core.exceptions import InvalidTaskError, PayloadTooLarge
from django_pgqueue.core.payload import (
    RESULT_LIMIT,
    check_stored_call,
    check_value_size,
    parse_json,
)


def test_typed_json_is_parsed_and_an_empty_text_is_null():
    assert parse_json(' [1, "a", {"b": null}] ', "args") == [1, "a", {"b": None}]
    assert parse_json("  ", "args") is None


def test_typed_text_that_is_not_json_says_where_it_stops_and_how_to_quote():
    with pytest.raises(InvalidTaskError) as caught:
        parse_json("{'by': 'ops'}", "kwargs")

    assert str(caught.value) == (
        "kwargs is not JSON: Expecting property name enclosed in double quotes at line 1, "
        'column 2 (a string needs double quotes: "yes"; an object: {"by": "ops"})'
    )


def test_a_typed_number_too_long_for_python_is_refused_saying_to_send_a_string():
    with pytest.raises(InvalidTaskError) as caught:
        parse_json("1" * 5000, "args")

    assert str(caught.value) == (
        "args: a number is longer than 1000 digits; pass numbers that large as strings"
    )


def test_typed_json_too_deep_is_refused():
    with pytest.raises(InvalidTaskError, match=r"^args: nested deeper than \d+ levels$"):
        parse_json("[" * 100_000 + "]" * 100_000, "args")


def test_typed_json_is_checked_like_a_value_naming_where():
    with pytest.raises(InvalidTaskError, match=r"^metadata\[0\]: "):
        parse_json('["\\u0000"]', "metadata")


# -- stored calls a worker cannot run ------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "problem"),
    [(None, {}, "the stored args are a JSON null, not an array"),
     (True, {}, "the stored args are a JSON boolean, not an array"),
     (1.5, {}, "the stored args are a JSON number, not an array"),
     ("x", {}, "the stored args are a JSON string, not an array"),
     ({}, {}, "the stored args are a JSON object, not an array"),
     ((1,), {}, "the stored args are a JSON tuple, not an array"),
     ([], [], "the stored kwargs are a JSON array, not an object"),
     ([], {1: 2}, "the stored kwargs have the key 1, which is not a string")],
)  # fmt: skip
def test_a_stored_call_that_cannot_be_spread_says_what_it_holds(args, kwargs, problem):
    assert check_stored_call(args, kwargs).startswith(problem)


def test_a_stored_call_that_cannot_be_spread_says_why_it_cannot_run():
    assert check_stored_call(None, {}) == (
        "the stored args are a JSON null, not an array: this row was written by hand or "
        "by an old version; it cannot be run"
    )
    assert check_stored_call([], []) == (
        "the stored kwargs are a JSON array, not an object: this row was written by hand "
        "or by an old version; it cannot be run"
    )
    assert check_stored_call([], {1: 2}) == (
        "the stored kwargs have the key 1, which is not a string: this row cannot be run"
    )


def test_a_stored_call_of_an_array_and_an_object_can_run():
    assert check_stored_call([1, "a"], {"n": 1}) is None


# -- a handler's result or checkpoint, checked at the worker -----------------------------


def test_a_result_over_its_limit_is_refused_naming_the_limit(settings):
    settings.PGQUEUE = {**settings.PGQUEUE, "MAX_RESULT_BYTES": 1024}

    check_value_size(RESULT_LIMIT, "x" * 1000)  # 1,002 bytes as JSON
    for scalar in (None, True, 10**999, 1e308):
        check_value_size(RESULT_LIMIT, scalar)
    with pytest.raises(PayloadTooLarge) as caught:
        check_value_size(RESULT_LIMIT, ["x" * 1100])

    assert str(caught.value).startswith(
        "the task's result: 1,104 bytes as JSON, more than the limit of 1,024 bytes "
        "(PGQUEUE['MAX_RESULT_BYTES']): store a large result elsewhere"
    )
