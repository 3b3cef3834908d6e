"""The watchdog with real worker processes: a handler that ignores its timeout is
written off, its slot replaced, and too many write-offs recycle the process.

The worker reads TIMEOUT_GRACE and WRITE_OFF_LIMIT from settings only (no flag):
tests/settings.py takes them from PGQUEUE_TEST_TIMEOUT_GRACE and
PGQUEUE_TEST_WRITE_OFF_LIMIT, which these tests set before starting a worker.
"""

import re

import pytest

from django_pgqueue.models import Task, Worker
from tests import tasks
from tests.conftest import wait_until
from tests.test_metrics import free_port, scrape
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 0.3
GRACE = 0.5
WRITE_OFF_MESSAGE = (
    f"the attempt overran its timeout of {TIMEOUT:g}s plus {GRACE:g}s grace; "
    "its slot was written off"
)


@pytest.fixture
def watchdog(monkeypatch: pytest.MonkeyPatch):
    """Set the grace and the write-off limit of the workers started afterwards."""

    def configure(write_off_limit: int) -> None:
        monkeypatch.setenv("PGQUEUE_TEST_TIMEOUT_GRACE", str(GRACE))
        monkeypatch.setenv("PGQUEUE_TEST_WRITE_OFF_LIMIT", str(write_off_limit))

    return configure


def enqueue_hung_task() -> int:
    """A sync handler that sleeps 30 s through its 0.3 s timeout, with one attempt."""
    return tasks.sleep_and_record.using(timeout=TIMEOUT, max_attempts=1).enqueue(30)


def settled(task_id: int) -> Task | None:
    return Task.objects.filter(pk=task_id, state="failed").first()


def test_a_handler_that_ignores_its_timeout_is_settled_as_a_timeout_at_timeout_plus_grace(
    start_worker, watchdog
):
    # Given a worker whose handler sleeps through its timeout
    watchdog(write_off_limit=10)
    port = free_port()
    task_id = enqueue_hung_task()
    worker = start_worker("--concurrency", "2", "--metrics-port", str(port))

    # When the timeout and the grace pass
    row = wait_until(lambda: settled(task_id), timeout=15, message="the write-off")

    # Then the attempt is settled as a timeout long before the handler returns
    assert row.attempt == 1
    assert [(e["type"], e["message"]) for e in row.errors] == [("TimeoutError", WRITE_OFF_MESSAGE)]
    took = (row.finished_at - row.last_attempted_at).total_seconds()
    assert TIMEOUT + GRACE <= took < 10
    # and the write-off is counted and logged, and the process carries on
    wait_until(
        lambda: scrape(port).get(("pgqueue_slots_written_off_total",)) == 1,
        message="the written_off counter",
    )
    assert re.search(
        rf"task {task_id} .* slot \d+ is written off \(1 of 10 allowed\)", worker.log()
    )
    assert worker.proc.poll() is None


def test_a_written_off_slot_is_replaced_so_the_worker_keeps_its_full_concurrency(
    start_worker, watchdog
):
    # Given a 2-slot worker, one of whose threads is stuck in a written-off handler
    watchdog(write_off_limit=10)
    hung = enqueue_hung_task()
    worker = start_worker("--concurrency", "2")
    wait_until(lambda: settled(hung), timeout=15, message="the write-off")

    # When two tasks of a second each are enqueued
    pair = tasks.sleep_and_record.enqueue_many([1.0, 1.0])

    # Then both run at once, in that worker, while the stuck thread still sleeps
    wait_until(
        lambda: Task.objects.filter(pk__in=pair, state="succeeded").count() == 2,
        message="both tasks to succeed",
    )
    first, second = Run.objects.filter(task_id__in=pair)
    assert first.pid == second.pid == worker.pid
    assert second.started_at < first.finished_at
    assert not Run.objects.filter(task_id=hung, finished_at__isnull=False).exists()


def test_a_worker_recycles_itself_in_place_after_write_off_limit_write_offs(start_worker, watchdog):
    # Given a worker that may write off two slots
    watchdog(write_off_limit=2)
    worker = start_worker("--concurrency", "3", "--shutdown-grace", "2")
    first_id = Worker.objects.get(pid=worker.pid).id

    # When two handlers overrun their timeout
    hung = [enqueue_hung_task(), enqueue_hung_task()]

    # Then it stops, says so, and runs itself again under the same pid (os.execv)
    wait_until(lambda: "recycling" in worker.log(), message="the recycling line")
    fresh = wait_until(
        lambda: Worker.objects.filter(pid=worker.pid).exclude(id=first_id).first(),
        message="a new worker id to register",
    )
    assert worker.proc.poll() is None
    assert not Worker.objects.filter(id=first_id).exists()
    assert "too many slots written off" in worker.log()
    # both attempts were settled as timeouts, and the fresh process runs tasks
    assert [settled(task_id).errors[0]["type"] for task_id in hung] == ["TimeoutError"] * 2
    task_id = tasks.record.enqueue("after the recycle")
    wait_until(lambda: Run.objects.filter(task_id=task_id).exists(), message="a task to run")
    assert Run.objects.get(task_id=task_id).pid == worker.pid
    assert Worker.objects.filter(pid=worker.pid).get().id == fresh.id


def test_in_process_mode_a_child_recycles_on_its_first_write_off_and_is_replaced(
    start_worker, watchdog
):
    # Given two supervised children, each allowed many write-offs by the settings
    watchdog(write_off_limit=10)
    supervisor = start_worker(
        "--processes", "2", "--concurrency", "2", "--shutdown-grace", "2", wait=False
    )
    wait_until(lambda: Worker.objects.count() == 2, timeout=30, message="two children")

    # When a handler of one child overruns its timeout
    hung = enqueue_hung_task()
    stuck_pid = wait_until(
        lambda: Run.objects.filter(task_id=hung).values_list("pid", flat=True).first(),
        message="the hung task to start",
    )

    # Then that child stops at once with the recycle code and the supervisor replaces it
    wait_until(
        lambda: (
            f"worker process {stuck_pid} exited with 75; starting a replacement" in supervisor.log()
        ),
        timeout=20,
        message="the supervisor to replace the child",
    )
    wait_until(
        lambda: Worker.objects.count() == 2 and not Worker.objects.filter(pid=stuck_pid).exists(),
        timeout=30,
        message="a replacement child to register",
    )
    assert settled(hung).errors[0]["type"] == "TimeoutError"
    assert supervisor.proc.poll() is None
    # and the queue is served by both children again
    ids = tasks.sleep_and_record.enqueue_many([0.5] * 4)
    wait_until(
        lambda: Task.objects.filter(pk__in=ids, state="succeeded").count() == 4,
        message="the tasks to succeed",
    )
