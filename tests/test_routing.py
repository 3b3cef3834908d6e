"""What a claim takes, and in which order: routes, versions, priority across queues,
and a starvation escape that stays bounded under a sustained backlog."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from django_pgqueue.core.exceptions import TaskNotRegistered
from django_pgqueue.models import Task
from django_pgqueue.tasking.registry import registry
from tests import tasks
from tests.factories import TaskFactory
from tests.sqlhelpers import claim
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_process_runs_two_versions_of_a_task_each_by_its_own_handler(start_worker):
    old = tasks.versioned_v1.enqueue()
    new = tasks.versioned.enqueue()

    worker = start_worker("--burst", "--log-level", "DEBUG", wait=False)
    assert worker.wait(60) == 0, worker.log()

    rows = {t.pk: (t.handler_version, t.state, t.result) for t in Task.objects.all()}
    assert rows == {old: (1, "succeeded", "v1"), new: (2, "succeeded", "v2")}
    assert "tests.versioned@1,tests.versioned@2" in worker.log()  # the routes, at DEBUG


def test_the_registry_returns_the_asked_version_or_the_newest():
    assert registry.get("tests.versioned").func is tasks.versioned.func
    assert registry.get("tests.versioned", 1).func is tasks.versioned_v1.func
    with pytest.raises(TaskNotRegistered, match="registered versions: 1, 2"):
        registry.get("tests.versioned", 7)


def test_a_claim_across_queues_takes_the_highest_priority_first(pg):
    low = TaskFactory(queue="default", priority=-5)
    high = TaskFactory(queue="other", task_name="tests.tasks.other_queue", priority=50)
    mid = TaskFactory(queue="default", priority=10)

    order = [t.id for _ in range(4) for t in claim(pg, limit=1, queue=["default", "other"])]

    assert order == [high.id, mid.id, low.id]


def test_a_claim_takes_no_task_of_a_queue_it_does_not_serve(pg):
    TaskFactory(queue="other", task_name="tests.tasks.other_queue", priority=100)
    mine = TaskFactory(queue="default")

    assert [t.id for t in claim(pg, limit=5, queue=["default"])] == [mine.id]


def test_the_starvation_escape_takes_one_task_per_window_fleet_wide(pg):
    old = timezone.now() - timedelta(minutes=10)
    starving = [TaskFactory(priority=-100, run_at=old) for _ in range(3)]
    urgent = [TaskFactory(priority=100) for _ in range(20)]

    first = {t.id for t in claim(pg, limit=4, starvation=60, worker_id="w-a")}
    second = {t.id for t in claim(pg, limit=4, starvation=60, worker_id="w-b")}

    # One escape in the window: the first claim (of any worker) takes the oldest, the
    # next claims follow priority.
    assert starving[0].id in first
    assert not second & {s.id for s in starving}
    assert len((first | second) & {u.id for u in urgent}) == 7


@pytest.mark.slow  # a share of claims per second, which other tests' load skews
def test_priority_holds_under_a_sustained_backlog_of_old_low_priority_work(start_worker):
    # given: a backlog of low-priority tasks that becomes starving at once, under more
    # high-priority work than the worker can do
    started = timezone.now()
    low = tasks.sleep_and_record.using(priority=-50).enqueue_many(
        [(0.01, "low")] * 200
    )
    tasks.sleep_and_record.using(priority=50).enqueue_many([(0.01, "high")] * 3000)
    starvation = 2.0

    # when: one worker runs for a while
    worker = start_worker("--concurrency", "4", "--starvation-timeout", str(starvation))
    time.sleep(starvation + 4)
    worker.stop()

    # then: high-priority work takes nearly every start, and the oldest low-priority
    # task still started within the starvation timeout plus one window (+ slack)
    labels = list(Run.objects.values_list("label", flat=True))
    assert len(labels) > 100
    assert labels.count("high") / len(labels) >= 0.9, (labels.count("low"), len(labels))
    oldest = Run.objects.filter(task_id=low[0]).first()
    assert oldest is not None, "the oldest low-priority task never started"
    window = starvation / 10
    assert (oldest.started_at - started).total_seconds() <= starvation + window + 1.5
