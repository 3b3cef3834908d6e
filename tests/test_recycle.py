"""Recycling: a process past its task or memory limit makes way for a new one, between
tasks, losing nothing (worker/recycle.py).

Real worker subprocesses run ``tests.recycle_tasks.leak``, a handler that keeps memory
for the rest of its process's life and returns its pid and resident memory: which
process ran each task, and how big it was then, are read back from the results.
"""

from __future__ import annotations

import itertools

import pytest
from django.core.management import CommandError, call_command

from django_pgqueue.models import Task
from tests import recycle_tasks
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = ("--queues", "recycle")


def results(ids: list[int], timeout: float = 60) -> list[dict]:
    """The results of these tasks in id order, once every one has succeeded."""
    wait_until(
        lambda: Task.objects.filter(pk__in=ids, state="succeeded").count() == len(ids),
        timeout,
        message=f"{len(ids)} tasks to succeed",
    )
    rows = Task.objects.filter(pk__in=ids).order_by("id")
    return [row.result for row in rows]


def runs_per_process(found: list[dict]) -> list[int]:
    """How many consecutive tasks each process ran, in order."""
    counts: list[int] = []
    previous = None
    for result in found:
        if result["pid"] != previous:
            counts.append(0)
            previous = result["pid"]
        counts[-1] += 1
    return counts


def claimed_rows_all_succeeded() -> bool:
    """Nothing a recycling worker claimed was released or left running."""
    return not Task.objects.filter(attempt__gt=0).exclude(state="succeeded").exists()


# -- process execution: the handler processes ------------------------------------------


@pytest.mark.slow
def test_a_handler_process_makes_way_for_a_new_one_after_max_tasks_per_child(start_worker):
    """--max-tasks-per-child 2: every handler process runs two tasks, then the slot's
    new process runs the next two; no task fails or runs twice for it."""
    worker = start_worker(
        *QUEUE, "--execution", "process", "--concurrency", "1", "--max-tasks-per-child", "2"
    )
    ids = recycle_tasks.leak.enqueue_many([() for _ in range(5)])

    found = results(ids)

    assert runs_per_process(found) == [2, 2, 1]
    assert Task.objects.filter(pk__in=ids, attempt=1).count() == 5
    assert worker.proc.poll() is None
    assert worker.log().count("is recycled: it has run 2 tasks") == 2


@pytest.mark.slow
def test_a_handler_process_above_max_memory_per_child_makes_way_after_its_task(
    start_worker,
):
    """--max-memory-per-child: the process whose resident memory passed the limit with
    a task's leak ran no further task; those below it ran the next one."""
    limit = 300_000  # KiB: a fresh handler process is well under it, three leaks over it
    worker = start_worker(
        *QUEUE,
        "--execution", "process",
        "--concurrency", "1",
        "--max-memory-per-child", str(limit),
    )  # fmt: skip
    ids = recycle_tasks.leak.enqueue_many([(120,) for _ in range(6)])

    found = results(ids)

    for this, following in itertools.pairwise(found):
        assert (following["pid"] != this["pid"]) == (this["rss"] > limit), found
    assert len(runs_per_process(found)) >= 2
    assert worker.proc.poll() is None


@pytest.mark.slow  # four handler processes started one after the other
def test_a_task_does_not_pay_for_its_new_handler_process_setting_django_up(start_worker):
    """With a new process after every task, each task waits for its process to set
    Django up (about a second) before its timeout of 0.5 s starts counting."""
    start_worker(
        *QUEUE, "--execution", "process", "--concurrency", "1", "--max-tasks-per-child", "1"
    )
    ids = recycle_tasks.leak.using(timeout=0.5).enqueue_many([(0, 0.1) for _ in range(3)])

    found = results(ids)

    assert runs_per_process(found) == [1, 1, 1]


# -- thread execution: the worker process ------------------------------------------------


@pytest.mark.slow
def test_a_worker_past_max_tasks_runs_what_it_claimed_and_exits_0(start_worker):
    """--max-tasks 3: the worker stops claiming, finishes every task it claimed (none is
    released) and exits with status 0; the rest wait, unclaimed, for another worker."""
    worker = start_worker(
        *QUEUE, "--concurrency", "2", "--prefetch", "0", "--max-tasks", "3"
    )
    ids = recycle_tasks.leak.enqueue_many([(0, 0.2) for _ in range(30)])

    assert worker.wait(60) == 0

    ran = Task.objects.filter(pk__in=ids, state="succeeded").count()
    assert 3 <= ran < 30
    assert Task.objects.filter(pk__in=ids, state="pending", attempt=0).count() == 30 - ran
    assert claimed_rows_all_succeeded()
    assert "recycling: it has run" in worker.log()
    assert "releasing its lease" not in worker.log()


@pytest.mark.slow
def test_a_worker_above_max_memory_exits_0_after_its_running_tasks(start_worker):
    """--max-memory: a thread worker whose handlers leaked past the limit finishes what
    it holds and exits with status 0."""
    worker = start_worker(
        *QUEUE, "--concurrency", "1", "--prefetch", "0", "--max-memory", "400000"
    )
    ids = recycle_tasks.leak.enqueue_many([(150,) for _ in range(10)])

    assert worker.wait(60) == 0

    done = [t.result for t in Task.objects.filter(pk__in=ids, state="succeeded").order_by("id")]
    assert 1 <= len(done) < 10
    assert done[-1]["rss"] > 400_000
    assert claimed_rows_all_succeeded()
    assert "its resident memory is" in worker.log()


@pytest.mark.slow  # five or more worker processes started one after the other
def test_the_supervisor_replaces_a_worker_process_that_recycled(start_worker):
    """--processes 2 --max-tasks 2: each worker process exits after its tasks and the
    supervisor starts another in its place, until every task has run."""
    supervisor = start_worker(
        *QUEUE, "--processes", "2", "--concurrency", "1", "--prefetch", "0", "--max-tasks", "2",
        wait=False,
    )  # fmt: skip
    ids = recycle_tasks.leak.enqueue_many([(0, 0.1) for _ in range(10)])

    found = results(ids, timeout=120)

    assert len({r["pid"] for r in found}) >= 3
    assert claimed_rows_all_succeeded()
    assert supervisor.proc.poll() is None


def test_per_child_limits_are_refused_in_thread_execution():
    with pytest.raises(CommandError, match=r"--max-tasks-per-child .* --max-tasks and"):
        call_command("runtaskworker", "--queues", "recycle", "--max-tasks-per-child", "5")
    with pytest.raises(CommandError, match="--max-memory-per-child"):
        call_command("runtaskworker", "--queues", "recycle", "--max-memory-per-child", "5000")
