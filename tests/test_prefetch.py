"""Prefetch: a worker holds a few claimed tasks ready beyond its busy slots, so that it
claims in bigger batches (fewer durable commits per task). Their leases are renewed like
any other, and their timeouts count from their start, not from their claim."""

import time

import pytest

from django_pgqueue.models import Task
from tests import tasks
from tests.conftest import wait_until
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_holds_its_prefetch_claimed_beyond_its_busy_slots(start_worker):
    ids = tasks.sleep_and_record.enqueue_many([(2.0,)] * 10)

    start_worker("--concurrency", "2", "--prefetch", "3")
    wait_until(lambda: Run.objects.count() == 2)
    time.sleep(0.3)

    assert Task.objects.filter(pk__in=ids, state="running").count() == 5
    assert Run.objects.count() == 2  # only the slots run handlers


def test_without_prefetch_a_worker_claims_only_what_its_slots_can_run(start_worker):
    ids = tasks.sleep_and_record.enqueue_many([(2.0,)] * 10)

    start_worker("--concurrency", "2", "--prefetch", "0")
    wait_until(lambda: Run.objects.count() == 2)
    time.sleep(0.3)

    assert Task.objects.filter(pk__in=ids, state="running").count() == 2


def test_a_prefetched_task_timeout_counts_from_its_start_not_its_claim(start_worker):
    # One slot: the second task is claimed with the first and waits 1.5 s for the slot;
    # its 1 s timeout starts with the handler, so it still has about 1 s left there.
    first = tasks.sleep_and_record.using(timeout=10).enqueue(1.5)
    second = tasks.time_left_at_start.using(timeout=1, max_attempts=1).enqueue()

    start_worker("--concurrency", "1", "--prefetch", "1")

    wait_until(
        lambda: Task.objects.filter(pk__in=[first, second], state="succeeded").count() == 2,
        timeout=20,
    )
    assert Task.objects.get(pk=second).result > 0.8  # about -0.5 if counted from the claim


def test_by_default_a_worker_stops_prefetching_once_its_tasks_prove_long(start_worker):
    # Tasks of 1 s on 2 slots: once one has run, holding more would make them wait for
    # this worker's slots while another worker might be idle (the adaptive default).
    ids = tasks.sleep_and_record.enqueue_many([(1.0,)] * 12)
    start_worker("--concurrency", "2")

    wait_until(lambda: Task.objects.filter(pk__in=ids, state="succeeded").count() >= 3)
    time.sleep(0.2)
    assert Task.objects.filter(pk__in=ids, state="running").count() == 2
