"""Wake-ups: NOTIFY on commit only, one per queue per transaction; idle workers start
new tasks at once and scheduled ones at their run_at, not at the next poll."""

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_pgqueue.models import Task
from django_pgqueue.sql import QUERIES
from django_pgqueue.worker.connection import connect
from tests import tasks
from tests.conftest import wait_until
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

SLOW_POLL = ("--poll-interval", "30")


@pytest.fixture
def listener(db_url):
    """A connection listening like a worker of the queues "default" and "other"."""
    conn = connect("default")
    for (channel,) in conn.execute(QUERIES["listen_channels"], {"queues": ["default", "other"]}):
        conn.execute(f'LISTEN "{channel}"')
    yield conn
    conn.close()


def notifications(conn, wait: float = 0.3) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=wait)]


def test_a_committed_enqueue_notifies_its_queue_once(listener):
    with transaction.atomic():
        tasks.noop.enqueue(1)
        tasks.noop.enqueue(2)
        tasks.noop.enqueue_many(range(100))

    assert notifications(listener) == ["default"]


def test_one_notification_per_queue_per_transaction(listener):
    with transaction.atomic():
        tasks.noop.enqueue(1)
        tasks.other_queue.enqueue(1)
        tasks.noop.enqueue(2)

    assert sorted(notifications(listener)) == ["default", "other"]


def test_a_rolled_back_enqueue_wakes_nobody(listener):
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.noop.enqueue(1)
        raise RuntimeError("roll back")

    assert notifications(listener) == []
    assert Task.objects.count() == 0


def test_an_idle_worker_starts_a_new_task_without_waiting_for_the_poll(start_worker):
    start_worker(*SLOW_POLL)
    time.sleep(0.5)  # let it find nothing and park

    task_id = tasks.record.enqueue("wake")
    run = wait_until(lambda: Run.objects.filter(task_id=task_id).first(), timeout=10)

    waited = run.started_at - Task.objects.get(pk=task_id).enqueued_at
    assert waited < timedelta(seconds=5)  # the poll would take 30 s


def test_a_scheduled_task_starts_at_its_run_at_not_at_the_next_poll(start_worker):
    start_worker(*SLOW_POLL)
    run_at = timezone.now() + timedelta(seconds=1.5)

    task_id = tasks.record.using(run_at=run_at).enqueue("later")
    run = wait_until(lambda: Run.objects.filter(task_id=task_id).first(), timeout=15)

    assert run.started_at >= run_at
    assert run.started_at - run_at < timedelta(seconds=5)  # the poll would take 30 s


def test_polling_still_finds_work_when_no_notification_arrives(start_worker, pg):
    start_worker("--poll-interval", "0.3")
    # A row inserted behind the queue's back: no NOTIFY at all.
    pg.execute(
        "INSERT INTO pgqueue_task (task_name, args) VALUES ('tests.tasks.record', '[\"poll\"]')"
    )

    assert wait_until(lambda: Run.objects.filter(label="poll").exists(), timeout=10)


def test_each_queue_notifies_on_its_own_channel(pg):
    (default,) = pg.execute(QUERIES["listen_channels"], {"queues": ["default"]}).fetchone()
    pg.execute(f'LISTEN "{default}"')

    tasks.other_queue.enqueue(1)  # "other" hashes to another channel than "default"
    tasks.noop.enqueue(1)

    assert [(n.channel, n.payload) for n in pg.notifies(timeout=0.3)] == [(default, "default")]


def test_an_idle_worker_runs_no_statement_when_tasks_arrive_in_another_queue(start_worker):
    worker = start_worker("--queues", "other", *SLOW_POLL)
    time.sleep(1.0)  # it claims once, finds nothing, and parks

    for n in range(30):
        tasks.noop.enqueue(n)  # queue "default", one transaction each

    worker.stop()
    stats = dict(
        item.split("=") for item in worker.log().rsplit("stopped: ", 1)[1].split()
    )
    # Start-up only (a claim, and one more after the wake-up every new connection
    # counts as); none for the 30 enqueues into another queue.
    assert int(stats["claim_statements"]) <= 2, stats
    assert int(stats["next_due_statements"]) <= 2, stats
