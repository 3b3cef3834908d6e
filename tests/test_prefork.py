"""Process execution mode (``--execution process``): every handler runs in a child
process of the worker's prefork pool, so a handler past its timeout, or cancelled with
``hard=True``, is killed, and its retry never overlaps it.

Real worker subprocesses; the handlers (tests/prefork_tasks.py) write a ledger file
(tests/ledger.py) with their pid, and each ``start`` lists which earlier runs of the
same task were still alive at that moment.
"""

from __future__ import annotations

import signal
from datetime import datetime
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from django_pgqueue import cancel
from django_pgqueue.models import Task
from django_pgqueue.ops import operations
from django_pgqueue.worker.prefork import DEADLINE_MARGIN
from tests import ledger, prefork_tasks
from tests.conftest import wait_until
from tests.test_admin import act, messages_of
from tests.test_revive import dead_after_a_hard_cancel

pytestmark = pytest.mark.django_db(transaction=True)

KILL_GRACE = 2.0  # the KILL_GRACE default, which these workers use


@pytest.fixture
def ledger_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ledger of the workers started afterwards."""
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    return path


def starts(path: Path, task_id: int) -> list[dict]:
    return [e for e in ledger.read(path) if e["event"] == "start" and e["task"] == task_id]


def finished(task_id: int, *states: str) -> Task | None:
    return Task.objects.filter(pk=task_id, state__in=states or ("succeeded", "failed")).first()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped by whoever adopted it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def process_worker(start_worker, *args: str):
    """A worker with --execution process (two slots unless told: each is a process)."""
    if "--concurrency" not in args:
        args = ("--concurrency", "2", *args)
    return start_worker("--execution", "process", *args)


# -- running tasks ----------------------------------------------------------------------


@pytest.mark.slow
def test_sync_and_async_handlers_run_in_child_processes_and_their_outcomes_are_recorded(
    start_worker,
):
    # Given a worker running handlers in processes
    worker = process_worker(start_worker, "--concurrency", "2")

    # When a sync task, an async task and a failing task run
    sync_id = prefork_tasks.double.enqueue(21)
    async_id = prefork_tasks.async_double.enqueue(5)
    failing_id = prefork_tasks.fail.enqueue("no luck")

    # Then their results and errors are recorded as in thread mode
    sync_row = wait_until(lambda: finished(sync_id), message="the sync task")
    async_row = wait_until(lambda: finished(async_id), message="the async task")
    failing_row = wait_until(lambda: finished(failing_id), message="the failing task")
    assert (sync_row.state, sync_row.result["n"]) == ("succeeded", 42)
    assert (async_row.state, async_row.result["n"]) == ("succeeded", 10)
    assert failing_row.state == "failed"
    assert failing_row.errors[-1]["type"] == "builtins.ValueError"
    assert failing_row.errors[-1]["message"] == "no luck"
    # ... in processes other than the worker's
    assert worker.pid not in (sync_row.result["pid"], async_row.result["pid"])


# -- timeouts -----------------------------------------------------------------------------


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_a_handler_past_its_timeout_is_killed_before_its_retry_starts(start_worker, ledger_file):
    # Given a handler that swallows the terminate order and sleeps through its timeout
    timeout = 1.0
    task_id = prefork_tasks.stubborn_on_first_attempt.using(
        timeout=timeout, max_attempts=2
    ).enqueue(30)
    process_worker(start_worker, "--concurrency", "2")

    # When its timeout and the kill grace pass
    row = wait_until(lambda: finished(task_id), timeout=30, message="the retry to succeed")

    # Then the first attempt was settled as a timeout at about timeout + margin + grace
    first = row.executions[0]
    assert (first["attempt"], first["outcome"]) == (1, "timeout")
    assert "SIGKILL" in row.errors[0]["message"]
    took = (
        datetime.fromisoformat(first["ended"]) - datetime.fromisoformat(first["started"])
    ).total_seconds()
    assert timeout + KILL_GRACE <= took <= timeout + DEADLINE_MARGIN + KILL_GRACE + 2.0
    # ... and the retry started only once the first run's process was gone
    runs = starts(ledger_file, task_id)
    assert [r["attempt"] for r in runs] == [1, 2]
    assert runs[1]["alive"] == []
    assert runs[1]["pid"] != runs[0]["pid"]
    assert not alive(runs[0]["pid"])


@pytest.mark.slow  # two starts within 1.5 s of each other: not under other tests' load
def test_a_killed_handlers_slot_gets_a_new_process_and_full_concurrency_remains(
    start_worker, ledger_file
):
    # Given a two-slot worker whose handler was killed on its timeout
    task_id = prefork_tasks.slow_on_first_attempt.using(timeout=0.5, max_attempts=2).enqueue(30)
    process_worker(start_worker, "--concurrency", "2")
    row = wait_until(lambda: finished(task_id), timeout=15, message="the timeout and the retry")
    assert row.errors[0]["message"] == (
        "the attempt exceeded its timeout of 0.5s; its process was killed (it stopped when told to)"
    )
    killed_pid = starts(ledger_file, task_id)[0]["pid"]

    # When two tasks that each take 2 s are enqueued
    pair = [prefork_tasks.sleep.enqueue(2) for _ in range(2)]

    # Then both run at once, in two processes, neither of them the killed one
    for pair_id in pair:
        wait_until(lambda pair_id=pair_id: finished(pair_id), timeout=15, message="the pair")
    first, second = (starts(ledger_file, pair_id)[0] for pair_id in pair)
    assert abs(first["t"] - second["t"]) < 1.5
    assert len({first["pid"], second["pid"], killed_pid}) == 3


# -- cancel -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_hard_cancel_kills_the_running_handler_within_about_a_heartbeat(
    start_worker, ledger_file
):
    # Given a handler sleeping in a process-mode worker with a 0.5 s heartbeat
    task_id = prefork_tasks.sleep.enqueue(30)
    process_worker(start_worker, "--heartbeat", "0.5")
    run = wait_until(lambda: starts(ledger_file, task_id), message="the handler")[0]

    # When it is cancelled with hard=True
    assert cancel(task_id, hard=True) == "cancel_requested"

    # Then its process is killed within about a heartbeat and the task ends cancelled
    row = wait_until(lambda: finished(task_id, "cancelled"), timeout=3, message="the kill")
    assert row.errors[-1]["message"] == (
        "cancelled with hard=True: the handler's process was killed"
    )
    assert not alive(run["pid"])
    assert not [e for e in ledger.read(ledger_file) if e["event"] == "end"]


@pytest.mark.slow
def test_a_soft_cancel_reaches_the_handlers_context_in_its_process(start_worker, ledger_file):
    # Given a handler that only watches context.cancel_requested (no database read)
    task_id = prefork_tasks.wait_for_cancel_flag.enqueue()
    process_worker(start_worker, "--heartbeat", "0.5")
    wait_until(lambda: starts(ledger_file, task_id), message="the handler")

    # When it is cancelled
    cancel(task_id)

    # Then the heartbeat's news reaches the handler, which stops
    row = wait_until(lambda: finished(task_id, "cancelled"), timeout=5, message="the stop")
    assert row.errors[-1]["message"] == "saw the cancel request"


def test_a_hard_cancel_in_thread_mode_acts_as_a_soft_one_and_says_so(start_worker, ledger_file):
    # Given a handler in a thread-mode worker
    task_id = prefork_tasks.wait_for_cancel_flag.enqueue()
    worker = start_worker("--heartbeat", "0.5")
    wait_until(lambda: starts(ledger_file, task_id), message="the handler")

    # When it is cancelled with hard=True
    cancel(task_id, hard=True)

    # Then the handler is asked to stop, and the worker warns that it cannot kill it
    row = wait_until(lambda: finished(task_id, "cancelled"), timeout=5, message="the stop")
    assert row.errors[-1]["message"] == "saw the cancel request"
    assert "--execution process for hard cancels" in worker.log()


@pytest.mark.slow
@pytest.mark.parametrize("revive", [operations.retry_now, operations.requeue_dead])
def test_a_dead_letter_revived_after_a_hard_cancel_runs_its_handler(pg, start_worker, revive):
    # Given a dead letter whose last attempt was hard-cancelled, then failed
    task_id = dead_after_a_hard_cancel(pg, prefork_tasks.double, 21)

    # When an operator revives it and a process-mode worker claims it
    assert revive([task_id]) == [task_id]
    process_worker(start_worker)

    # Then its handler runs: the revived task succeeds
    row = wait_until(lambda: finished(task_id, "succeeded", "cancelled"), message="the run")
    assert (row.state, row.result["n"]) == ("succeeded", 42), row.errors


@pytest.mark.slow
def test_a_task_flagged_hard_without_a_cancel_request_runs_and_a_soft_cancel_stays_soft(
    start_worker, ledger_file
):
    # Given pending tasks whose rows say cancel_hard without a cancel request (what a
    # retry of an older release left), one of them watching for a cancel request
    plain = prefork_tasks.double.enqueue(4)
    watching = prefork_tasks.wait_for_cancel_flag.enqueue()
    Task.objects.filter(pk__in=[plain, watching]).update(cancel_hard=True)

    # When a process-mode worker claims them, and the watching one is cancelled softly
    process_worker(start_worker, "--heartbeat", "0.5")
    wait_until(lambda: starts(ledger_file, watching), message="the watching handler")
    assert cancel(watching) == "cancel_requested"

    # Then both handlers ran, and the soft cancel reached the handler instead of a kill
    row = wait_until(lambda: finished(plain, "succeeded", "cancelled"), message="the plain run")
    assert (row.state, row.result["n"]) == ("succeeded", 8), row.errors
    row = wait_until(lambda: finished(watching, "cancelled"), timeout=5, message="the stop")
    assert row.errors[-1]["message"] == "saw the cancel request"


def test_the_cancel_command_cancels_by_id_and_names_the_ids_it_could_not(capsys):
    # Given a pending task and an id that does not exist
    task_id = prefork_tasks.double.enqueue(1)

    # When both are cancelled with the command
    with pytest.raises(CommandError, match=r"not cancelled .*: 999999"):
        call_command("pgqueue_cancel", str(task_id), "999999", "--hard")

    # Then the pending one is cancelled
    assert Task.objects.get(pk=task_id).state == "cancelled"
    assert f"task {task_id}: cancelled" in capsys.readouterr().out


@pytest.mark.slow
def test_the_admins_kill_action_sets_the_hard_cancel_flag_of_running_tasks(
    admin_client, start_worker, ledger_file
):
    # Given a running handler
    task_id = prefork_tasks.sleep.enqueue(30)
    process_worker(start_worker, "--heartbeat", "0.5")
    wait_until(lambda: starts(ledger_file, task_id), message="the handler")

    # When an admin runs "Cancel (kill the handler)" on it
    response = act(admin_client, "cancel_hard", Task.objects.get(pk=task_id))

    # Then the worker kills it
    assert any("Requested a kill of 1 running" in m for m in messages_of(response))
    row = wait_until(lambda: finished(task_id, "cancelled"), timeout=5, message="the kill")
    assert "process was killed" in row.errors[-1]["message"]


# -- processes that die -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("enqueue", "message"),
    [
        (lambda: prefork_tasks.exit_process.enqueue(3), "exited with code 3"),
        (lambda: prefork_tasks.kill_own_process.enqueue(), "died with signal 9 (SIGKILL)"),
    ],
    ids=["os._exit", "SIGKILL"],
)
@pytest.mark.slow
def test_a_handler_whose_process_dies_fails_its_attempt_and_the_pool_recovers(
    start_worker, enqueue, message
):
    # Given a one-slot worker
    process_worker(start_worker, "--concurrency", "1")

    # When a handler ends its own process
    task_id = enqueue()

    # Then the attempt fails, saying how the process died
    row = wait_until(lambda: finished(task_id), message="the failure")
    assert row.state == "failed"
    assert row.errors[-1]["type"] == "HandlerProcessDied"
    assert message in row.errors[-1]["message"]
    # ... and the slot's new process runs the next task
    next_id = prefork_tasks.double.enqueue(2)
    assert wait_until(lambda: finished(next_id), message="the next task").state == "succeeded"


# -- shutdown -----------------------------------------------------------------------------


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_shutdown_kills_an_unfinished_handler_before_releasing_it_to_another_worker(
    start_worker, ledger_file
):
    # Given a long handler in a process-mode worker with a short shutdown grace
    task_id = prefork_tasks.slow_on_first_attempt.using(max_attempts=2).enqueue(30)
    first = process_worker(start_worker, "--shutdown-grace", "0.5")
    run = wait_until(lambda: starts(ledger_file, task_id), message="the handler")[0]

    # When the worker gets SIGTERM while another worker is running
    process_worker(start_worker)
    first.signal(signal.SIGTERM)

    # Then the first worker kills the handler and exits, and the task is released
    assert first.wait(15) == 0
    assert not alive(run["pid"])
    assert "was killed at shutdown" in first.log()
    row = wait_until(lambda: finished(task_id), timeout=15, message="the re-run")
    assert [e["outcome"] for e in row.executions] == ["released", "success"]
    # ... and re-run only once the first handler's process was gone
    runs = starts(ledger_file, task_id)
    assert [r["attempt"] for r in runs] == [1, 2]
    assert runs[1]["alive"] == []


@pytest.mark.slow
def test_a_handlers_process_exits_when_its_worker_dies(start_worker, ledger_file):
    # Given a long handler in a process-mode worker
    task_id = prefork_tasks.sleep.enqueue(30)
    worker = process_worker(start_worker)
    run = wait_until(lambda: starts(ledger_file, task_id), message="the handler")[0]

    # When the worker is SIGKILLed (nothing of it runs to clean up)
    worker.kill()

    # Then the handler's process exits too: it cannot outlive the lease and overlap the
    # run that starts once the lease is recovered
    wait_until(lambda: not alive(run["pid"]), timeout=5, message="the handler's process to exit")
