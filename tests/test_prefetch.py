"""Prefetch: a worker holds a few claimed tasks ready beyond its busy slots, so that it
claims in bigger batches (fewer durable commits per task). Their leases are renewed like
any other, and their timeouts count from their start, not from their claim."""

import re
import signal

import pytest

from django_pgqueue.models import Task
from tests import tasks
from tests.conftest import wait_until
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def running(ids: list[int]) -> int:
    return Task.objects.filter(pk__in=ids, state="running").count()


def succeeded(ids: list[int]) -> int:
    return Task.objects.filter(pk__in=ids, state="succeeded").count()


def stopped(worker):
    """SIGTERM: the worker stops claiming at once, lets its handlers finish, and exits."""
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.log()
    return worker


def stats(worker) -> dict[str, int]:
    """What a stopped worker says it claimed, in the line it logs on its way out
    ("worker ID stopped: 5 task(s) claimed; ..." or "... stopped: no task claimed")."""
    line = worker.log().rsplit(" stopped: ", 1)[1].splitlines()[0]
    claimed = re.match(r"(\d+) task\(s\) claimed", line)
    return {"claimed": int(claimed.group(1)) if claimed else 0}


@pytest.mark.slow
def test_a_worker_holds_its_prefetch_claimed_beyond_its_busy_slots(start_worker):
    ids = tasks.sleep_and_record.enqueue_many([(2.0,)] * 10)

    worker = start_worker("--concurrency", "2", "--prefetch", "3")
    # only the slots run handlers
    wait_until(lambda: running(ids) == 5 and Run.objects.count() == 2)

    # and the worker, stopped now (claims stop at once), claimed those five only
    assert stats(stopped(worker))["claimed"] == 5


@pytest.mark.slow
def test_without_prefetch_a_worker_claims_only_what_its_slots_can_run(start_worker):
    ids = tasks.sleep_and_record.enqueue_many([(2.0,)] * 10)

    worker = start_worker("--concurrency", "2", "--prefetch", "0")
    wait_until(lambda: running(ids) == 2 and Run.objects.count() == 2)

    assert stats(stopped(worker))["claimed"] == 2


@pytest.mark.slow
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


@pytest.mark.slow
def test_by_default_a_worker_stops_prefetching_once_its_tasks_prove_long(start_worker):
    # Tasks of 1 s on 2 slots: once one has run, holding more would make them wait for
    # this worker's slots while another worker might be idle (the adaptive default).
    ids = tasks.sleep_and_record.enqueue_many([(1.0,)] * 12)
    start_worker("--concurrency", "2")
    wait_until(lambda: succeeded(ids) >= 3)

    def holds_only_its_slots() -> bool:
        assert running(ids) <= 2  # at every look, until three more have run
        return succeeded(ids) >= 6

    wait_until(holds_only_its_slots, timeout=30)
