"""A task definition's row is validated and built on its first enqueue and reused by
the next ones (enqueue.py, build_row): what changes between calls must still be
written and checked on every call."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.test import override_settings

from django_pgqueue import InvalidTaskError, PayloadTooLarge
from django_pgqueue.models import Task
from tests.ledger_tasks import ledger_keyed
from tests.settings import PGQUEUE
from tests.tasks import noop

pytestmark = pytest.mark.django_db

COLUMNS = (
    "queue", "task_name", "handler_version", "priority", "state", "max_attempts",
    "retry_policy", "timeout", "unique_key", "metadata", "concurrency_key", "kwargs",
)  # fmt: skip


def test_a_definitions_later_enqueues_write_the_row_its_first_wrote():
    # Given a task with options of every kind
    t = noop.using(
        queue="emails", priority=7, delay=30, max_attempts=4, timeout=5, backoff=3,
        metadata={"tenant": "a"}, expires=600,
    )  # fmt: skip
    # When it is enqueued three times
    ids = [t.enqueue(n) for n in (1, 2, 3)]
    # Then the rows differ only in their arguments (and the times taken from each
    # statement's clock: the delay's run_at, the expiry's expires_at)
    rows = list(Task.objects.filter(id__in=ids).order_by("id").values("args", *COLUMNS))
    assert [row.pop("args") for row in rows] == [[1], [2], [3]]
    assert rows[0] == rows[1] == rows[2]
    assert rows[0]["state"] == "scheduled" and rows[0]["queue"] == "emails"
    assert Task.objects.filter(id__in=ids, expires_at__isnull=False).count() == 3


def test_metadata_changed_after_using_is_written_and_checked_again():
    # Given a task whose metadata dict the caller keeps and changes
    metadata = {"tenant": "a"}
    t = noop.using(metadata=metadata)
    first = t.enqueue(1)
    metadata["tenant"] = "b"
    second = t.enqueue(2)
    # Then each row has the metadata of its call
    assert Task.objects.get(id=first).metadata == {"tenant": "a"}
    assert Task.objects.get(id=second).metadata == {"tenant": "b"}
    # And a value that is not JSON, added later, is refused, nothing written
    metadata["ratio"] = float("nan")
    with pytest.raises(InvalidTaskError, match=r"metadata\['ratio'\]"):
        t.enqueue(3)
    assert Task.objects.count() == 2


def test_a_bad_option_is_refused_on_every_call_and_bad_args_after_good_ones():
    # A naive run_at while USE_TZ = True: refused each time, not only the first
    t = noop.using(run_at=datetime(2030, 1, 1))
    for _ in range(2):
        with pytest.raises(InvalidTaskError, match="naive datetime"):
            t.enqueue(1)
    # A definition that enqueued fine still checks each call's arguments
    noop.enqueue(1)
    with pytest.raises(InvalidTaskError, match=r"args\[0\]"):
        noop.enqueue(object())
    with pytest.raises(InvalidTaskError, match=r"kwargs\['n'\]"):
        noop.enqueue(n=float("inf"))
    assert Task.objects.count() == 1


def test_the_concurrency_key_function_runs_on_every_call():
    # Given a task whose per-key limit takes the key from the arguments
    first = ledger_keyed.enqueue(1, "account:1")
    second = ledger_keyed.enqueue(2, "account:2")
    explicit = ledger_keyed.using(concurrency_key="account:9").enqueue(3, "account:3")
    keys = dict(Task.objects.values_list("id", "concurrency_key"))
    assert [keys[first], keys[second], keys[explicit]] == ["account:1", "account:2", "account:9"]
    # And a key that does not fit its column is refused on a later call too
    with pytest.raises(InvalidTaskError, match="concurrency_key"):
        ledger_keyed.enqueue(4, "k" * 300)
    assert Task.objects.count() == 3


def test_a_limit_changed_after_the_first_enqueue_applies_to_the_next():
    noop.enqueue("x" * 2000)
    with (
        override_settings(PGQUEUE={**PGQUEUE, "MAX_ARGS_BYTES": 1024}),
        pytest.raises(PayloadTooLarge),
    ):
        noop.enqueue("x" * 2000)
    assert Task.objects.count() == 1
