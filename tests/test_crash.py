"""Crashes, signals and leases with real worker processes."""

import os
import signal
import time

import pytest

from django_pgqueue.models import Task
from tests import ledger, tasks
from tests.conftest import wait_until
from tests.ledger_tasks import ledger_run
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

FAST_LEASE = ("--lease", "2", "--heartbeat", "0.5", "--sweep-interval", "0.25")


@pytest.mark.slow
def test_a_task_of_a_sigkilled_worker_runs_again_elsewhere_as_attempt_2(start_worker):
    task_id = tasks.sleep_and_record.enqueue(60)
    doomed = start_worker(*FAST_LEASE)
    wait_until(lambda: Run.objects.filter(task_id=task_id).exists())
    survivor = start_worker(*FAST_LEASE)

    doomed.kill()
    killed_at = time.monotonic()
    rerun = wait_until(lambda: Run.objects.filter(task_id=task_id, attempt=2).first(), timeout=30)
    recovered_after = time.monotonic() - killed_at

    assert rerun.pid == survivor.pid
    # lease (2 s) + one sweep (0.25 s) + claim; generous slack for a loaded machine.
    assert recovered_after < 2 + 0.25 + 3
    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt) == ("running", 2)
    assert row.errors[0]["type"] == "LeaseExpired"


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_a_task_that_kills_its_worker_every_time_ends_failed_after_max_attempts(start_worker):
    task_id = tasks.kill_my_worker.enqueue()  # max_attempts=2

    for _ in range(6):
        worker = start_worker(*FAST_LEASE, wait=False)
        deadline = time.monotonic() + 15
        while worker.proc.poll() is None and time.monotonic() < deadline:
            if Task.objects.get(pk=task_id).state == "failed":
                break
            time.sleep(0.05)
        worker.stop()
        if Task.objects.get(pk=task_id).state == "failed":
            break

    row = Task.objects.get(pk=task_id)
    assert row.state == "failed"
    assert row.attempt == 2
    assert Run.objects.filter(task_id=task_id).count() == 2
    assert [e["type"] for e in row.errors] == ["LeaseExpired", "LeaseExpired"]


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_a_task_longer_than_its_lease_is_not_stolen_while_its_worker_lives(start_worker):
    task_id = tasks.sleep_and_record.enqueue(4)  # twice the 2 s lease
    start_worker(*FAST_LEASE)
    start_worker(*FAST_LEASE)

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="succeeded").first(), timeout=30)

    assert row.attempt == 1
    assert row.errors == []
    assert Run.objects.filter(task_id=task_id).count() == 1


@pytest.mark.slow  # under load the first worker may take its own lapsed lease back first
def test_a_worker_whose_lease_was_taken_over_writes_nothing_and_counts_it_lost(start_worker):
    task_id = tasks.sleep_and_record.enqueue(3)
    first = start_worker(
        "--lease", "30", "--heartbeat", "10", "--concurrency", "1", "--prefetch", "0"
    )
    wait_until(lambda: Run.objects.filter(task_id=task_id).exists())
    # The first worker's lease lapses (as if it had stalled); a second one takes over.
    Task.objects.filter(pk=task_id).update(lease_expires_at="2000-01-01T00:00:00Z")
    second = start_worker(*FAST_LEASE)

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="succeeded").first(), timeout=30)
    wait_until(lambda: "lease lost" in first.log(), timeout=15)
    first.stop()
    second.stop()

    assert row.attempt == 2
    assert [r.pid for r in Run.objects.filter(task_id=task_id)] == [first.pid, second.pid]
    assert "lost=1" in first.log()
    assert "success=1" in second.log()


def test_sigterm_stops_claiming_and_lets_running_handlers_finish(start_worker):
    running = tasks.sleep_and_record.enqueue(1.0)
    worker = start_worker("--shutdown-grace", "10", "--log-level", "DEBUG")
    wait_until(lambda: Run.objects.filter(task_id=running).exists())

    worker.signal(signal.SIGTERM)
    # Once the worker has handled the signal (asynchronously: a loaded machine may take
    # a while), nothing more is claimed.
    wait_until(lambda: "claims stopped" in worker.log())
    late = tasks.noop.enqueue(1)

    assert worker.wait(20) == 0
    assert Task.objects.get(pk=running).state == "succeeded"
    assert Task.objects.get(pk=late).state == "pending"


@pytest.mark.slow
def test_sigterm_releases_unfinished_leases_for_another_worker_at_once(start_worker):
    task_id = tasks.sleep_and_record.enqueue(30)
    worker = start_worker("--shutdown-grace", "0.5")
    wait_until(lambda: Run.objects.filter(task_id=task_id).exists())

    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0

    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt, row.lease_token) == ("scheduled", 1, None)
    other = start_worker("--lease", "30")
    rerun = wait_until(lambda: Run.objects.filter(task_id=task_id, attempt=2).first(), timeout=10)
    assert rerun.pid == other.pid


def test_a_second_signal_exits_at_once(start_worker):
    task_id = tasks.sleep_and_record.enqueue(60)
    worker = start_worker("--shutdown-grace", "60")
    wait_until(lambda: Run.objects.filter(task_id=task_id).exists())

    worker.signal(signal.SIGTERM)
    time.sleep(0.3)
    worker.signal(signal.SIGINT)

    assert worker.wait(5) == 1
    assert "second signal" in worker.log()


@pytest.mark.slow
@pytest.mark.parametrize("processes", [3])
def test_several_workers_run_thousands_of_tasks_each_exactly_once(start_worker, processes):
    total = 3000
    ids = tasks.record.enqueue_many([(f"t{n}",) for n in range(total)])

    workers = [start_worker("--concurrency", "4", wait=False) for _ in range(processes)]
    wait_until(
        lambda: Task.objects.filter(state="succeeded").count() == total,
        timeout=120,
        interval=0.2,
        message="all tasks to succeed",
    )
    for worker in workers:
        worker.stop()

    assert Task.objects.filter(pk__in=ids, attempt=1, state="succeeded").count() == total
    runs = list(Run.objects.values_list("task_id", "attempt"))
    assert len(runs) == total
    assert len(set(runs)) == total
    assert len(set(Run.objects.values_list("pid", flat=True))) == processes


@pytest.mark.slow
def test_process_mode_stops_gracefully_when_the_whole_group_is_signalled(start_worker):
    task_id = tasks.sleep_and_record.enqueue(1.5)
    supervisor = start_worker("--processes", "2", "--shutdown-grace", "20", new_session=True)
    wait_until(lambda: Run.objects.filter(task_id=task_id).exists())

    os.killpg(supervisor.pid, signal.SIGTERM)  # Ctrl-C / systemd reach every process

    assert supervisor.wait(30) == 0
    assert "second signal" not in supervisor.log()
    assert Task.objects.get(pk=task_id).state == "succeeded"


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_a_stalled_worker_does_not_start_the_tasks_it_held_once_their_leases_lapsed(
    start_worker, tmp_path, monkeypatch
):
    # Given a worker with one slot holding five prefetched tasks, and a 2 s lease
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    fast = ("--lease", "2", "--heartbeat", "0.5", "--sweep-interval", "0.25")
    stalled = start_worker("--concurrency", "1", "--prefetch", "5", *fast)
    ids = ledger_run.enqueue_many([(n, 0.4) for n in range(6)])
    wait_until(lambda: Task.objects.filter(pk__in=ids, state="running").count() == 6, 10,
               message="all six claimed by the one worker")  # fmt: skip
    # When it stalls for longer than the lease while another worker takes them over
    stalled.signal(signal.SIGSTOP)
    start_worker("--concurrency", "4", *fast)
    wait_until(lambda: Task.objects.filter(pk__in=ids, state="succeeded").count() == 6, 20,
               message="the other worker to run them")  # fmt: skip
    resumed = time.time()
    stalled.signal(signal.SIGCONT)
    time.sleep(1.5)
    # Then, woken, it starts none of the tasks it held (their leases lapsed): at most
    # the one already running in its slot goes on
    late = [e for e in ledger.read(path)
            if e["event"] == "start" and e["pid"] == stalled.pid and e["t"] >= resumed]  # fmt: skip
    assert late == []
    assert "its lease expired before it could start" in stalled.log()
