"""Bad input to ``django_pgqueue.signal``, searched for (Hypothesis).

Property: a signal is either delivered (its payload stored as its JSON round trip,
tests/fuzzing.py ``stored``), not delivered because the task has finished or does not
exist (None), or refused with InvalidTaskError naming what was wrong; a refusal
changes no row and leaves the caller's transaction usable.
"""

from __future__ import annotations

import pytest
from django.db import transaction
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_pgqueue import InvalidTaskError
from django_pgqueue.models import Task
from django_pgqueue.ops import operations
from tests.factories import TaskFactory
from tests.fuzzing import (
    Refused,
    any_floats,
    big_ints,
    examples,
    hostile_text,
    json_ish,
    same,
    stored,
)

pytestmark = pytest.mark.django_db

WAITING, PENDING, FINISHED = "<waiting for 'go'>", "<pending>", "<succeeded>"


def _expected(task_id, name, payload) -> str | None:
    """The start of the refusal's message, or None when the call is to be accepted."""
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        return "a task id is an int"
    if not isinstance(name, str) or not 1 <= len(name) <= 255:
        return "a signal name is a string of 1-255 characters"
    try:
        stored(name, "the signal name")
        stored(payload, "signal payload")
    except Refused as refusal:
        return f"{refusal.path}: "
    return None


def _rows() -> list[tuple]:
    return list(Task.objects.order_by("pk").values_list("pk", "state", "signals", "wake"))


@settings(max_examples=examples(150))
@given(
    target=st.one_of(
        st.sampled_from([WAITING, PENDING, FINISHED]),
        big_ints,
        hostile_text,
        st.none(),
        st.booleans(),
        any_floats,
    ),
    name=st.one_of(
        st.sampled_from(["go", "x" * 255, "x" * 256]), hostile_text, st.integers(), st.none()
    ),
    payload=json_ish,
)
@example(target=WAITING, name="a\x00", payload=None)  # DataError in the caller's block
@example(target=WAITING, name="\udc00", payload=None)  # UnicodeEncodeError
@example(target="abc", name="go", payload=None)  # DataError: invalid input for bigint
def test_a_signal_is_delivered_or_refused_naming_what_was_wrong(target, name, payload):
    with transaction.atomic():
        ids = {
            WAITING: TaskFactory(state="waiting", wait_reason="signal", wait_signal="go").pk,
            PENDING: TaskFactory().pk,
            FINISHED: TaskFactory(state="succeeded").pk,
        }
        task_id = ids.get(target, target) if isinstance(target, str) else target
        refusal = _expected(task_id, name, payload)
        before = _rows()
        try:
            outcome = operations.signal(task_id, name, payload)
        except InvalidTaskError as exc:
            assert refusal is not None, f"refused, but the rule accepts it: {exc}"
            assert str(exc).startswith(refusal), (str(exc), refusal)
            assert _rows() == before  # the block still queries; nothing changed
        else:
            assert refusal is None, f"accepted, but the rule refuses it: {refusal}"
            live = task_id in (ids[WAITING], ids[PENDING])
            if not live:
                assert outcome is None and _rows() == before
            else:
                row = Task.objects.get(pk=task_id)
                assert same(row.signals[name], stored(payload, "payload"))
                resumes = task_id == ids[WAITING] and name == "go"
                assert outcome == ("resumed" if resumes else "stored")
                state_before = next(r[1] for r in before if r[0] == task_id)
                assert row.state == ("pending" if resumes else state_before)
        transaction.set_rollback(True)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a\x00", r"the signal name: strings must not contain NUL characters"),
        ("go\udc00", r"the signal name: the string has a lone surrogate '\\udc00' at index 2"),
    ],
)
def test_a_signal_name_postgresql_cannot_store_is_refused_and_the_block_stays_usable(
    name, message
):
    task = TaskFactory(state="waiting", wait_reason="signal", wait_signal="go")

    with transaction.atomic():
        with pytest.raises(InvalidTaskError, match=message):
            operations.signal(task.pk, name)
        task.refresh_from_db()  # the block still queries

    assert (task.state, task.signals) == ("waiting", {})


def test_a_task_id_that_is_not_an_int_is_refused_before_any_sql(django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(InvalidTaskError, match="a task id is"):
        operations.signal("abc", "go")
