"""Reviving tasks: "retry now" and "requeue" bring tasks back to pending, through
``operations.retry_now`` / ``requeue_dead``, the admin's actions and bulk actions and
``manage.py pgqueue_requeue``. A revived task runs: no cancel flag of its earlier life
survives.

The givens are made by the worker's own statements (tests/sqlhelpers.py) on a second
connection, so the rows are committed as a worker leaves them.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from django_pgqueue import cancel, operations
from django_pgqueue.models import Task
from django_pgqueue.registry import TaskDefinition
from tests import sqlhelpers, tasks
from tests.test_admin import act
from tests.test_admin_ops import select_all

pytestmark = pytest.mark.django_db(transaction=True)


def dead_after_a_hard_cancel(
    pg, definition: TaskDefinition = tasks.noop, *args: Any, **options: Any
) -> int:
    """A task whose last attempt was asked to stop with ``hard=True`` and then failed
    (its handler raised before the kill landed), settled by the worker's statements.
    ``options`` go to ``using``."""
    task_id = definition.using(max_attempts=1, **options).enqueue(*args)
    [claimed] = sqlhelpers.claim(pg, routes=[(definition.name, definition.version)])
    assert cancel(task_id, hard=True) == "cancel_requested"
    error = {"attempt": 1, "type": "builtins.ValueError", "message": "no luck", "traceback": None}
    settled = sqlhelpers.settle(
        pg,
        [
            {
                "id": claimed.id,
                "attempt": claimed.attempt,
                "token": claimed.lease_token,
                "label": "failure",
                "state": "failed",
                "error": {**error, "outcome": "failure"},
            }
        ],
    )
    assert settled == {task_id: "failed"}
    row = Task.objects.get(pk=task_id)
    assert (row.state, row.cancel_requested, row.cancel_hard) == ("failed", True, True)
    return task_id


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def bulk(client, action: str) -> None:
    upto = select_all(client, action, "state__exact=failed").context["upto"]
    select_all(client, action, "state__exact=failed", pgqueue_confirm="yes", pgqueue_upto=upto)


# Every way an operator revives a dead letter: (name, revive(admin_client, task_id)).
REVIVALS = {
    "retry_now": lambda client, task_id: operations.retry_now([task_id]),
    "requeue_dead": lambda client, task_id: operations.requeue_dead([task_id]),
    "admin retry now": lambda client, task_id: act(
        client, "retry_now", Task.objects.get(pk=task_id)
    ),
    "admin requeue": lambda client, task_id: act(client, "requeue", Task.objects.get(pk=task_id)),
    "bulk retry now": lambda client, task_id: bulk(client, "retry_now"),
    "bulk requeue": lambda client, task_id: bulk(client, "requeue"),
    "pgqueue_requeue": lambda client, task_id: run("pgqueue_requeue", "--id", str(task_id)),
}


# -- cancel flags ---------------------------------------------------------------------


@pytest.mark.parametrize("how", REVIVALS)
def test_a_revived_dead_letter_carries_no_cancel_flag_of_its_last_attempt(pg, admin_client, how):
    # Given a dead letter whose last attempt was hard-cancelled, then failed
    task_id = dead_after_a_hard_cancel(pg)

    # When an operator revives it
    REVIVALS[how](admin_client, task_id)

    # Then it is due, and nothing asks it to stop
    row = Task.objects.get(pk=task_id)
    assert (row.state, row.cancel_requested, row.cancel_hard) == ("pending", False, False)


def test_a_soft_cancel_of_a_task_left_flagged_hard_by_an_older_release_stays_soft(pg):
    # Given a running task whose row still says cancel_hard without a cancel request
    # (what an older release's retry left: it cleared cancel_requested only)
    task_id = tasks.noop.enqueue()
    Task.objects.filter(pk=task_id).update(cancel_hard=True)
    sqlhelpers.claim(pg, routes=[(tasks.noop.name, tasks.noop.version)])

    # When an operator asks it to stop, softly
    assert cancel(task_id) == "cancel_requested"

    # Then the request is a soft one: the handler is asked, never killed
    row = Task.objects.get(pk=task_id)
    assert (row.cancel_requested, row.cancel_hard) == (True, False)
