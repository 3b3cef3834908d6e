"""Wake-ups: NOTIFY on commit only, one per queue per transaction, and from a single
enqueue only while a worker of the queue is parked; idle workers start new tasks at once
and scheduled ones at their run_at, not at the next poll, also when the enqueue's
transaction was in flight while the worker went to park."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Task
from django_pgqueue.worker.claimer import STAGE_INTERVAL
from django_pgqueue.worker.connection import connect
from tests import tasks
from tests.conftest import PARKED_MARKS, wait_until
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

# A worker that polls every 10 minutes: a task it starts within a test's wait was woken.
SLOW_POLL = ("--poll-interval", "600")
# A worker logs every counter (its statements too) at DEBUG as it stops.
COUNTERS = ("--log-level", "DEBUG")


def counters(worker) -> dict[str, str]:
    """The counters a worker started with COUNTERS logged as it stopped."""
    line = worker.log().rsplit("counters: ", 1)[1].splitlines()[0]
    return dict(item.split("=") for item in line.split())


def park_like_a_worker(conn, queues: list[str], listen: bool = True) -> list[int]:
    """LISTEN on the queues' channels and take the parked mark, as an idle claimer does;
    returns the channel numbers."""
    rows = conn.execute(QUERIES["listen_channels"], {"queues": queues}).fetchall()
    for channel, _number in rows:
        if listen:
            conn.execute(f'LISTEN "{channel}"')
    numbers = [number for _channel, number in rows]
    params = {"channels": numbers, "held": []}
    statuses = dict(conn.execute(QUERIES["park_prepare"], params).fetchall())
    assert set(statuses.values()) == {"clear"}, statuses
    return numbers


@pytest.fixture
def listener(db_url):
    """A connection listening like a parked worker of the queues "default" and "other"."""
    conn = connect("default")
    park_like_a_worker(conn, ["default", "other"])
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


def test_an_idle_worker_starts_a_new_task_without_waiting_for_the_poll(start_worker, pg):
    start_worker(*SLOW_POLL)
    wait_until(lambda: pg.execute(PARKED_MARKS).fetchone()[0] == 1, message="worker parked")

    task_id = tasks.record.enqueue("wake")

    assert wait_until(lambda: Run.objects.filter(task_id=task_id).first(), timeout=30)


@pytest.mark.slow
def test_a_scheduled_task_starts_at_its_run_at_not_at_the_next_poll(start_worker):
    start_worker(*SLOW_POLL)
    run_at = timezone.now() + timedelta(seconds=1.5)

    task_id = tasks.record.using(run_at=run_at).enqueue("later")
    run = wait_until(lambda: Run.objects.filter(task_id=task_id).first(), timeout=30)

    assert run.started_at >= run_at


def test_polling_still_finds_work_when_no_notification_arrives(start_worker, pg):
    start_worker("--poll-interval", "0.3")
    # A row inserted behind the queue's back: no NOTIFY at all.
    pg.execute(
        "INSERT INTO pgqueue_task (task_name, args) VALUES ('tests.tasks.record', '[\"poll\"]')"
    )

    assert wait_until(lambda: Run.objects.filter(label="poll").exists(), timeout=10)


def test_each_queue_notifies_on_its_own_channel(pg):
    default, _number = pg.execute(QUERIES["listen_channels"], {"queues": ["default"]}).fetchone()
    park_like_a_worker(pg, ["default"])

    tasks.other_queue.enqueue(1)  # "other" hashes to another channel than "default"
    tasks.noop.enqueue(1)

    assert [(n.channel, n.payload) for n in pg.notifies(timeout=0.3)] == [(default, "default")]


def test_an_idle_worker_runs_no_statement_when_tasks_arrive_in_another_queue(
    start_worker, pg
):
    worker = start_worker("--queues", "other", *SLOW_POLL, *COUNTERS)
    # it claims, finds nothing, takes its parked mark, claims once more, and parks
    wait_until(lambda: pg.execute(PARKED_MARKS).fetchone()[0] == 1, message="worker parked")

    for n in range(30):
        tasks.noop.enqueue(n)  # queue "default", one transaction each

    worker.stop()
    stats = counters(worker)
    # Start-up only: a claim, and one more once the parked mark is taken, each in two
    # lanes (the test tasks have sync and async handlers: thread and async slots);
    # none for the 30 enqueues into another queue.
    assert int(stats["claim_statements"]) <= 4, stats
    assert int(stats["next_due_statements"]) <= 2, stats


def test_an_enqueue_notifies_only_while_a_worker_of_its_channel_is_parked(pg):
    numbers = park_like_a_worker(pg, ["default"])
    pg.execute(QUERIES["park_release"], {"channels": numbers})  # busy: mark dropped

    tasks.noop.enqueue(1)
    assert notifications(pg) == []  # a busy worker claims again without being told

    park_like_a_worker(pg, ["default"], listen=False)
    tasks.noop.enqueue(2)
    assert notifications(pg) == ["default"]


class _OpenEnqueue:
    """An enqueue whose transaction stays open in another thread until ``commit()``."""

    def __init__(self, task, *args):
        self._commit = threading.Event()
        self._enqueued = threading.Event()
        self.committed_at = None
        self.task_id = None
        self._thread = threading.Thread(target=self._run, args=(task, args))
        self._thread.start()
        assert self._enqueued.wait(10)

    def _run(self, task, args):
        try:
            with transaction.atomic():
                self.task_id = task.enqueue(*args)
                self._enqueued.set()
                self._commit.wait(30)
            self.committed_at = timezone.now()
        finally:
            connection.close()

    def commit(self):
        self._commit.set()
        self._thread.join(10)


def test_a_claimer_cannot_park_while_an_enqueue_that_saw_no_mark_is_in_flight(pg):
    numbers = [n for _channel, n in pg.execute(QUERIES["listen_channels"], {"queues": ["default"]})]
    open_enqueue = _OpenEnqueue(tasks.noop, 1)  # no claimer parked: it does not notify

    params = {"channels": numbers, "held": []}
    assert dict(pg.execute(QUERIES["park_prepare"], params).fetchall()) == {numbers[0]: "in_flight"}
    open_enqueue.commit()
    # The mark is held now; once the enqueue committed the claimer may claim and park.
    params = {"channels": numbers, "held": numbers}
    assert dict(pg.execute(QUERIES["park_prepare"], params).fetchall()) == {numbers[0]: "clear"}
    assert pg.execute(PARKED_MARKS).fetchone()[0] == 1


@pytest.mark.slow  # a start within 2 s of the commit: not under other tests' load
def test_a_task_committed_after_the_worker_parked_without_a_notification_runs_promptly(
    start_worker, pg
):
    """The race the parked mark closes: the enqueue checks for a parked worker while the
    worker is busy (so it does not notify), the worker then runs out of work and parks,
    and only then does the enqueue commit. The worker must not sleep until its poll."""
    start_worker("--concurrency", "1", *SLOW_POLL)
    wait_until(lambda: pg.execute(PARKED_MARKS).fetchone()[0] == 1, message="worker parked")
    tasks.noop.enqueue_many(range(3000))  # claims come back full: the mark is dropped
    wait_until(lambda: pg.execute(PARKED_MARKS).fetchone()[0] == 0, message="worker busy")

    watcher = connect("default")
    listen_only(watcher, ["default"])  # sees a notification if one is sent; marks nothing
    late = _OpenEnqueue(tasks.record, "late")  # the worker is busy: no notification

    def parked_with_nothing_left():
        pending = Task.objects.filter(state="pending").exclude(pk=late.task_id).count()
        return pending == 0 and pg.execute(PARKED_MARKS).fetchone()[0] == 1

    wait_until(parked_with_nothing_left, timeout=60, message="backlog drained, worker parked")
    late.commit()
    run = wait_until(lambda: Run.objects.filter(label="late").first(), timeout=20)

    assert notifications(watcher, wait=0.1) == []  # it was woken by no notification
    watcher.close()
    assert run.started_at - late.committed_at < timedelta(seconds=2)  # the poll: 10 min


def listen_only(conn, queues: list[str]) -> None:
    for channel, _number in conn.execute(QUERIES["listen_channels"], {"queues": queues}):
        conn.execute(f'LISTEN "{channel}"')


@pytest.mark.slow
def test_a_woken_worker_with_nothing_scheduled_claims_without_staging_first(start_worker, pg):
    # Each wake-up comes more than the stager's interval after the last one: a worker
    # that knows nothing is scheduled claims at once, without a stage statement.
    worker = start_worker(*SLOW_POLL, *COUNTERS)
    wait_until(lambda: pg.execute(PARKED_MARKS).fetchone()[0] == 1, message="worker parked")
    ids = []
    for n in range(6):
        ids.append(tasks.noop.enqueue(n))
        wait_until(lambda: Task.objects.filter(pk=ids[-1], state="succeeded").exists())
        time.sleep(STAGE_INTERVAL + 0.05)  # not a wait for an outcome: the gap itself

    worker.stop()
    stats = counters(worker)
    assert int(stats["claimed"]) == 6, stats
    assert int(stats.get("stage_statements", 0)) <= 1, stats  # the first claim's only
