"""The watchdog with real worker processes: a handler that ignores its timeout is
written off and its slot replaced, but its task keeps its lease until the handler
returns or its process exits, so no other run of the task overlaps it; a process that
holds a written-off handler for too long, or writes off too many, is recycled.

The worker reads TIMEOUT_GRACE, WRITE_OFF_LIMIT and WRITE_OFF_EXIT_AFTER from settings
only (no flag): tests/settings.py takes them from PGQUEUE_TEST_TIMEOUT_GRACE,
PGQUEUE_TEST_WRITE_OFF_LIMIT and PGQUEUE_TEST_WRITE_OFF_EXIT_AFTER, which these tests
set before starting a worker. The ledger tests judge overlaps by what the handlers
wrote outside the database (tests/ledger.py).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_pgqueue import cancel
from django_pgqueue.models import Task, Worker
from tests import ledger, tasks
from tests.conftest import wait_until
from tests.ledger_tasks import ledger_overrun, ledger_run
from tests.test_metrics import free_port, scrape
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 0.3
GRACE = 0.5
WRITTEN_OFF = (
    f"the attempt overran its timeout of {TIMEOUT:g}s plus {GRACE:g}s grace; "
    "its slot was written off and "
)
# A lease shorter than the hung handlers sleep: only the heartbeat's renewals of the
# written-off lease keep the sweep from handing the task to another worker.
FAST_LEASE = ("--lease", "2", "--heartbeat", "0.5", "--sweep-interval", "0.25")


@pytest.fixture
def watchdog(monkeypatch: pytest.MonkeyPatch):
    """Set the grace, the write-off limit and the exit-after of the workers started
    afterwards."""

    def configure(write_off_limit: int = 10, exit_after: float = 60.0) -> None:
        monkeypatch.setenv("PGQUEUE_TEST_TIMEOUT_GRACE", str(GRACE))
        monkeypatch.setenv("PGQUEUE_TEST_WRITE_OFF_LIMIT", str(write_off_limit))
        monkeypatch.setenv("PGQUEUE_TEST_WRITE_OFF_EXIT_AFTER", str(exit_after))

    return configure


@pytest.fixture
def ledger_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ledger the workers started afterwards write their runs to."""
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    return path


def enqueue_hung_task(seconds: float = 30) -> int:
    """A sync handler that sleeps through its 0.3 s timeout, with one attempt."""
    return tasks.sleep_and_record.using(timeout=TIMEOUT, max_attempts=1).enqueue(seconds)


def settled(task_id: int) -> Task | None:
    return Task.objects.filter(pk=task_id, state="failed").first()


def written_off(log: str, task_id: int) -> bool:
    return re.search(rf"task {task_id} .* is written off", log) is not None


def runs(path: Path, task_id: int) -> list[ledger.Run]:
    return ledger.runs_of(ledger.read(path)).get(task_id, [])


def check_ledger(path: Path, committed: list[int]) -> ledger.LedgerReport:
    report = ledger.check(ledger.read(path), ledger.task_rows(connection.cursor()), committed)
    report.assert_clean()
    return report


@pytest.fixture
def exits(ledger_file: Path) -> Iterator[Callable[[int], None]]:
    """``watch(pid)``: record in the ledger when process ``pid`` (not a child of the
    test: a supervisor's) is gone, within 10 ms of its exit (a zombie counts as gone),
    so that the ledger bounds the runs it cut short."""
    stop = threading.Event()
    watchers: list[threading.Thread] = []

    def gone(pid: int) -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")

    def watch(pid: int) -> None:
        def run() -> None:
            while not stop.wait(0.01):
                if gone(pid):
                    ledger.record_exit(ledger_file, pid)
                    return

        watcher = threading.Thread(target=run, daemon=True)
        watcher.start()
        watchers.append(watcher)

    yield watch
    stop.set()
    for watcher in watchers:
        watcher.join(1)


@pytest.mark.slow
def test_a_written_off_handler_keeps_its_lease_until_it_returns_then_times_out(
    start_worker, watchdog
):
    # Given a worker with a short lease whose handler sleeps 4 s through its timeout
    watchdog()
    port = free_port()
    task_id = enqueue_hung_task(4)
    worker = start_worker("--concurrency", "2", "--metrics-port", str(port), *FAST_LEASE)

    # When the timeout and the grace pass, the slot is written off (counted and logged)
    wait_until(
        lambda: scrape(port).get(("pgqueue_slots_written_off_total",)) == 1,
        message="the written_off counter",
    )
    assert re.search(
        rf"task {task_id} .* slot \d+ is written off \(1 of 10 allowed\)", worker.log()
    )
    # Then the task stays running under its first lease, past the lease's 2 s, while the
    # handler sleeps
    token = Task.objects.get(pk=task_id).lease_token
    time.sleep(2.5)
    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt, row.lease_token) == ("running", 1, token)
    assert not Run.objects.filter(task_id=task_id, finished_at__isnull=False).exists()
    # and once the handler returns, its attempt (a success to the handler) is settled
    # as a timeout
    row = wait_until(lambda: settled(task_id), timeout=10, message="the settlement")
    [error] = row.errors
    assert error["type"] == "TimeoutError"
    assert error["message"].startswith(WRITTEN_OFF + "its handler returned 4.")
    run = Run.objects.get(task_id=task_id)
    assert row.finished_at >= run.finished_at
    assert [(e["outcome"], e["source"]) for e in row.executions] == [("timeout", "settle")]
    assert scrape(port)[("pgqueue_late_returns_total",)] == 1
    assert worker.proc.poll() is None


@pytest.mark.slow
def test_a_written_off_slot_is_replaced_so_the_worker_keeps_its_full_concurrency(
    start_worker, watchdog
):
    # Given a 2-slot worker, one of whose threads is stuck in a written-off handler
    watchdog()
    hung = enqueue_hung_task()
    worker = start_worker("--concurrency", "2")
    wait_until(lambda: written_off(worker.log(), hung), timeout=15, message="the write-off")

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
    assert Task.objects.get(pk=hung).state == "running"


@pytest.mark.slow
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
    # both attempts were settled as timeouts (not released) as the old process left,
    # and the fresh process runs tasks
    assert "shutdown grace: released" not in worker.log()
    for task_id in hung:
        [error] = settled(task_id).errors
        assert error["type"] == "TimeoutError"
        assert error["message"] == (
            WRITTEN_OFF + "its handler was still running when its process exited"
        )
    task_id = tasks.record.enqueue("after the recycle")
    wait_until(lambda: Run.objects.filter(task_id=task_id).exists(), message="a task to run")
    assert Run.objects.get(task_id=task_id).pid == worker.pid
    assert Worker.objects.filter(pid=worker.pid).get().id == fresh.id


@pytest.mark.slow
def test_a_hard_cancel_of_a_written_off_handler_ends_the_task_cancelled_when_it_returns(
    start_worker, watchdog
):
    # Given a thread-mode worker whose handler sleeps 3 s through its timeout, written off
    watchdog()
    task_id = tasks.sleep_and_record.using(timeout=TIMEOUT, max_attempts=3).enqueue(3)
    worker = start_worker("--concurrency", "2", "--heartbeat", "0.3")
    wait_until(lambda: written_off(worker.log(), task_id), message="the write-off")

    # When it is cancelled with hard=True (a thread cannot be killed)
    assert cancel(task_id, hard=True) == "cancel_requested"

    # Then the task keeps its lease until the handler returns, then ends cancelled: its
    # timeout is not retried, and it never ran twice
    row = wait_until(
        lambda: Task.objects.filter(pk=task_id, state="cancelled").first(),
        timeout=10,
        message="the task to end cancelled",
    )
    [run] = Run.objects.filter(task_id=task_id)
    assert run.finished_at is not None and row.finished_at >= run.finished_at
    assert [e["outcome"] for e in row.executions] == ["timeout"]


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_a_hung_handler_never_overlaps_its_retry_which_starts_once_its_thread_ended(
    start_worker, watchdog, ledger_file
):
    # Given two worker processes with a short lease, and a task whose first attempt
    # sleeps 4 s through its timeout, beside healthy tasks
    watchdog(exit_after=30)
    workers = [start_worker("--concurrency", "2", "--prefetch", "0", *FAST_LEASE)
               for _ in range(2)]  # fmt: skip
    hung = ledger_overrun.using(timeout=TIMEOUT).enqueue(4.0)
    wait_until(lambda: runs(ledger_file, hung), message="the hung task to start")
    healthy = ledger_run.enqueue_many([(n, 1.0) for n in range(6)])

    # When its slot is written off, and the handler returns later
    row = wait_until(
        lambda: Task.objects.filter(pk=hung, state="succeeded").first(),
        timeout=20,
        message="the hung task's retry to succeed",
    )

    # Then the retry started only after the first attempt's thread had ended
    first, second = runs(ledger_file, hung)
    assert (first.attempt, second.attempt) == (1, 2)
    assert first.finished and second.start >= first.end
    # the first attempt is recorded as a timeout, no lease was lost, and no overlap at
    # all is in the ledger
    assert [(e["attempt"], e["outcome"]) for e in row.executions] == [
        (1, "timeout"), (2, "success")
    ]
    assert row.errors[0]["message"].startswith(WRITTEN_OFF + "its handler returned 4.")
    wait_until(
        lambda: Task.objects.filter(pk__in=healthy, state="succeeded").count() == 6,
        message="the healthy tasks",
    )
    report = check_ledger(ledger_file, [hung, *healthy])
    assert report.justified_overlaps == 0
    # no healthy task was retried, and both processes still serve the queue
    assert set(Task.objects.filter(pk__in=healthy).values_list("attempt", flat=True)) == {1}
    assert all(len(runs(ledger_file, task_id)) == 1 for task_id in healthy)
    assert [w.proc.poll() for w in workers] == [None, None]


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_a_process_holding_a_hung_handler_exits_after_write_off_exit_after_and_is_replaced(
    start_worker, watchdog, ledger_file, exits
):
    # Given two supervised worker processes with a short lease, and a task whose first
    # attempt sleeps through its timeout for a minute
    watchdog(exit_after=1.5)
    supervisor = start_worker(
        "--processes", "2", "--concurrency", "2", "--prefetch", "0", "--shutdown-grace", "5",
        *FAST_LEASE, wait=False,
    )  # fmt: skip
    wait_until(lambda: Worker.objects.count() == 2, timeout=30, message="two children")
    hung = ledger_overrun.using(timeout=TIMEOUT).enqueue(60.0)
    [started] = wait_until(lambda: runs(ledger_file, hung), message="the hung task to start")
    stuck_pid = started.pid
    exits(stuck_pid)
    wait_until(lambda: written_off(supervisor.log(), hung), message="the write-off")

    # When healthy tasks arrive, two for each process, while the handler hangs on
    healthy = ledger_run.enqueue_many([(n, 2.0) for n in range(4)])

    # Then the stuck process stops claiming WRITE_OFF_EXIT_AFTER after the write-off,
    # lets its healthy handlers finish, settles the hung attempt as a timeout and exits,
    # and the supervisor replaces it
    wait_until(
        lambda: (
            f"worker process {stuck_pid} exited with 75; starting a replacement" in supervisor.log()
        ),
        timeout=20,
        message="the supervisor to replace the stuck process",
    )
    assert "has run on for 1.5s (WRITE_OFF_EXIT_AFTER)" in supervisor.log()
    wait_until(
        lambda: Worker.objects.count() == 2 and not Worker.objects.filter(pid=stuck_pid).exists(),
        timeout=30,
        message="a replacement process to register",
    )
    # and the task's later attempt runs, after the stuck process was gone
    row = wait_until(
        lambda: Task.objects.filter(pk=hung, state="succeeded").first(),
        timeout=20,
        message="the hung task's retry to succeed",
    )
    first, second = runs(ledger_file, hung)
    assert (first.attempt, first.pid, first.finished) == (1, stuck_pid, False)
    assert first.died is not None and second.start >= first.died
    assert [(e["attempt"], e["outcome"]) for e in row.executions] == [
        (1, "timeout"), (2, "success")
    ]
    assert row.errors[0]["message"] == (
        WRITTEN_OFF + "its handler was still running when its process exited"
    )
    wait_until(
        lambda: Task.objects.filter(pk__in=healthy, state="succeeded").count() == 4,
        message="the healthy tasks",
    )
    report = check_ledger(ledger_file, [hung, *healthy])
    assert report.justified_overlaps == 0
    # The stuck process's healthy tasks finished there: none was released or retried
    assert "releasing its lease" not in supervisor.log()
    assert set(Task.objects.filter(pk__in=healthy).values_list("attempt", flat=True)) == {1}
    assert all(len(runs(ledger_file, task_id)) == 1 for task_id in healthy)
    assert [r.pid for t in healthy for r in runs(ledger_file, t)].count(stuck_pid) == 2
    assert supervisor.proc.poll() is None
