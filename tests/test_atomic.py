"""Atomic tasks (``@task(atomic=True)``, docs/guarantees.md, "Exactly-once effects in
the task's database"): the handler's writes in the task's database commit with the
attempt's outcome, in one transaction, and only while the attempt holds its lease.

The handlers (tests/atomic_tasks.py) write Effect rows in the task's database. Most
tests run them with django_pgqueue.testing's run_tasks (the worker's own execution and
SQL, in the test's thread); the ones about leases, locks and execution modes run real
worker processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.db import connection, transaction

from django_pgqueue import InvalidTaskError, task
from django_pgqueue.core.ticks import Every
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Task
from django_pgqueue.tasking.periodic import ScheduleDefinition
from django_pgqueue.testing import run_tasks
from tests.atomic_tasks import (
    atomic_checkpoint,
    atomic_child,
    atomic_effect,
    atomic_elsewhere,
    atomic_enqueues_into,
    atomic_overrun,
    atomic_parent,
    atomic_reads_elsewhere,
    atomic_waits_for_child,
    idempotency_key,
    plain_effect,
)
from tests.conftest import wait_until
from tests.testapp.models import Effect

BOTH = pytest.mark.parametrize(
    "mode",
    [
        pytest.param("in_transaction", marks=pytest.mark.django_db, id="in_transaction"),
        pytest.param("committed", marks=pytest.mark.django_db(transaction=True),
                     id="committed"),
    ],
)


def effects(task_id: int) -> list[str]:
    return list(Effect.objects.filter(task_id=task_id).values_list("label", flat=True))


# -- what commits, what rolls back ------------------------------------------------------


@BOTH
def test_a_successful_atomic_attempt_keeps_its_writes_and_succeeds(mode):
    task_id = atomic_effect.enqueue(1)

    result = run_tasks()

    assert result.counts == {"success": 1}
    assert Task.objects.get(pk=task_id).state == "succeeded"
    assert effects(task_id) == ["n=1"]


@BOTH
@pytest.mark.parametrize("fail", ["raise", "retry", "snooze"])
def test_a_failing_atomic_attempt_leaves_no_write_behind(mode, fail):
    # Given an atomic task that writes, then fails (raises, retries, snoozes)
    task_id = atomic_effect.using(max_attempts=1).enqueue(1, fail=fail)

    # When it runs once
    run_tasks(max_tasks=1)

    # Then its write is gone, and its outcome is written as for any task
    assert effects(task_id) == []
    state = Task.objects.get(pk=task_id).state
    assert state == {"raise": "failed", "retry": "failed", "snooze": "pending"}[fail]


@BOTH
def test_the_same_task_without_atomic_keeps_the_write_of_its_failed_attempt(mode):
    task_id = plain_effect.using(max_attempts=1).enqueue(1, fail="raise")

    run_tasks(max_tasks=1)

    assert effects(task_id) == ["n=1"]


@BOTH
def test_continue_commits_the_slice_with_its_checkpoint(mode):
    # Given an atomic task that writes, then continues with a checkpoint (first slice)
    task_id = atomic_effect.enqueue(1, fail="continue")

    # When both slices run
    result = run_tasks()

    # Then each slice's write was kept
    assert result.counts == {"continued": 1, "success": 1}
    assert effects(task_id) == ["n=1", "n=1"]


@BOTH
def test_an_atomic_attempt_past_its_timeout_is_rolled_back_as_a_timeout(mode):
    task_id = atomic_overrun.using(max_attempts=1).enqueue()

    result = run_tasks()

    assert result.counts == {"timeout": 1}
    assert effects(task_id) == []
    row = Task.objects.get(pk=task_id)
    assert row.state == "failed"
    assert "rolled back" in row.errors[-1]["message"]


@BOTH
def test_children_an_atomic_handler_enqueues_commit_with_its_success(mode):
    parent = atomic_parent.enqueue(1)

    result = run_tasks()

    assert result.counts == {"success": 2}
    children = Task.objects.filter(task_name=atomic_child.name)
    assert [c.state for c in children] == ["succeeded"]
    assert Effect.objects.filter(label="child 1").count() == 1
    assert effects(parent) == ["parent 1"]


@BOTH
def test_children_of_a_failed_atomic_attempt_are_never_enqueued(mode):
    atomic_parent.using(max_attempts=1).enqueue(1, fail=True)

    result = run_tasks()

    assert result.counts == {"failure": 1}
    assert not Task.objects.filter(task_name=atomic_child.name).exists()
    assert not Effect.objects.exists()


@BOTH
def test_checkpoint_and_progress_of_an_atomic_attempt_share_its_fate(mode):
    kept = atomic_checkpoint.enqueue(False)
    rolled_back = atomic_checkpoint.using(max_attempts=1).enqueue(True)

    run_tasks()

    row = Task.objects.get(pk=kept)
    assert (row.state, row.checkpoint, row.progress) == ("succeeded", {"step": 2}, {"done": 2})
    row = Task.objects.get(pk=rolled_back)
    assert (row.state, row.checkpoint, row.progress) == ("failed", None, None)


@BOTH
def test_a_dependent_of_an_atomic_task_is_released_by_its_commit(mode):
    parent = atomic_effect.enqueue(1)
    child = atomic_effect.using(after=[parent]).enqueue(2)

    result = run_tasks()

    assert result.ids == [parent, child]
    assert Task.objects.get(pk=child).state == "succeeded"


@BOTH
def test_a_chords_callback_runs_once_its_atomic_members_committed(mode):
    from django_pgqueue.tasking.workflows import chord

    members, callback = chord([atomic_effect.step(1), atomic_effect.step(2)],
                              atomic_effect.step(3))

    result = run_tasks()

    assert result.ids[-1] == callback
    assert sorted(result.ids[:2]) == sorted(members)
    assert {t.state for t in result.tasks()} == {"succeeded"}
    assert sorted(Effect.objects.values_list("label", flat=True)) == ["n=1", "n=2", "n=3"]


@BOTH
def test_a_unique_key_an_atomic_handler_took_is_free_again_after_its_rollback(mode):
    # Given a task enqueued with a unique key by an atomic handler that then failed
    atomic_parent.using(max_attempts=1).enqueue(1, fail=True, unique_key="child-1")
    run_tasks()

    # Then no task holds the key: the failed attempt's enqueue never happened
    assert not Task.objects.filter(unique_key="child-1").exists()
    first = atomic_child.using(unique_key="child-1").enqueue(1)
    assert Task.objects.get(unique_key="child-1").id == first


# -- choosing atomic --------------------------------------------------------------------


@BOTH
def test_using_atomic_false_runs_an_atomic_task_without_its_transaction(mode):
    task_id = atomic_effect.using(atomic=False, max_attempts=1).enqueue(1, fail="raise")

    run_tasks()

    assert effects(task_id) == ["n=1"]


@BOTH
def test_using_atomic_true_runs_a_plain_task_in_a_transaction(mode):
    task_id = plain_effect.using(atomic=True, max_attempts=1).enqueue(1, fail="raise")

    run_tasks()

    assert effects(task_id) == []


@pytest.mark.django_db
def test_the_calls_own_choice_is_frozen_on_its_row_and_the_tasks_is_not():
    chosen = plain_effect.using(atomic=True).enqueue(1)
    default = atomic_effect.enqueue(1)

    rows = {t.id: t.retry_policy for t in Task.objects.all()}

    assert rows[chosen]["atomic"] is True
    assert "atomic" not in rows[default]


@pytest.mark.django_db
def test_a_periodic_task_with_atomic_enqueues_its_ticks_atomic():
    schedule = ScheduleDefinition(
        name="atomic-every-minute", task=plain_effect.using(atomic=True), ticks=Every(60),
        args=(1,), kwargs={}, timezone="UTC", missed="once", catch_up_limit=1,
    )

    row = schedule.task_row({})

    assert json.loads(row["retry_policy"])["atomic"] is True


def test_atomic_true_on_an_async_def_is_refused_at_registration():
    with pytest.raises(InvalidTaskError, match="atomic=True needs a plain def handler"):

        @task(name="tests.test_atomic.async_atomic", atomic=True)
        async def async_atomic() -> None: ...


def test_using_atomic_true_on_an_async_task_is_refused():
    from tests.tasks import async_double

    with pytest.raises(InvalidTaskError, match="is an async def"):
        async_double.using(atomic=True)


def test_atomic_must_be_a_bool():
    with pytest.raises(InvalidTaskError, match="atomic must be True or False"):
        plain_effect.using(atomic="yes")


# -- idempotency key --------------------------------------------------------------------


@BOTH
def test_the_idempotency_key_is_stable_across_attempts_and_differs_between_tasks(mode):
    first = idempotency_key.enqueue()
    second = idempotency_key.enqueue()

    run_tasks()

    keys = {t: effects(t) for t in (first, second)}
    assert len(keys[first]) == 2 and len(set(keys[first])) == 1
    assert len(keys[second]) == 2 and len(set(keys[second])) == 1
    assert keys[first][0] != keys[second][0]
    assert Task.objects.get(pk=first).result == keys[first][0]


# -- the Tasks framework backend --------------------------------------------------------


@pytest.mark.django_db
def test_the_backends_atomic_option_is_frozen_on_the_rows_it_enqueues():
    from django_pgqueue.backends import PgQueueBackend
    from tests import framework_tasks

    backend = PgQueueBackend("atomic", {"QUEUES": ["default"], "OPTIONS": {"atomic": True}})

    result = backend.enqueue(framework_tasks.add, (1, 2), {})

    assert Task.objects.get(pk=int(result.id)).retry_policy["atomic"] is True


@pytest.mark.django_db
def test_the_backends_atomic_option_refuses_an_async_task_and_writes_nothing():
    from django_pgqueue.backends import PgQueueBackend
    from tests import framework_tasks

    backend = PgQueueBackend("atomic", {"QUEUES": ["default"], "OPTIONS": {"atomic": True}})

    with pytest.raises(InvalidTaskError, match="atomic=True, which needs a plain def task"):
        backend.enqueue(framework_tasks.async_double, (1,), {})
    assert not Task.objects.exists()


# -- several databases ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True, databases=["default", "queue2"])
def test_an_atomic_handler_that_writes_through_another_alias_is_refused_and_writes_nothing():
    task_id = atomic_elsewhere.using(max_attempts=1).enqueue("queue2")

    result = run_tasks()

    assert result.counts == {"failure": 1}
    error = Task.objects.get(pk=task_id).errors[-1]
    assert error["type"] == "django_pgqueue.exceptions.AtomicWriteRefused"
    assert "writes through 'queue2'" in error["message"]
    assert not Effect.objects.using("queue2").exists()


@pytest.mark.django_db(transaction=True, databases=["default", "queue2"])
def test_an_atomic_handler_cannot_enqueue_into_a_queue_on_another_database(settings):
    from tests.settings import TEST_DATABASES

    settings.PGQUEUE = {**settings.PGQUEUE, "DATABASES": TEST_DATABASES}
    task_id = atomic_enqueues_into.using(max_attempts=1).enqueue("q2")

    result = run_tasks(queues=["default"])

    assert result.counts == {"failure": 1}
    error = Task.objects.get(pk=task_id).errors[-1]
    assert error["type"] == "django_pgqueue.exceptions.TransactionDatabaseError"
    assert not Task.objects.using("queue2").exists()
    assert effects(task_id) == []


@pytest.mark.django_db(transaction=True, databases=["default", "queue2"])
def test_an_atomic_handler_may_read_through_another_alias():
    task_id = atomic_reads_elsewhere.enqueue("queue2")

    run_tasks()

    assert Task.objects.get(pk=task_id).state == "succeeded"
    assert effects(task_id) == ["read elsewhere"]


# -- with workers: leases, locks, execution modes ---------------------------------------

# Neither the heartbeat nor the sweep comes round during these tests: the test moves
# the lease itself.
QUIET = ("--lease", "60", "--heartbeat", "20", "--sweep-interval", "60")
MODES = pytest.mark.parametrize("execution", ["thread", "process"])


def started_waiting(path) -> None:
    wait_until(lambda: Path(f"{path}.waiting").exists(), 30, message="the handler to wait")


def recover_lease_now(task_id: int) -> None:
    """What the sweep does to a lapsed lease, at once: expire it, then recover it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_task SET lease_expires_at = now() - interval '1 second' "
            "WHERE id = %s",
            [task_id],
        )
        cursor.execute(QUERIES["recover_expired_leases"], {"limit": 100})


def expire_lease_now(task_id: int) -> None:
    """A lease that lapsed, as if its worker had stalled, and that nobody recovered."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_task SET lease_expires_at = now() - interval '1 second' "
            "WHERE id = %s",
            [task_id],
        )


@pytest.mark.django_db(transaction=True)
@MODES
@pytest.mark.parametrize(("handler", "kept"), [(atomic_effect, 0), (plain_effect, 1)],
                         ids=["atomic", "plain"])
@pytest.mark.slow
def test_a_commit_after_the_sweep_recovered_the_lease_rolls_the_writes_back(
    start_worker, tmp_path, execution, handler, kept
):
    # Given a worker running a task (one attempt) that has written, and now waits
    worker = start_worker(*QUIET, "--execution", execution)
    gate = tmp_path / "gate"
    task_id = handler.using(max_attempts=1).enqueue(1, wait_for=str(gate))
    started_waiting(gate)

    # When the sweep recovers its lease (it ends failed: its one attempt is spent),
    # and then the handler returns
    recover_lease_now(task_id)
    gate.touch()

    # Then an atomic task's write is rolled back with its refused commit; a plain one's
    # stays
    wait_until(lambda: "lease" in worker.log() and "not written" in worker.log(), 30,
               message="the refused outcome")
    assert Task.objects.get(pk=task_id).state == "failed"
    assert len(effects(task_id)) == kept
    if kept == 0:
        assert "before its atomic transaction could commit" in worker.log()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@MODES
def test_an_atomic_attempt_whose_lease_lapsed_does_not_commit_and_runs_again(
    start_worker, tmp_path, execution
):
    # Given a worker running an atomic task that has written, and now waits
    worker = start_worker(*QUIET, "--execution", execution)
    gate = tmp_path / "gate"
    task_id = atomic_effect.enqueue(1, wait_for=str(gate))
    started_waiting(gate)

    # When its lease lapses (its worker stalled, say) and nobody recovers it, and then
    # the handler returns
    expire_lease_now(task_id)
    gate.touch()

    # Then the late commit is refused and rolled back, and the task runs again: one
    # effect, the second attempt's
    wait_until(lambda: Task.objects.get(pk=task_id).state == "succeeded", 30,
               message="the second attempt")
    row = Task.objects.get(pk=task_id)
    assert list(Effect.objects.filter(task_id=task_id).values_list("attempt", flat=True)) == [2]
    assert [e["outcome"] for e in row.executions] == ["lost", "success"]
    assert "before its atomic transaction could commit" in worker.log()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@MODES
def test_an_atomic_handler_leaves_its_row_unlocked_and_its_lease_renewed(
    start_worker, tmp_path, execution
):
    # Given a worker with a 2 s lease running an atomic task that has written and
    # reported progress, and now waits
    start_worker("--lease", "2", "--heartbeat", "0.5", "--execution", execution)
    gate = tmp_path / "gate"
    task_id = atomic_effect.enqueue(1, wait_for=str(gate), progress=True)
    started_waiting(gate)
    claimed = Task.objects.get(pk=task_id).lease_expires_at

    # Then another transaction can lock its row at once, its lease is renewed, and the
    # progress is not there yet (it commits with the attempt)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM pgqueue_task WHERE id = %s FOR NO KEY UPDATE NOWAIT", [task_id]
        )
    wait_until(lambda: Task.objects.get(pk=task_id).lease_expires_at > claimed, 10,
               message="the lease to be renewed")
    assert Task.objects.get(pk=task_id).progress is None

    # When the handler returns, its write and its progress commit with its success
    gate.touch()
    wait_until(lambda: Task.objects.get(pk=task_id).state == "succeeded", 30,
               message="the task to succeed")
    assert Task.objects.get(pk=task_id).progress == {"n": 1, "done": 1}
    assert effects(task_id) == ["n=1"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@MODES
def test_a_worker_commits_atomic_successes_and_rolls_back_failures(start_worker, execution):
    start_worker("--execution", execution)
    good = [atomic_effect.enqueue(n) for n in range(5)]
    bad = [atomic_effect.using(max_attempts=1).enqueue(n, fail="raise") for n in range(3)]

    wait_until(lambda: not Task.objects.filter(state__in=["pending", "running"]).exists(),
               30, message="the tasks to end")

    assert {t.state for t in Task.objects.filter(pk__in=good)} == {"succeeded"}
    assert {t.state for t in Task.objects.filter(pk__in=bad)} == {"failed"}
    assert sorted(Effect.objects.values_list("task_id", flat=True)) == good


@BOTH
def test_an_atomic_suspension_commits_with_the_child_it_waits_for(mode):
    task_id = atomic_waits_for_child.enqueue(1)

    result = run_tasks()

    assert [run.outcome for run in result.runs] == ["suspended", "success", "success"]
    assert Task.objects.get(pk=task_id).result == "child succeeded"
    assert effects(task_id) == ["before waiting 1"]
    assert Effect.objects.filter(label="child 1").count() == 1


@pytest.mark.django_db(transaction=True)
def test_settle_atomic_writes_a_success_as_settle_does(pg):
    from tests.sqlhelpers import claim, settle, success

    # Given two claimed tasks
    plain_id, atomic_id = plain_effect.enqueue_many([(1,), (2,)])
    claimed = {t.id: t for t in claim(pg, limit=2)}

    # When one succeeds through settle (the settler), the other through settle_atomic
    assert settle(pg, [success(claimed[plain_id], result={"n": 1})]) == {
        plain_id: "succeeded"
    }
    mine = claimed[atomic_id]
    written = pg.execute(QUERIES["settle_atomic"], {
        "id": mine.id, "attempt": mine.attempt, "token": mine.lease_token,
        "any_expiry": False, "result": '{"n": 1}', "save_checkpoint": False,
        "checkpoint": None, "save_progress": False, "progress": None,
        "limit_queue": None, "limit_concurrency": None,
    }).fetchall()  # fmt: skip

    # Then both rows read the same, but for their ids, tokens and times
    assert len(written) == 1
    rows = {}
    for row in Task.objects.filter(pk__in=[plain_id, atomic_id]):
        fields = {f.attname: getattr(row, f.attname) for f in Task._meta.concrete_fields}
        for own in ("id", "args", "enqueued_at", "run_at", "started_at", "last_attempted_at",
                    "finished_at"):  # fmt: skip
            assert fields.pop(own) is not None
        (entry,) = fields.pop("executions")
        for own in ("started", "ended", "token", "worker"):
            assert entry.pop(own) is not None
        rows[row.id] = (fields, entry)
    assert rows[plain_id] == rows[atomic_id]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("limit", "notified"), [(None, False), (2, False), (1, True)])
def test_settle_atomic_wakes_workers_when_its_queue_was_at_its_limit(pg, limit, notified):
    from tests.sqlhelpers import claim

    # Given a claimed task (one running row in its queue)
    plain_effect.enqueue(1)
    (mine,) = claim(pg, limit=1)
    pg.execute(f"LISTEN pgqueue_{_channel('default')}")

    # When its atomic success is written, the queue's limit being ``limit``
    (row,) = pg.execute(QUERIES["settle_atomic"], {
        "id": mine.id, "attempt": mine.attempt, "token": mine.lease_token,
        "any_expiry": False, "result": None, "save_checkpoint": False, "checkpoint": None,
        "save_progress": False, "progress": None,
        "limit_queue": None if limit is None else "default", "limit_concurrency": limit,
    }).fetchall()  # fmt: skip

    # Then it notifies only when the queue was at its limit
    assert (row[0] is not None) == notified
    assert bool(list(pg.notifies(timeout=0.2, stop_after=1))) == notified


def _channel(queue: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT hashtext(%s) & 63", [queue])
        return cursor.fetchone()[0]
