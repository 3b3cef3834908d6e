"""Per-task logs (TASK_LOGS): the records a handler logs during an attempt are stored
with that attempt's settlement, in the same fenced statement, bounded per attempt and
per task, deleted with the task, and shown by the admin, pgqueue_status and
``operations.task_logs``.

The tests in this process drive the worker's own pieces (execute, the settler) on
claims taken with the worker's claim; those under "in a worker" start real worker
processes, in thread and in process execution."""

from __future__ import annotations

import json
import logging
import signal
import uuid
from collections.abc import Iterator
from datetime import datetime

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.urls import reverse

from django_pgqueue.checks import check_settings
from django_pgqueue.models import Task, TaskLog
from django_pgqueue.ops import operations
from django_pgqueue.worker import task_logs
from django_pgqueue.worker.execution import execute
from django_pgqueue.worker.task_logs import TaskLogHandler
from tests import task_log_tasks as tasks
from tests.conftest import wait_until
from tests.sqlhelpers import claim, expire_lease, row, sweep
from tests.test_executions import settle_with_worker

pytestmark = pytest.mark.django_db(transaction=True)

LOGGER = "tests.task_log_tasks"


@pytest.fixture
def keep_logs() -> Iterator[callable]:
    """Keep task logs in this process (as a worker does with TASK_LOGS), with these
    limits; the handler is taken off the root logger afterwards."""

    def keep(level: str = "INFO", records: int = 200, max_bytes: int = 65536,
             task_bytes: int | None = 262144) -> None:  # fmt: skip
        task_logs.install(level, records, max_bytes, task_bytes)

    yield keep
    task_logs.install(None, 0, 0, None)


def run_once(pg, worker_id: str = "w-a"):
    """Claim one task, run its handler as a thread slot does, settle its outcome."""
    (claimed,) = claim(pg, worker_id=worker_id)
    outcome = execute(claimed, "default", None)
    settle_with_worker(outcome, worker_id=worker_id)
    return claimed, outcome


def messages(attempt: operations.AttemptLogs) -> list[str]:
    return [record["message"] for record in attempt.records]


# -- what is kept, with the settlement ------------------------------------------------------


def test_an_attempts_records_are_stored_with_its_settlement(pg, keep_logs):
    keep_logs("INFO")
    task_id = tasks.logs_two.enqueue(7)

    claimed, _ = run_once(pg)

    assert row(pg, task_id)["state"] == "succeeded"
    (attempt,) = operations.task_logs(task_id)
    assert (attempt.attempt, attempt.lease_token, attempt.dropped) == (
        1, claimed.lease_token, 0
    )  # fmt: skip
    assert messages(attempt) == ["charging order 7", "card declined for order 7"]
    assert [(r["level"], r["logger"]) for r in attempt.records] == [
        ("INFO", LOGGER), ("WARNING", LOGGER)
    ]  # fmt: skip
    assert all(isinstance(r["time"], datetime) for r in attempt.records)
    # the execution the records belong to is the one the task's history names
    (execution,) = row(pg, task_id)["executions"]
    assert execution["token"] == attempt.lease_token


def test_records_below_the_task_logs_level_are_not_kept(pg, keep_logs):
    keep_logs("INFO")
    task_id = tasks.logs_below_the_level.enqueue(3)

    run_once(pg)

    (attempt,) = operations.task_logs(task_id)
    assert messages(attempt) == ["an info record of order 3"]


def test_without_task_logs_nothing_is_kept_and_no_handler_is_attached(pg):
    task_id = tasks.logs_two.enqueue(1)

    run_once(pg)

    assert row(pg, task_id)["state"] == "succeeded"
    assert operations.task_logs(task_id) == []
    assert not any(isinstance(h, TaskLogHandler) for h in logging.getLogger().handlers)


def test_an_attempt_that_logs_nothing_stores_no_row(pg, keep_logs):
    keep_logs("WARNING")
    task_id = tasks.logs_below_the_level.enqueue(1)

    run_once(pg)

    assert row(pg, task_id)["state"] == "succeeded"
    assert not TaskLog.objects.filter(task_id=task_id).exists()


def test_a_retried_tasks_attempts_keep_their_records_apart(pg, keep_logs):
    keep_logs("INFO")
    task_id = tasks.fails_then_succeeds.enqueue()

    first, _ = run_once(pg, worker_id="w-a")
    pg.execute("UPDATE pgqueue_task SET run_at = now() WHERE id = %s", [task_id])
    second, _ = run_once(pg, worker_id="w-b")

    assert row(pg, task_id)["state"] == "succeeded"
    one, two = operations.task_logs(task_id)
    assert (one.attempt, one.lease_token) == (1, first.lease_token)
    assert (two.attempt, two.lease_token) == (2, second.lease_token)
    assert messages(one) == ["attempt 1 begins", "attempt 1 failed"]
    assert "ValueError: the first attempt fails" in one.records[1]["exception"]
    assert messages(two) == ["attempt 2 begins", "attempt 2 succeeds"]


# -- bounds ----------------------------------------------------------------------------------


def test_an_attempt_keeps_its_newest_records_within_task_log_records_and_counts_the_rest(
    pg, keep_logs
):
    keep_logs("INFO", records=5)
    task_id = tasks.logs_many.enqueue(12, 1)

    run_once(pg)

    (attempt,) = operations.task_logs(task_id)
    assert [m.split()[1] for m in messages(attempt)] == ["7", "8", "9", "10", "11"]
    assert attempt.dropped == 7


def test_an_attempt_keeps_its_newest_records_within_task_log_bytes(pg, keep_logs):
    keep_logs("INFO", max_bytes=16384)
    task_id = tasks.logs_many.enqueue(100, 1000)

    run_once(pg)

    (attempt,) = operations.task_logs(task_id)
    stored = TaskLog.objects.get(task_id=task_id)
    assert messages(attempt)[-1].startswith("record 99 ")
    assert 10 <= len(attempt.records) <= 16
    assert attempt.dropped == 100 - len(attempt.records)
    assert stored.bytes <= 16384
    assert len(json.dumps(stored.records)) <= 16384 * 1.1  # the size is about the JSON's


def test_a_task_keeps_its_newest_attempts_records_within_task_log_task_bytes(pg, keep_logs):
    # given: attempts of about 22 KiB of records each, and 50 KiB per task
    keep_logs("INFO", task_bytes=50 * 1024)
    task_id = tasks.logs_and_fails.enqueue(20, 1000)

    # when: three attempts run and fail
    tokens = []
    for number in range(3):
        claimed, _ = run_once(pg, worker_id=f"w-{number}")
        tokens.append(claimed.lease_token)
        pg.execute("UPDATE pgqueue_task SET run_at = now() WHERE id = %s", [task_id])

    # then: the first attempt's records were deleted for the two newest
    kept = operations.task_logs(task_id)
    assert [(a.attempt, a.lease_token) for a in kept] == [(2, tokens[1]), (3, tokens[2])]
    assert sum(r.bytes for r in TaskLog.objects.filter(task_id=task_id)) <= 50 * 1024


def test_text_postgresql_cannot_store_is_escaped_and_the_task_is_settled(pg, keep_logs):
    keep_logs("INFO")
    task_id = tasks.logs_bad_text.enqueue()

    run_once(pg)

    assert row(pg, task_id)["state"] == "succeeded"
    (attempt,) = operations.task_logs(task_id)
    nul, long = messages(attempt)
    assert nul == "a NUL \\x00 here"
    assert long.startswith("y" * 4000) and long.endswith(f" [{100_000 - 4096} bytes cut]")


# Records made by hand, kept without a handler: pytest's own log capture (and its
# workers' reports) would choke on them.
def kept_message(msg: str, args: tuple) -> str:
    log = task_logs.AttemptLog(task_logs.Limits(records=10, bytes=65536, task_bytes=None))
    log.add(logging.LogRecord(LOGGER, logging.INFO, __file__, 1, msg, args, None))
    (kept,) = log.take()["records"]
    return kept["message"]


def test_text_that_was_not_utf8_is_kept_backslash_escaped_and_stores(pg):
    not_utf8 = b"\xff\xfe".decode(errors="surrogateescape")

    message = kept_message("bytes that were not UTF-8: %s", (not_utf8,))

    assert message == "bytes that were not UTF-8: \\udcff\\udcfe"
    pg.execute("SELECT %s::jsonb", [json.dumps([message])])  # PostgreSQL takes it


def test_a_record_whose_arguments_do_not_format_is_kept_with_a_note():
    assert kept_message("%d orders", ("seven",)) == (
        "%d orders [its arguments did not format: TypeError: %d format: a real number is "
        "required, not str]"
    )


def test_records_of_a_thread_the_handler_starts_are_kept_only_in_a_copy_of_its_context(
    pg, keep_logs
):
    keep_logs("INFO")
    task_id = tasks.logs_from_threads.enqueue()

    run_once(pg)

    (attempt,) = operations.task_logs(task_id)
    assert messages(attempt) == ["from the handler", "from a thread in a copy"]


# -- fencing -----------------------------------------------------------------------------------


def test_a_stale_attempts_records_are_not_stored_and_the_current_ones_are(pg, keep_logs):
    # given: worker A runs attempt 1 and logs; its lease lapses, the sweep recovers the
    # task, and worker B claims attempt 2
    keep_logs("INFO")
    task_id = tasks.logs_two.enqueue(5)
    (stale,) = claim(pg, worker_id="w-a")
    stale_outcome = execute(stale, "default", None)
    expire_lease(pg, task_id)
    assert [(r[0], r[1]) for r in sweep(pg)] == [(task_id, "pending")]
    (current,) = claim(pg, worker_id="w-b")

    # when: A's settlement arrives, carrying its records
    stats = settle_with_worker(stale_outcome, worker_id="w-a")

    # then: it is refused as lost, and none of its records is stored
    assert stats.get("lost") == 1
    assert not TaskLog.objects.filter(task_id=task_id).exists()

    # and B's attempt stores its own, under its own lease
    settle_with_worker(execute(current, "default", None), worker_id="w-b")
    (attempt,) = operations.task_logs(task_id)
    assert (attempt.attempt, attempt.lease_token) == (2, current.lease_token)


def test_storing_an_attempts_records_again_stores_nothing_more(pg, keep_logs):
    # given: an attempt settled with its records (as a settlement replayed after its
    # reply was lost would find it)
    keep_logs("INFO")
    task_id = tasks.logs_two.enqueue(8)
    _, outcome = run_once(pg)

    # when: they are stored again
    task_logs.store(pg.execute, [outcome])

    # then: the attempt has its one row
    assert TaskLog.objects.filter(task_id=task_id).count() == 1


def test_an_atomic_success_stores_its_records_in_its_own_transaction(pg, keep_logs):
    keep_logs("INFO")
    task_id = tasks.logs_atomically.enqueue(9)
    (claimed,) = claim(pg)

    outcome = execute(claimed, "default", None)

    assert outcome.written == "succeeded"  # no settler: the handler's transaction wrote it
    (attempt,) = operations.task_logs(task_id)
    assert (attempt.attempt, attempt.lease_token) == (1, claimed.lease_token)
    assert messages(attempt) == ["atomic handler of order 9"]


def test_an_atomic_attempt_whose_lease_was_lost_stores_no_records(pg, keep_logs):
    keep_logs("INFO")
    task_id = tasks.logs_atomically.enqueue(9)
    (claimed,) = claim(pg)
    pg.execute(
        "UPDATE pgqueue_task SET lease_token = %s WHERE id = %s", [str(uuid.uuid4()), task_id]
    )

    outcome = execute(claimed, "default", None)

    assert outcome.written is None
    assert not TaskLog.objects.filter(task_id=task_id).exists()


# -- deleted with the task -------------------------------------------------------------------


def finished_long_ago(pg, *task_ids: int) -> None:
    pg.execute(
        "UPDATE pgqueue_task SET finished_at = now() - interval '30 days' WHERE id = ANY(%s)",
        [list(task_ids)],
    )


def two_tasks_with_logs(pg) -> tuple[int, int]:
    old = tasks.logs_two.enqueue(1)
    run_once(pg)
    kept = tasks.logs_two.enqueue(2)
    run_once(pg)
    assert TaskLog.objects.filter(task_id__in=[old, kept]).count() == 2
    return old, kept


def test_pruning_a_task_deletes_its_records(pg, keep_logs):
    keep_logs("INFO")
    old, kept = two_tasks_with_logs(pg)
    finished_long_ago(pg, old)

    assert operations.prune_expired() == 1

    assert not Task.objects.filter(pk=old).exists()
    assert list(TaskLog.objects.values_list("task_id", flat=True)) == [kept]


def test_pruning_to_an_archive_deletes_the_records_of_the_tasks_it_deletes(
    pg, keep_logs, tmp_path
):
    keep_logs("INFO")
    old, kept = two_tasks_with_logs(pg)
    finished_long_ago(pg, old)

    assert operations.prune_expired(archive_dir=str(tmp_path)) == 1

    assert list(TaskLog.objects.values_list("task_id", flat=True)) == [kept]


def test_deleting_a_finished_task_deletes_its_records(pg, keep_logs):
    keep_logs("INFO")
    old, kept = two_tasks_with_logs(pg)

    assert operations.delete_finished([old]) == [old]

    assert list(TaskLog.objects.values_list("task_id", flat=True)) == [kept]


# -- in a worker ------------------------------------------------------------------------------


def start_logging_worker(start_worker, *args: str, env: dict[str, str] | None = None):
    return start_worker(*args, env={"PGQUEUE_TEST_TASK_LOGS": "INFO", **(env or {})})


def settled(task_id: int, state: str = "succeeded") -> bool:
    return Task.objects.filter(pk=task_id, state=state).exists()


def test_a_thread_mode_worker_keeps_each_attempts_records(start_worker):
    worker = start_logging_worker(start_worker)
    task_id = tasks.logs_two.enqueue(11)

    wait_until(lambda: settled(task_id), 30, message="the task to succeed")

    (attempt,) = operations.task_logs(task_id)
    assert messages(attempt) == ["charging order 11", "card declined for order 11"]
    # Keeping them did not silence the warning, whose logger has no handler of its own
    # (Python writes it to stderr then)
    assert "card declined for order 11" in worker.log()


def test_keeping_only_errors_does_not_silence_a_warning_either(start_worker):
    worker = start_logging_worker(start_worker, env={"PGQUEUE_TEST_TASK_LOGS": "ERROR"})
    task_id = tasks.logs_two.enqueue(21)

    wait_until(lambda: settled(task_id), 30, message="the task to succeed")

    assert operations.task_logs(task_id) == []  # nothing at ERROR
    assert "card declined for order 21" in worker.log()


def test_a_process_mode_worker_keeps_the_records_its_handler_process_logged(start_worker):
    start_logging_worker(start_worker, "--execution", "process", "--concurrency", "1")
    task_id = tasks.logs_two.enqueue(12)

    wait_until(lambda: settled(task_id), 60, message="the task to succeed")

    (attempt,) = operations.task_logs(task_id)
    assert messages(attempt) == ["charging order 12", "card declined for order 12"]


@pytest.mark.parametrize("execution", ["thread", "process"])
def test_an_async_handlers_records_are_kept(start_worker, execution):
    start_logging_worker(start_worker, "--execution", execution, "--concurrency", "1")
    task_id = tasks.logs_async.enqueue(13)

    wait_until(lambda: settled(task_id), 60, message="the task to succeed")

    (attempt,) = operations.task_logs(task_id)
    assert messages(attempt) == ["async handler starts order 13", "async handler ends order 13"]


def test_a_worker_keeps_a_retried_tasks_attempts_apart(start_worker):
    start_logging_worker(start_worker)
    task_id = tasks.fails_then_succeeds.enqueue()

    wait_until(lambda: settled(task_id), 30, message="the task to succeed")

    one, two = operations.task_logs(task_id)
    executions = Task.objects.get(pk=task_id).executions
    assert [(a.attempt, a.lease_token) for a in (one, two)] == [
        (e["attempt"], e["token"]) for e in executions
    ]
    assert messages(one) == ["attempt 1 begins", "attempt 1 failed"]
    assert messages(two) == ["attempt 2 begins", "attempt 2 succeeds"]


@pytest.mark.slow
def test_a_task_released_at_shutdown_keeps_what_its_handler_logged_until_then(start_worker):
    # given: a handler that logged, then runs past the shutdown grace
    worker = start_logging_worker(start_worker, "--shutdown-grace", "2")
    task_id = tasks.logs_then_waits.enqueue(30.0)
    wait_until(lambda: settled(task_id, "running"), 30, message="the task to start")

    # when: the worker is stopped, and releases it
    worker.signal(signal.SIGTERM)
    worker.wait()

    # then: the released attempt kept its record
    (attempt,) = operations.task_logs(task_id)
    assert attempt.attempt == 1
    assert [m.split(" in process ")[0] for m in messages(attempt)] == ["attempt 1"]
    assert Task.objects.get(pk=task_id).executions[-1]["outcome"] == "released"


@pytest.mark.slow
def test_a_paused_workers_late_records_are_not_stored_over_the_next_attempts(start_worker):
    # given: worker A runs attempt 1, logs, and is stopped (SIGSTOP) in its handler
    stale = start_logging_worker(start_worker, "--lease", "2", "--heartbeat", "0.5")
    task_id = tasks.logs_then_waits.enqueue(3.0)
    wait_until(lambda: settled(task_id, "running"), 30, message="worker A to claim it")
    stale.signal(signal.SIGSTOP)
    try:
        # when: its lease lapses, worker B runs attempt 2 to its end, and A resumes,
        # finishes attempt 1 and settles it
        start_logging_worker(start_worker, "--lease", "2", "--heartbeat", "0.5")
        wait_until(lambda: settled(task_id), 60, message="attempt 2 to succeed")
    finally:
        stale.signal(signal.SIGCONT)
    wait_until(lambda: "lease lost before settlement" in stale.log(), 30,
               message="worker A's settlement to be refused")  # fmt: skip

    # then: only attempt 2's records are stored, under its own lease
    (attempt,) = operations.task_logs(task_id)
    (settlement,) = [e for e in Task.objects.get(pk=task_id).executions
                     if e["source"] == "settle"]  # fmt: skip
    assert (attempt.attempt, attempt.lease_token) == (2, settlement["token"])
    assert messages(attempt) == [f"attempt 2 in process {row_pid(task_id)}"]


def row_pid(task_id: int) -> int:
    return Task.objects.get(pk=task_id).result


# -- where they are shown ------------------------------------------------------------------------

SECRET = "ann.secret@example.com"


@pytest.fixture
def logged_task(pg, keep_logs) -> int:
    """A task whose attempt logged a record with an exception, and three dropped."""
    keep_logs("INFO", records=2)
    task_id = tasks.logs_many.enqueue(4, 0)
    run_once(pg)
    TaskLog.objects.filter(task_id=task_id).update(records=[
        {"time": 1746177243.512, "level": "INFO", "logger": LOGGER,
         "message": f"mailing {SECRET}"},
        {"time": 1746177243.53, "level": "ERROR", "logger": LOGGER,
         "message": "mail refused", "exception": "Traceback (most recent call last):\n"
         "SMTPRecipientsRefused: nope"},
    ])  # fmt: skip
    return task_id


def test_the_task_page_shows_each_attempts_records_and_what_was_dropped(
    admin_client, logged_task
):
    page = admin_client.get(
        reverse("admin:django_pgqueue_task_change", args=[logged_task])
    ).content.decode()

    assert "Attempt 1" in page
    assert f"mailing {SECRET}" in page
    assert "SMTPRecipientsRefused: nope" in page
    assert "2 earlier record(s) dropped" in page
    assert '<tr class="pgqueue-level-error">' in page


def test_with_admin_show_payloads_false_the_task_page_hides_the_records(
    admin_client, logged_task
):
    with override_settings(PGQUEUE={"ADMIN_SHOW_PAYLOADS": False}):
        page = admin_client.get(
            reverse("admin:django_pgqueue_task_change", args=[logged_task])
        ).content.decode()

    assert SECRET not in page
    assert "mail refused" not in page
    assert "Attempt 1" in page and "2 record(s)" in page  # what there is, not what it says
    assert 'hidden (PGQUEUE["ADMIN_SHOW_PAYLOADS"] is False)' in page


def test_the_task_page_shows_no_logs_section_without_task_logs_or_records(admin_client):
    task_id = tasks.logs_two.enqueue(1)

    page = admin_client.get(
        reverse("admin:django_pgqueue_task_change", args=[task_id])
    ).content.decode()

    assert "log records (per attempt)" not in page


def test_pgqueue_status_shows_a_tasks_records_with_task_and_logs(logged_task, capsys):
    call_command("pgqueue_status", "--task", str(logged_task), "--logs")

    out = capsys.readouterr().out
    assert f"task {logged_task}: {tasks.logs_many.name}@1 on queue default" in out
    assert "state: succeeded (attempt 1 of 3)" in out
    assert "attempt 1 (lease " in out and "2 record(s), 2 earlier dropped" in out
    assert f"09:14:03.512 INFO     {LOGGER}: mailing {SECRET}" in out
    assert "      SMTPRecipientsRefused: nope" in out


def test_pgqueue_status_task_json_carries_the_records(logged_task, capsys):
    call_command("pgqueue_status", "--task", str(logged_task), "--logs", "--json")

    shown = json.loads(capsys.readouterr().out)
    assert shown["task"]["id"] == logged_task
    (attempt,) = shown["logs"]
    assert (attempt["attempt"], attempt["dropped"]) == (1, 2)
    assert [r["message"] for r in attempt["records"]] == [f"mailing {SECRET}", "mail refused"]


def test_pgqueue_status_without_logs_shows_the_task_only(logged_task, capsys):
    call_command("pgqueue_status", "--task", str(logged_task))

    out = capsys.readouterr().out
    assert "state: succeeded" in out
    assert SECRET not in out


def test_pgqueue_status_refuses_an_unknown_task_and_logs_without_a_task():
    with pytest.raises(CommandError, match="no task with id 424242"):
        call_command("pgqueue_status", "--task", "424242", "--logs")
    with pytest.raises(CommandError, match="--logs and --database go with --task ID"):
        call_command("pgqueue_status", "--logs")


def test_a_check_warns_when_the_root_loggers_level_is_above_task_logs():
    with override_settings(PGQUEUE={"TASK_LOGS": "INFO"}):
        messages = [m for m in check_settings(None) if m.id == "django_pgqueue.W010"]
    with override_settings(PGQUEUE={"TASK_LOGS": "WARNING"}):
        fine = [m for m in check_settings(None) if m.id == "django_pgqueue.W010"]

    (message,) = messages  # the test settings leave the root logger at WARNING
    assert "TASK_LOGS is 'INFO' and the root logger's level is WARNING" in message.msg
    assert fine == []
