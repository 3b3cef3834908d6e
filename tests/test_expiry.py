"""Expiry: ``expires=`` on a task or a call. A task that has not started by its
``expires_at`` (by the database's clock) never starts: the claim that picks it, or the
stager that finds it, ends it cancelled with an ``Expired`` error, and its dependents
follow their after_failure.

Worker behaviour runs in real worker subprocesses (burst workers: they run what is due
and exit); the statements' contract is checked with the named SQL (tests/sqlhelpers.py).
"""

import math
import time
from datetime import UTC, timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_pgqueue import cancel, task
from django_pgqueue.core.compat import TaskResultStatus
from django_pgqueue.core.exceptions import Cancelled, InvalidTaskError
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.framework import Expired as ExpiredError
from django_pgqueue.models import Task
from django_pgqueue.tasking.periodic import periodic, schedule_registry
from django_pgqueue.tasking.registry import registry
from django_pgqueue.worker.claimer import stage_params
from tests import framework_tasks, rule_tasks, tasks
from tests.sqlhelpers import claim, row, settle, success
from tests.test_periodic import a_due_tick, enqueue_tick
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def run_burst(start_worker, *args: str) -> str:
    worker = start_worker("--burst", *args, wait=False)
    assert worker.wait(60) == 0, worker.log()
    return worker.log()


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def wait_past(moment) -> None:
    """Sleep until the database's clock has passed ``moment``."""
    while db_now() <= moment:
        time.sleep(0.05)


def expired(task_id: int) -> bool:
    t = Task.objects.get(pk=task_id)
    return t.state == "cancelled" and bool(t.errors) and t.errors[-1]["type"] == "Expired"


# -- the claim -------------------------------------------------------------------------


def test_an_expired_pending_task_is_cancelled_by_the_claim_and_never_runs(start_worker):
    # given a pending task whose expiry passed before any worker ran
    task_id = rule_tasks.expiring.using(expires=0.2).enqueue("late")
    wait_past(Task.objects.get(pk=task_id).expires_at)

    # when a worker claims it
    log = run_burst(start_worker)

    # then it ends cancelled with an Expired error, never started, never run
    t = Task.objects.get(pk=task_id)
    assert (t.state, t.attempt, t.started_at, t.lease_token) == ("cancelled", 0, None, None)
    assert t.finished_at >= t.expires_at
    [error] = t.errors
    assert error["type"] == "Expired"
    assert error["outcome"] == "expired"
    iso = t.expires_at.astimezone(UTC).isoformat(timespec="milliseconds")
    assert error["message"] == f"expired at {iso.replace('+00:00', 'Z')}, before it started"
    assert t.executions == []
    assert not Run.objects.filter(task_id=task_id).exists()
    assert "expired=1" in log


def test_an_unexpired_task_runs_normally(start_worker):
    task_id = rule_tasks.expiring.using(expires=60).enqueue("in time")

    run_burst(start_worker)

    t = Task.objects.get(pk=task_id)
    assert (t.state, t.result, t.attempt) == ("succeeded", "in time", 1)
    assert Run.objects.filter(task_id=task_id).count() == 1


def test_a_claim_takes_unexpired_rows_and_returns_expired_ones_flagged(pg):
    # given a batch with one expired row between two runnable ones
    first = rule_tasks.expiring.using(priority=3).enqueue("a")
    late = rule_tasks.expiring.using(priority=2, expires=0.05).enqueue("b")
    last = rule_tasks.expiring.using(priority=1, expires=3600).enqueue("c")
    wait_past(Task.objects.get(pk=late).expires_at)

    # when one claim takes all three
    claimed = claim(pg, limit=3)

    # then the expired row comes back flagged and cancelled, the others running
    assert [(c.id, c.expired) for c in claimed] == [(first, False), (late, True), (last, False)]
    assert [row(pg, i)["state"] for i in (first, late, last)] == ["running", "cancelled", "running"]
    assert row(pg, late)["lease_token"] is None
    assert row(pg, last)["attempt"] == 1


def test_a_task_that_started_before_its_expiry_is_retried_after_it(pg):
    # given a task that started in time, failed, and is due again after its expiry
    task_id = rule_tasks.expiring.using(expires=0.3).enqueue()
    [first] = claim(pg)
    outcome = {**success(first), "label": "failure", "state": "pending", "error": None}
    settle(pg, [outcome])
    wait_past(Task.objects.get(pk=task_id).expires_at)

    # when it is claimed again
    [again] = claim(pg)

    # then it runs: expiry bounds the first start only
    assert (again.id, again.expired, again.attempt) == (task_id, False, 2)
    assert row(pg, task_id)["state"] == "running"


# -- the stager ------------------------------------------------------------------------


def test_an_expired_scheduled_task_is_cancelled_by_the_stager(start_worker):
    # given a scheduled task due in 0.2 s, expiring in 0.4 s, and no worker until after
    now = db_now()
    task_id = rule_tasks.expiring.using(
        run_at=now + timedelta(seconds=0.2), expires=now + timedelta(seconds=0.4)
    ).enqueue()
    assert Task.objects.get(pk=task_id).state == "scheduled"
    wait_past(now + timedelta(seconds=0.4))

    run_burst(start_worker)

    assert expired(task_id)
    assert Task.objects.get(pk=task_id).attempt == 0
    assert not Run.objects.filter(task_id=task_id).exists()


def test_the_stager_cancels_an_expired_scheduled_row_instead_of_staging_it(pg):
    now = db_now()
    late = rule_tasks.expiring.using(run_at=now, expires=now + timedelta(seconds=0.1)).enqueue()
    due = rule_tasks.expiring.using(run_at=now, expires=3600).enqueue()
    wait_past(now + timedelta(seconds=0.1))

    rows = pg.execute(QUERIES["stage"], stage_params(["default"], 100)).fetchall()

    assert [(queue, staged, expired) for queue, staged, _, expired in rows] == [("default", 1, 1)]
    assert row(pg, late)["state"] == "cancelled"
    assert row(pg, due)["state"] == "pending"


def test_a_stage_that_only_expires_rows_wakes_no_worker(pg):
    # Given a scheduled row past its expiry, and nothing else coming due
    now = db_now()
    late = rule_tasks.expiring.using(run_at=now, expires=now + timedelta(seconds=0.1)).enqueue()
    wait_past(now + timedelta(seconds=0.1))

    # When the stager runs, then it cancels the row and notifies nobody: nothing is
    # there to claim
    rows = pg.execute(QUERIES["stage"], stage_params(["default"], 100)).fetchall()

    assert rows == [("default", 0, None, 1)]
    assert row(pg, late)["state"] == "cancelled"


def test_a_task_waiting_for_its_parents_past_its_expiry_is_cancelled_by_the_stager(
    start_worker,
):
    # given a parent no worker of this test serves (queue "other") and a child that
    # waits for it, expiring in 0.3 s
    parent = tasks.other_queue.enqueue(1)
    child = rule_tasks.expiring.using(after=[parent], expires=0.3).enqueue()
    waiting = Task.objects.get(pk=child)
    assert (waiting.state, waiting.wait_until) == ("waiting", waiting.expires_at)
    wait_past(waiting.expires_at)

    # when a worker of the default queue stages
    run_burst(start_worker)

    # then the child is cancelled as expired; the parent is untouched
    assert expired(child)
    assert "still waiting for parents" in Task.objects.get(pk=child).errors[-1]["message"]
    assert Task.objects.get(pk=parent).state == "pending"


def test_dependents_of_an_expired_parent_follow_their_after_failure(start_worker):
    # given an expiring parent, one dependent cancelled by its failure (the default),
    # one that runs anyway
    parent = rule_tasks.expiring.using(expires=0.2).enqueue("parent")
    cancelled_child = rule_tasks.expiring.using(after=[parent]).enqueue("cancelled")
    proceeding = rule_tasks.expiring.using(after=[parent], after_failure="run").enqueue("runs")
    wait_past(Task.objects.get(pk=parent).expires_at)

    run_burst(start_worker)

    assert expired(parent)
    gone = Task.objects.get(pk=cancelled_child)
    assert gone.state == "cancelled"
    assert gone.errors[-1]["type"] == "UpstreamFailed"
    assert f"task {parent} " in gone.errors[-1]["message"]
    assert Task.objects.get(pk=proceeding).state == "succeeded"
    assert list(Run.objects.values_list("label", flat=True)) == ["runs"]


# -- what is written -------------------------------------------------------------------


def test_expires_in_seconds_counts_from_the_enqueue_on_the_database_clock():
    task_id = rule_tasks.expiring.using(expires=90).enqueue()

    t = Task.objects.get(pk=task_id)
    assert abs((t.expires_at - t.enqueued_at).total_seconds() - 90) < 1


def test_expires_as_a_datetime_is_stored_as_given():
    when = timezone.now() + timedelta(hours=2)

    task_id = rule_tasks.expiring.using(expires=when).enqueue()

    assert Task.objects.get(pk=task_id).expires_at == when


def test_a_task_default_expiry_applies_and_using_replaces_it():
    default = rule_tasks.expiring_by_default.enqueue()
    shorter = rule_tasks.expiring_by_default.using(expires=timedelta(minutes=5)).enqueue()
    never = rule_tasks.expiring.enqueue()

    rows = {t.id: t for t in Task.objects.all()}
    assert abs((rows[default].expires_at - rows[default].enqueued_at).total_seconds() - 3600) < 1
    assert abs((rows[shorter].expires_at - rows[shorter].enqueued_at).total_seconds() - 300) < 1
    assert rows[never].expires_at is None


@pytest.mark.parametrize("how", ["enqueue_many", "unique", "after", "on_commit"])
def test_every_enqueue_path_writes_the_expiry(how):
    definition = rule_tasks.expiring.using(expires=120)
    if how == "enqueue_many":
        ids = definition.enqueue_many(["a", "b"])
    elif how == "unique":
        ids = [definition.using(unique_key="k").enqueue()]
    elif how == "after":
        ids = [definition.using(after=[tasks.noop.enqueue()]).enqueue()]
    else:
        ids = [definition.enqueue_on_commit()]

    for t in Task.objects.filter(pk__in=ids):
        assert abs((t.expires_at - t.enqueued_at).total_seconds() - 120) < 1
    assert Task.objects.filter(pk__in=ids).count() == len(ids)


def test_a_periodic_tick_carries_the_tasks_expiry(pg):
    # given a schedule of a task whose default expiry is an hour
    schedule = periodic(rule_tasks.expiring_by_default, every=1, name="tests.expiry.tick")
    try:
        tick = a_due_tick(pg, schedule)

        # when its tick is enqueued
        result = enqueue_tick(pg, schedule, tick)
    finally:
        schedule_registry.unregister(schedule.name)

    # then the expiry counts from the tick's enqueue
    t = Task.objects.get(pk=result["task_id"])
    assert abs((t.expires_at - t.enqueued_at).total_seconds() - 3600) < 1


# -- what is refused -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [0, -1, math.nan, math.inf, 1e12, "60", True, timedelta(0), None.__class__],
    ids=["zero", "negative", "nan", "inf", "too long", "a string", "a bool", "no time", "a type"],
)
def test_a_bad_expiry_is_refused_and_nothing_is_written(value):
    with pytest.raises(InvalidTaskError, match="expires must be a number of seconds"):
        rule_tasks.expiring.using(expires=value).enqueue()

    assert not Task.objects.exists()


def test_a_naive_datetime_expiry_is_refused():
    with pytest.raises(InvalidTaskError, match="naive datetime while USE_TZ = True"):
        rule_tasks.expiring.using(expires=timezone.now().replace(tzinfo=None))


def test_an_expiry_that_comes_before_the_task_is_due_is_refused():
    now = timezone.now()

    with pytest.raises(InvalidTaskError, match="is not after run_at"):
        rule_tasks.expiring.using(run_at=now + timedelta(hours=1), expires=now)
    with pytest.raises(InvalidTaskError, match="is not longer than delay"):
        rule_tasks.expiring.using(delay=60, expires=30)
    with pytest.raises(InvalidTaskError, match="is not longer than delay"):
        rule_tasks.expiring_by_default.using(delay=7200)  # its default is 3600 s


def test_a_datetime_expiry_on_the_decorator_is_refused():
    def handler() -> None: ...

    with pytest.raises(InvalidTaskError, match="a fixed time belongs to one call"):
        task(name="tests.expiry.refused", expires=timezone.now())(handler)
    with pytest.raises(InvalidTaskError, match="expires must be a number of seconds"):
        task(name="tests.expiry.refused", expires=0)(handler)

    assert "tests.expiry.refused" not in registry


# -- the Tasks framework backend ---------------------------------------------------------

EXPIRING_BACKEND = {
    "BACKEND": "django_pgqueue.backends.PgQueueBackend",
    "QUEUES": ["default"],
    "OPTIONS": {"expires": 0.2},
}


def test_the_backends_expires_option_ends_a_task_not_started_in_time_failed(pg, settings):
    with override_settings(TASKS={**settings.TASKS, "expiring": EXPIRING_BACKEND}):
        result = framework_tasks.add.using(backend="expiring").enqueue(1, 2)
        t = Task.objects.get(pk=int(result.id))
        assert abs((t.expires_at - t.enqueued_at).total_seconds() - 0.2) < 0.05
        wait_past(t.expires_at)

        [claimed] = claim(pg)
        result.refresh()

    assert claimed.expired
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [ExpiredError, Cancelled]


def test_a_bad_expires_option_is_refused_when_the_backend_is_built():
    from django_pgqueue.backends import PgQueueBackend
    from django_pgqueue.core.compat import InvalidTaskBackendError

    with pytest.raises(InvalidTaskBackendError, match="expires must be a number of seconds"):
        PgQueueBackend("broken", {"OPTIONS": {"expires": -5}})


# -- metrics, the migration ---------------------------------------------------------------


def test_a_worker_counts_the_tasks_it_expired(start_worker):
    from tests.conftest import wait_until
    from tests.test_metrics import free_port, scrape

    by_claim = rule_tasks.expiring.using(expires=0.1).enqueue()
    now = db_now()
    by_stager = rule_tasks.expiring.using(
        run_at=now, expires=now + timedelta(seconds=0.1)
    ).enqueue()
    wait_past(now + timedelta(seconds=0.2))
    port = free_port()

    start_worker("--metrics-port", str(port))

    wait_until(lambda: expired(by_claim) and expired(by_stager), message="both to expire")
    values = wait_until(lambda: scrape(port), message="a scrape")
    assert values[("pgqueue_tasks_expired_total",)] == 2
    assert values[("pgqueue_tasks_claimed_total",)] == 0


def test_an_expired_task_is_finished_and_a_cancel_leaves_it_alone(pg):
    task_id = rule_tasks.expiring.using(expires=0.05).enqueue()
    wait_past(Task.objects.get(pk=task_id).expires_at)
    claim(pg)

    assert cancel(task_id) is None
    assert len(Task.objects.get(pk=task_id).errors) == 1


def test_the_migration_unapplies_and_applies():
    def has_column() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM information_schema.columns "
                "WHERE table_name = 'pgqueue_task' AND column_name = 'expires_at'"
            )
            return cursor.fetchone() is not None

    call_command("migrate", "django_pgqueue", "0008", verbosity=0)
    try:
        assert not has_column()
    finally:
        call_command("migrate", "django_pgqueue", verbosity=0)
    assert has_column()
