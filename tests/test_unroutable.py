"""Unroutable tasks: only the live workers of a task's own queue can dead-letter it.

The sweep fails a task due for longer than UNROUTABLE_TTL as unroutable when its queue
is served by live workers and none of them has registered its (task_name,
handler_version). A queue nobody serves (a nightly pool, a burst pool, a pool down for
the weekend) is unknown work and is left alone, however old its backlog.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import timedelta

import pytest
from django.utils import timezone

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Task
from django_pgqueue.worker.stats import WorkerStats
from django_pgqueue.worker.sweeper import Sweeper
from tests.factories import TaskFactory
from tests.sqlhelpers import row

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 3600.0
STALE = 60.0
NOOP = ("tests.tasks.noop", 1)


def add_worker(pg, worker_id: str, queues: Sequence[str], routes: Sequence[tuple[str, int]],
               heartbeat_ago: float = 0.0) -> None:
    """A worker row as register_worker writes it, last heard from ``heartbeat_ago`` s ago."""
    pg.execute(
        "INSERT INTO pgqueue_worker"
        " (id, hostname, pid, queues, routes, concurrency, last_heartbeat_at)"
        " VALUES (%s, 'host', 1, %s, %s, 4, now() - make_interval(secs => %s))",
        [worker_id, json.dumps(list(queues)), json.dumps([list(r) for r in routes]),
         heartbeat_ago],
    )


def overdue(**kwargs) -> Task:
    """A pending task that has been due for longer than the TTL."""
    return TaskFactory(run_at=timezone.now() - timedelta(seconds=TTL + 60), **kwargs)


def sweep_unroutable() -> int:
    sweeper = Sweeper("default", 1, STALE, TTL, WorkerStats())
    try:
        return sweeper.fail_unroutable()
    finally:
        sweeper.session.close()


def last_error(pg, task_id: int) -> dict:
    return row(pg, task_id)["errors"][-1]


def test_a_backlog_of_a_queue_no_live_worker_serves_stays_pending_however_old(pg):
    # given: the nightly pool is down; a live worker of another queue runs the same task
    add_worker(pg, "w-default", ["default"], [NOOP, ("reports.nightly", 1)])
    backlog = [
        TaskFactory(queue="nightly", task_name=name,
                    run_at=timezone.now() - timedelta(days=days))
        for name, days in [("reports.nightly", 3), ("reports.rollup", 30), ("tests.tasks.noop", 1)]
    ]

    # when
    failed = sweep_unroutable()

    # then
    assert failed == 0
    for task in backlog:
        assert (row(pg, task.id)["state"], row(pg, task.id)["attempt"]) == ("pending", 0)


def test_a_queue_whose_workers_stopped_heartbeating_counts_as_unserved(pg):
    # given: the nightly pool's worker row is still there, but stale (the pool is down)
    add_worker(pg, "w-nightly", ["nightly"], [("reports.nightly", 1)],
               heartbeat_ago=STALE + 30)
    add_worker(pg, "w-default", ["default"], [NOOP])
    task = overdue(queue="nightly", task_name="reports.rollup")

    # when
    failed = sweep_unroutable()

    # then
    assert failed == 0
    assert row(pg, task.id)["state"] == "pending"


def test_a_task_its_queues_live_workers_cannot_run_is_failed_after_the_ttl(pg):
    # given: default is served by two live workers, neither has billing.charge@1
    add_worker(pg, "w-a", ["default"], [NOOP, ("tests.tasks.record", 1)])
    add_worker(pg, "w-b", ["default", "emails"], [NOOP])
    task = overdue(task_name="billing.charge")

    # when
    failed = sweep_unroutable()

    # then
    assert failed == 1
    stored = row(pg, task.id)
    assert (stored["state"], stored["attempt"]) == ("failed", 0)
    assert stored["finished_at"] is not None
    error = stored["errors"][-1]
    assert (error["type"], error["outcome"]) == ("TaskNotRegistered", "unroutable")
    assert error["message"] == (
        "no live worker serving queue 'default' has registered task 'billing.charge'"
        " version 1 for 3600 s; the queue is served by w-a, w-b, which can run"
        " tests.tasks.noop@1, tests.tasks.record@1; deploy a worker that serves the queue"
        " with this task and version, then requeue this task"
    )


def test_a_task_due_for_less_than_the_ttl_stays_pending(pg):
    # given
    add_worker(pg, "w-a", ["default"], [NOOP])
    task = TaskFactory(task_name="billing.charge",
                       run_at=timezone.now() - timedelta(seconds=TTL - 60))

    # when
    failed = sweep_unroutable()

    # then
    assert failed == 0
    assert row(pg, task.id)["state"] == "pending"


def test_a_handler_version_no_live_worker_of_the_queue_has_is_unroutable(pg):
    # given: the queue's worker runs tests.tasks.noop at version 1 only
    add_worker(pg, "w-a", ["default"], [NOOP])
    newer = overdue(task_name="tests.tasks.noop", handler_version=2)

    # when
    failed = sweep_unroutable()

    # then
    assert failed == 1
    assert row(pg, newer.id)["state"] == "failed"
    assert "task 'tests.tasks.noop' version 2" in last_error(pg, newer.id)["message"]


def test_a_live_worker_serving_the_queue_with_the_route_keeps_the_task_pending(pg):
    # given: one worker of the queue lacks the route, another has it
    add_worker(pg, "w-old", ["default"], [NOOP])
    add_worker(pg, "w-new", ["default"], [NOOP, ("billing.charge", 1)])
    task = overdue(task_name="billing.charge")

    # when
    failed = sweep_unroutable()

    # then
    assert failed == 0
    assert (row(pg, task.id)["state"], row(pg, task.id)["errors"]) == ("pending", [])


def test_a_route_registered_by_a_live_worker_of_another_queue_does_not_count(pg):
    # given: billing.charge is registered, but only by the worker of queue "billing"
    add_worker(pg, "w-default", ["default"], [NOOP])
    add_worker(pg, "w-billing", ["billing"], [("billing.charge", 1)])
    misrouted = overdue(queue="default", task_name="billing.charge")
    routed = overdue(queue="billing", task_name="billing.charge")

    # when
    failed = sweep_unroutable()

    # then
    assert failed == 1
    assert row(pg, misrouted.id)["state"] == "failed"
    assert row(pg, routed.id)["state"] == "pending"
    message = last_error(pg, misrouted.id)["message"]
    assert "served by w-default, which can run tests.tasks.noop@1;" in message
    assert "w-billing" not in message


def test_the_error_lists_a_few_workers_and_routes_and_counts_the_rest(pg):
    # given: five workers serve the queue, together with twelve routes
    routes = [(f"app.task{n:02}", 1) for n in range(12)]
    for n in range(5):
        add_worker(pg, f"w-{n}", ["default"], routes)
    task = overdue(task_name="billing.charge")

    # when
    sweep_unroutable()

    # then
    message = last_error(pg, task.id)["message"]
    listed = ", ".join(f"app.task{n:02}@1" for n in range(10))
    assert "served by w-0, w-1, w-2 and 2 more, which can run" in message
    assert f"which can run {listed} and 2 more;" in message


def test_a_queue_served_by_workers_with_no_tasks_says_they_can_run_nothing(pg):
    # given
    add_worker(pg, "w-empty", ["default"], [])
    task = overdue(task_name="billing.charge")

    # when
    sweep_unroutable()

    # then
    assert "served by w-empty, which can run nothing;" in last_error(pg, task.id)["message"]


def test_a_real_worker_fails_only_its_own_queues_unroutable_tasks(pg, start_worker):
    # given: a real worker of "default" (its registry row as the worker writes it)
    worker = start_worker("--queues", "default")
    unknown = overdue(queue="default", task_name="billing.charge")
    nightly = overdue(queue="nightly", task_name="billing.charge")

    # when
    failed = sweep_unroutable()

    # then: the error lists ten of the routes the worker registered, and counts the rest
    worker_id, routes = pg.execute("SELECT id, routes FROM pgqueue_worker").fetchone()
    worker.stop()
    assert failed == 1
    assert row(pg, nightly.id)["state"] == "pending"
    message = last_error(pg, unknown.id)["message"]
    served_by = f"the queue is served by {worker_id}, which can run "
    assert served_by in message, message
    more = f" and {len(routes) - 10} more" if len(routes) > 10 else ""
    listed = message.split(served_by, 1)[1].split(f"{more}; deploy", 1)[0].split(", ")
    assert set(listed) <= {f"{name}@{version}" for name, version in routes}
    assert len(listed) == min(len(routes), 10)


def test_the_sweep_walks_the_due_index_of_served_queues_only(pg):
    # given: a deep overdue backlog in a queue nobody serves, and a served queue
    pg.execute("""
        INSERT INTO pgqueue_task (queue, task_name, run_at)
        SELECT 'nightly', 'reports.nightly', now() - interval '2 days'
          FROM generate_series(1, 50000)
    """)
    add_worker(pg, "w-a", ["default"], [NOOP])
    overdue(task_name="billing.charge")
    pg.execute("ANALYZE pgqueue_task")

    # when
    plan = "\n".join(
        r[0] for r in pg.execute(
            "EXPLAIN " + QUERIES["fail_unroutable"],
            {"stale_seconds": STALE, "ttl_seconds": TTL, "limit": 100},
        ).fetchall()
    )

    # then: the served queues' routes are listed by a loose index scan, and only the
    # overdue rows of routes nobody serves are walked, by index range; no sort node (the
    # worker's connections price one out of reach)
    assert "Seq Scan on pgqueue_task" not in plan, plan
    assert re.search(
        r"Index Only Scan using pgqueue_task_due on pgqueue_task \w+ .*\n"
        r"\s+Index Cond: \(\(queue = w(_\d+)?\.queue\) AND \(ROW\(task_name, handler_version\)",
        plan,
    ), plan
    assert re.search(
        r"Index Scan using pgqueue_task_due on pgqueue_task \w+ .*\n"
        r"\s+Index Cond: \(\(\(queue\)::text = rs\.queue\) AND .*\(run_at < ",
        plan,
    ), plan
    assert not sorts_of_task_rows(plan), plan


def sorts_of_task_rows(plan: str) -> list[str]:
    """The Sort nodes of a text plan that sort rows read from pgqueue_task. (A sort of
    the workers' few rows, for an ordered array_agg, is fine; PostgreSQL 16 shows those
    as Sort nodes.)"""
    lines = plan.splitlines()
    found = []
    for index, line in enumerate(lines):
        if "->  Sort" not in line:
            continue
        depth = len(line) - len(line.lstrip())
        for below in lines[index + 1 :]:
            if below.strip() and len(below) - len(below.lstrip()) <= depth:
                break
            if " on pgqueue_task " in below:
                found.append(line.strip())
                break
    return found
