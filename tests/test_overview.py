"""The queue overview's numbers: counts per state, routability, windows, history."""

from datetime import timedelta

import pytest
from django.utils import timezone

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Worker
from django_pgqueue.ops.operations import queue_capacity, queue_history, queue_overview
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


def ago(**kwargs) -> timezone.datetime:
    return timezone.now() - timedelta(**kwargs)


def due(**kwargs):
    """A pending task due a little while ago (the test transaction's now() is its start:
    a run_at of "now" by the Python clock would be in its future)."""
    return TaskFactory(**{"run_at": ago(seconds=5), **kwargs})


def live_worker(queues=("default",), routes=(("tests.tasks.noop", 1),), **kwargs) -> Worker:
    defaults = {"id": "w-live", "hostname": "host", "pid": 1, "concurrency": 4}
    return Worker.objects.create(
        **{**defaults, **kwargs}, queues=list(queues), routes=[list(r) for r in routes]
    )


def overview_row(
    queue: str = "default", task_name: str = "tests.tasks.noop", version: int = 1
) -> dict:
    rows = {(r["queue"], r["task_name"], r["handler_version"]): r for r in queue_overview()}
    return rows[(queue, task_name, version)]


def test_the_overview_counts_each_state_per_queue_and_task():
    live_worker()
    for _ in range(3):
        due()
    TaskFactory.create_batch(2, run_at=timezone.now() + timedelta(hours=1))
    TaskFactory(state="running", attempt=1, lease_expires_at=timezone.now())
    TaskFactory(state="waiting")
    TaskFactory.create_batch(4, state="failed", finished_at=ago(days=2))
    due(queue="emails")
    due(task_name="tests.tasks.record")

    row = overview_row()

    assert row["pending_routable"] == 3
    assert row["pending_unroutable"] == 0
    assert row["scheduled"] == 2
    assert row["running"] == 1
    assert row["waiting"] == 1
    assert row["failed"] == 4
    assert overview_row("emails")["pending_unroutable"] == 1
    assert overview_row(task_name="tests.tasks.record")["pending_unroutable"] == 1


def test_due_tasks_are_routable_only_for_a_live_worker_with_their_name_version_and_queue():
    live_worker(queues=["default"], routes=[("tests.tasks.noop", 1)])
    Worker.objects.create(
        id="w-stale",
        hostname="gone",
        pid=2,
        concurrency=4,
        queues=["default"],
        routes=[["tests.tasks.record", 1]],
    )
    Worker.objects.filter(id="w-stale").update(last_heartbeat_at=ago(hours=1))
    due()  # served
    due(handler_version=2)  # a version nobody registered
    due(queue="emails")  # a queue nobody serves
    due(task_name="tests.tasks.record")  # only a stale worker knew it

    rows = {(r["queue"], r["task_name"], r["handler_version"]): r for r in queue_overview()}

    assert rows[("default", "tests.tasks.noop", 1)]["pending_routable"] == 1
    assert rows[("default", "tests.tasks.noop", 2)]["pending_unroutable"] == 1
    assert rows[("emails", "tests.tasks.noop", 1)]["pending_unroutable"] == 1
    assert rows[("default", "tests.tasks.record", 1)]["pending_unroutable"] == 1


def test_completed_and_failed_count_what_finished_in_the_last_5_minutes_and_hour():
    TaskFactory(state="succeeded", finished_at=ago(minutes=1))
    TaskFactory(state="succeeded", finished_at=ago(minutes=30))
    TaskFactory(state="succeeded", finished_at=ago(hours=3))
    TaskFactory(state="failed", finished_at=ago(minutes=2))
    TaskFactory(state="failed", finished_at=ago(minutes=50))
    TaskFactory(state="failed", finished_at=ago(days=1))
    TaskFactory(state="cancelled", finished_at=ago(minutes=1))

    row = overview_row()

    assert (row["completed_5m"], row["completed_1h"]) == (1, 2)
    assert (row["failed_5m"], row["failed_1h"]) == (1, 2)
    assert row["failed"] == 3


def test_oldest_due_is_the_wait_of_the_oldest_due_pending_task():
    TaskFactory(run_at=ago(minutes=10))
    TaskFactory(run_at=ago(minutes=1))
    TaskFactory(run_at=timezone.now() + timedelta(minutes=30))  # scheduled: not due

    seconds = overview_row()["oldest_due_seconds"]

    assert 600 <= seconds < 660


def test_a_task_name_with_nothing_due_has_no_oldest_due_age():
    TaskFactory(state="succeeded", finished_at=ago(minutes=1))

    assert overview_row()["oldest_due_seconds"] is None


def test_history_counts_completions_per_minute_over_the_window():
    TaskFactory(state="succeeded", finished_at=ago(minutes=3), last_attempted_at=ago(minutes=3))
    TaskFactory(state="succeeded", finished_at=ago(minutes=3), last_attempted_at=ago(minutes=3))
    TaskFactory(state="failed", finished_at=ago(minutes=10), last_attempted_at=ago(minutes=10))
    TaskFactory(state="succeeded", finished_at=ago(hours=2))  # outside the window

    history = queue_history(60)

    assert len(history) == 60
    assert sum(m["completed"] for m in history) == 2
    assert sum(m["failed"] for m in history) == 1
    assert max(m["completed"] for m in history) == 2


def test_history_depth_rebuilds_how_many_tasks_were_due_and_not_started():
    # Due 20 minutes ago, claimed 10 minutes ago, done since: in the queue for 10 minutes.
    TaskFactory(
        state="succeeded",
        run_at=ago(minutes=20),
        last_attempted_at=ago(minutes=10),
        finished_at=ago(minutes=9),
    )
    # Due 5 minutes ago and still pending: in the queue from then on.
    TaskFactory(run_at=ago(minutes=5))
    TaskFactory(run_at=timezone.now() + timedelta(minutes=5))  # not due yet: not counted

    depth = [m["depth"] for m in queue_history(60)]

    assert depth[-1] == 1
    assert depth[-8] == 0  # 7 minutes ago: the first was claimed, the second not yet due
    assert depth[-15] == 1  # 14 minutes ago: only the first
    assert depth[-30] == 0  # 29 minutes ago: neither was due


def test_history_depth_does_not_count_a_task_claimed_before_the_window():
    # Claimed 90 minutes ago, ran for an hour: finished inside the window, but it left
    # the queue before the window opened.
    TaskFactory(
        state="succeeded",
        run_at=ago(minutes=95),
        last_attempted_at=ago(minutes=90),
        finished_at=ago(minutes=30),
    )

    history = queue_history(60)

    assert [m["depth"] for m in history] == [0] * 60
    assert sum(m["completed"] for m in history) == 1


def test_capacity_counts_live_workers_and_slots_per_queue():
    live_worker(id="a", queues=["default", "emails"], concurrency=4, in_flight=3)
    live_worker(id="b", queues=["default"], concurrency=8)
    live_worker(id="c", queues=["default"], concurrency=100)
    Worker.objects.filter(id="c").update(last_heartbeat_at=ago(hours=1))

    capacity = {r["queue"]: r for r in queue_capacity()}

    assert capacity["default"] == {"queue": "default", "workers": 2, "slots": 12, "in_flight": 3}
    assert capacity["emails"]["slots"] == 4


@pytest.fixture
def big_history():
    """200k finished rows (most of the table is history; 1% dead letters) and a 5k
    live backlog."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO pgqueue_task (queue, task_name, state, finished_at, run_at,
                                      last_attempted_at, attempt)
            SELECT (ARRAY['default', 'emails'])[1 + n % 2], 'tests.tasks.noop',
                   CASE WHEN n % 100 = 0 THEN 'failed'
                        WHEN n % 100 = 1 THEN 'cancelled'
                        ELSE 'succeeded' END,
                   now() - make_interval(secs => n * 0.4), now() - make_interval(secs => n * 0.4),
                   now() - make_interval(secs => n * 0.4), 1
              FROM generate_series(1, 200000) AS n
        """)
        cursor.execute("""
            INSERT INTO pgqueue_task (queue, task_name, run_at)
            SELECT 'default', 'tests.tasks.noop', now() - make_interval(secs => n)
              FROM generate_series(1, 5000) AS n
        """)
        cursor.execute("ANALYZE pgqueue_task")
    return connection


def plan(connection, name: str, params: dict) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + QUERIES[name], params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.slow
def test_the_overview_reads_each_state_through_an_index_not_the_whole_table(big_history):
    text = plan(big_history, "queue_overview", {"stale_seconds": 60})

    assert "Seq Scan on pgqueue_task" not in text, text
    for index in ("pgqueue_task_retention", "pgqueue_task_waiting"):
        assert index in text, text
    # Running rows: either partial index on state = 'running' will do.
    assert "pgqueue_task_lease" in text or "pgqueue_task_running" in text, text


@pytest.mark.slow
def test_the_history_reads_only_the_backlog_and_the_last_hour(big_history):
    text = plan(big_history, "queue_history", {"minutes": 60})

    assert "Seq Scan on pgqueue_task" not in text, text
    assert "pgqueue_task_retention" in text, text
