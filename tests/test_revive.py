"""Reviving tasks: "retry now" and "requeue" bring tasks back to pending, through
``operations.retry_now`` / ``requeue_dead``, the admin's actions and bulk actions and
``manage.py pgqueue_requeue``. A revived task runs: no cancel flag of its earlier life
survives.

The givens are made by the worker's own statements (tests/sqlhelpers.py) on a second
connection, so the rows are committed as a worker leaves them.
"""

from __future__ import annotations

import threading
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from django_pgqueue import cancel
from django_pgqueue.models import Task
from django_pgqueue.ops import operations
from django_pgqueue.tasking.registry import TaskDefinition
from tests import sqlhelpers, tasks
from tests.conftest import wait_until
from tests.factories import TaskFactory
from tests.test_admin import act, messages_of
from tests.test_admin_ops import select_all
from tests.test_unique import LIVE, InThread, lock_waiters

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


def selected(ids: list[int]) -> list[Task]:
    return list(Task.objects.filter(pk__in=ids))


# Every way an operator revives dead letters (of tests.tasks.noop, the only ones in
# these tests): (name, revive(admin_client, ids)).
REVIVALS = {
    "retry_now": lambda client, ids: operations.retry_now(ids),
    "requeue_dead": lambda client, ids: operations.requeue_dead(ids),
    "admin retry now": lambda client, ids: act(client, "retry_now", *selected(ids)),
    "admin requeue": lambda client, ids: act(client, "requeue", *selected(ids)),
    "bulk retry now": lambda client, ids: bulk(client, "retry_now"),
    "bulk requeue": lambda client, ids: bulk(client, "requeue"),
    "pgqueue_requeue": lambda client, ids: run("pgqueue_requeue", "--task", tasks.noop.name),
}


# -- cancel flags ---------------------------------------------------------------------


@pytest.mark.parametrize("how", REVIVALS)
def test_a_revived_dead_letter_carries_no_cancel_flag_of_its_last_attempt(pg, admin_client, how):
    # Given a dead letter whose last attempt was hard-cancelled, then failed
    task_id = dead_after_a_hard_cancel(pg)

    # When an operator revives it
    REVIVALS[how](admin_client, [task_id])

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


# -- unique keys ------------------------------------------------------------------------


def dead(**kwargs: Any) -> int:
    """A dead letter of tests.tasks.noop, as a worker leaves one."""
    defaults = {"state": "failed", "attempt": 3, "finished_at": timezone.now()}
    return TaskFactory(**{**defaults, **kwargs}).pk


def live(key: str) -> list[tuple[int, str]]:
    """The live tasks of a unique key: (id, state)."""
    rows = Task.objects.filter(unique_key=key, state__in=LIVE).order_by("pk")
    return list(rows.values_list("pk", "state"))


@pytest.mark.parametrize("how", REVIVALS)
def test_reviving_dead_letters_that_share_a_unique_key_revives_the_newest_only(
    admin_client, how
):
    # Given two dead letters of one unique key (a recurring unique job failed twice)
    older, newer = dead(unique_key="nightly"), dead(unique_key="nightly")

    # When an operator revives both
    REVIVALS[how](admin_client, [older, newer])

    # Then the newest is due, and the other stays dead
    assert live("nightly") == [(newer, "pending")]
    assert Task.objects.get(pk=older).state == "failed"


@pytest.mark.parametrize("revive", [operations.retry_now, operations.requeue_dead])
def test_the_revive_functions_report_each_dead_letter_left_dead_and_why(revive):
    # Given twins of one key, a dead letter whose key a live task holds, and a plain one
    older, newer = dead(unique_key="nightly"), dead(unique_key="nightly")
    held = dead(unique_key="invoice-7")
    holder = TaskFactory(unique_key="invoice-7").pk
    plain = dead()

    # When all are revived
    revived = revive([older, newer, held, plain])

    # Then the newest twin and the plain one are revived, the others reported
    assert revived == [newer, plain]
    assert revived.skipped == {
        older: f"task {newer}, a newer dead letter with the same unique key 'nightly', "
        "is revived instead",
        held: f"its unique key 'invoice-7' belongs to live task {holder}",
    }


def test_the_requeue_dry_run_reports_what_the_requeue_then_does():
    # Given three dead letters of one key, two of a key held by a live task, plain ones
    for key in ("a", "a", "a", "held", "held", None, None):
        dead(unique_key=key)
    TaskFactory(unique_key="held")

    # When the same requeue is asked as a dry run, then for real
    planned = operations.requeue_dead(task_name=tasks.noop.name, dry_run=True)
    assert Task.objects.filter(state="pending").count() == 1  # the dry run changed nothing
    done = operations.requeue_dead(task_name=tasks.noop.name)

    # Then both say the same: one per key, the plain ones, and the same reasons
    assert (list(planned), planned.skipped) == (list(done), done.skipped)
    assert len(done) == 3 and len(done.skipped) == 4


def test_the_admin_action_reports_the_dead_letters_left_dead_and_why(admin_client):
    older, newer = dead(unique_key="nightly"), dead(unique_key="nightly")

    response = act(admin_client, "requeue", *selected([older, newer]))

    assert response.status_code == 200
    assert messages_of(response) == [
        "Requeued 1 task with a fresh attempt budget.",
        f"Left 1 dead letter(s) dead for their unique key: task {older}: task {newer}, a "
        "newer dead letter with the same unique key 'nightly', is revived instead.",
    ]


def test_the_bulk_action_reports_the_dead_letters_left_dead_and_why(admin_client):
    older, newer = dead(unique_key="nightly"), dead(unique_key="nightly")
    upto = select_all(admin_client, "retry_now", "state__exact=failed").context["upto"]

    response = select_all(
        admin_client, "retry_now", "state__exact=failed", pgqueue_confirm="yes", pgqueue_upto=upto
    )

    reports = messages_of(response)
    assert reports[0].startswith("Retry now: 1 task done in 1 batch")
    assert reports[1:] == [
        f"Left 1 dead letter(s) dead for their unique key: task {older}: task {newer}, a "
        "newer dead letter with the same unique key 'nightly', is revived instead."
    ]


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_pgqueue_requeue_prints_the_dead_letters_left_dead_and_why(dry_run):
    older, newer = dead(unique_key="nightly"), dead(unique_key="nightly")

    output = run("pgqueue_requeue", "--task", tasks.noop.name, *dry_run)

    verbs = ("would requeue", "would leave") if dry_run else ("requeued", "left")
    assert output == (
        f"{verbs[0]} 1 dead letter(s): {newer}\n"
        f"{verbs[1]} 1 dead for their unique key:\n"
        f"  task {older}: task {newer}, a newer dead letter with the same unique key "
        "'nightly', is revived instead\n"
    )


# -- unique keys, concurrently ---------------------------------------------------------


def test_an_enqueue_committed_while_a_requeue_waits_on_its_key_wins_and_nothing_fails(pg):
    # Given a dead letter of a key, a plain one, and an enqueue of that key in flight
    # (inserted, not yet committed)
    keyed, plain = dead(unique_key="nightly"), dead()
    release = threading.Event()

    def enqueue() -> int:
        with transaction.atomic():
            task_id = tasks.noop.using(unique_key="nightly").enqueue()
            release.wait(10)
        return task_id

    enqueuer = InThread(enqueue)
    wait_until(lambda: live_uncommitted(pg, "nightly"), message="the enqueue's insert")

    # When a requeue of both runs: it waits on the key's uncommitted index entry
    requeue = InThread(lambda: operations.requeue_dead([keyed, plain]))
    wait_until(lambda: lock_waiters(pg) == 1, message="the requeue to wait")
    release.set()

    # Then the enqueue wins its key, the requeue keeps that dead letter dead and says
    # why, and revives the other
    enqueued, requeued = enqueuer.join(), requeue.join()
    assert requeued == [plain]
    assert requeued.skipped == {keyed: f"its unique key 'nightly' belongs to live task {enqueued}"}
    assert live("nightly") == [(enqueued, "pending")]
    assert Task.objects.get(pk=plain).state == "pending"


def test_an_enqueue_of_a_key_a_requeue_is_reviving_returns_the_revived_task(pg):
    # Given a requeue of a dead letter of a key, in flight (not yet committed)
    keyed = dead(unique_key="nightly")
    release = threading.Event()

    def requeue() -> list[int]:
        with transaction.atomic():
            revived = operations.requeue_dead([keyed])
            release.wait(10)
        return revived

    requeuer = InThread(requeue)
    wait_until(lambda: live_uncommitted(pg, "nightly"), message="the requeue's update")

    # When the key is enqueued meanwhile: the enqueue waits for the requeue
    enqueuer = InThread(lambda: tasks.noop.using(unique_key="nightly").enqueue())
    wait_until(lambda: lock_waiters(pg) == 1, message="the enqueue to wait")
    release.set()

    # Then the enqueue returns the revived task, and the key has one live task
    assert requeuer.join() == [keyed]
    assert enqueuer.join() == keyed
    assert live("nightly") == [(keyed, "pending")]


def test_two_operators_reviving_dead_letters_of_one_key_at_once_revive_one(pg):
    # Given two dead letters of one key; one operator's retry of the older in flight
    older, newer = dead(unique_key="nightly"), dead(unique_key="nightly")
    release = threading.Event()

    def retry() -> list[int]:
        with transaction.atomic():
            retried = operations.retry_now([older])
            release.wait(10)
        return retried

    first = InThread(retry)
    wait_until(lambda: live_uncommitted(pg, "nightly"), message="the first revive")

    # When another operator requeues the newer one meanwhile
    second = InThread(lambda: operations.requeue_dead([newer]))
    wait_until(lambda: lock_waiters(pg) == 1, message="the second revive to wait")
    release.set()

    # Then the first wins the key, and the second reports why it kept its dead letter
    assert first.join() == [older]
    requeued = second.join()
    assert requeued == []
    assert requeued.skipped == {newer: f"its unique key 'nightly' belongs to live task {older}"}
    assert live("nightly") == [(older, "pending")]


def live_uncommitted(pg, key: str) -> bool:
    """Whether another transaction holds an uncommitted live row of ``key``: a probe
    insert would wait for it (tried with a lock timeout, and rolled back)."""
    try:
        with pg.transaction(force_rollback=True):
            pg.execute("SET LOCAL lock_timeout = '50ms'")
            pg.execute(
                "INSERT INTO pgqueue_task (queue, task_name, state, unique_key) "
                "VALUES ('probe', 'probe', 'pending', %s) "
                "ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL "
                "AND state IN ('scheduled', 'pending', 'running', 'waiting') DO NOTHING",
                [key],
            )
    except psycopg.errors.LockNotAvailable:
        return True
    return False
