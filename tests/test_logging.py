"""Logging and error reporting: a failed attempt is a WARNING and a dead letter an ERROR,
each with the handler's exception, so Sentry's logging integration reports dead letters
(and only those) with the handler's traceback, in thread and in process execution; the
worker's records carry the task's fields; ``--log-format json`` writes one JSON object
per line; ``--log-level`` wins over LOGGING only when given."""

from __future__ import annotations

import json
import logging
import re
import signal
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_pgqueue.models import Task
from django_pgqueue.worker.execution import execute
from django_pgqueue.worker.logging import ExecutionFilter, configure_logging
from tests import sentry_capture, tasks
from tests.conftest import wait_until
from tests.sqlhelpers import claim
from tests.test_executions import settle_with_worker

pytestmark = pytest.mark.django_db(transaction=True)

FAIL_ALWAYS = "tests.tasks.fail_always"


def failed_for_good(task_id: int) -> bool:
    return Task.objects.filter(pk=task_id, state="failed").exists()


def settlement_records(caplog: pytest.LogCaptureFixture, task_id: int) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "django_pgqueue.worker" and getattr(r, "task_id", None) == task_id
    ]


# -- levels and fields, with the settler driven in this process ----------------------------


def test_a_failed_attempt_that_will_be_retried_is_logged_at_warning_with_its_exception(
    pg, caplog
):
    task_id = tasks.fail_always.enqueue("kaput")
    (claimed,) = claim(pg, worker_id="w-a")
    outcome = execute(claimed, "default", None)

    with caplog.at_level(logging.DEBUG, logger="django_pgqueue"):
        settle_with_worker(outcome, worker_id="w-a")

    (record,) = settlement_records(caplog, task_id)
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith("failure -> scheduled")  # after the backoff
    exc_type, exc, tb = record.exc_info
    assert (exc_type, str(exc)) == (ValueError, "kaput on attempt 1")
    assert "fail_always" in [frame.name for frame in traceback.extract_tb(tb)]


def test_a_dead_letter_is_logged_at_error_with_the_tasks_fields(pg, caplog):
    task_id = tasks.fail_always.using(max_attempts=1).enqueue("kaput")
    (claimed,) = claim(pg, worker_id="w-a")
    outcome = execute(claimed, "default", None)

    with caplog.at_level(logging.DEBUG, logger="django_pgqueue"):
        settle_with_worker(outcome, worker_id="w-a")

    (record,) = settlement_records(caplog, task_id)
    assert record.levelno == logging.ERROR
    assert isinstance(record.exc_info[1], ValueError)
    assert (
        record.task_name,
        record.queue,
        record.attempt,
        record.outcome,
        record.state,
        record.worker,
        record.database,
    ) == (FAIL_ALWAYS, "default", 1, "failure", "failed", "w-a", "default")
    assert record.duration >= 0


def test_a_success_is_logged_at_debug_only(pg, caplog):
    task_id = tasks.noop.enqueue(1)
    (claimed,) = claim(pg, worker_id="w-a")
    outcome = execute(claimed, "default", None)

    with caplog.at_level(logging.DEBUG, logger="django_pgqueue"):
        settle_with_worker(outcome, worker_id="w-a")

    (record,) = settlement_records(caplog, task_id)
    assert (record.levelno, record.exc_info, record.outcome) == (logging.DEBUG, None, "success")


def test_the_exception_is_never_part_of_the_stored_row(pg):
    tasks.fail_always.using(max_attempts=1).enqueue("kaput")
    (claimed,) = claim(pg, worker_id="w-a")

    outcome = execute(claimed, "default", None)

    assert isinstance(outcome.exc, ValueError)
    assert "exc" not in outcome.as_row() and "exc" not in outcome.as_row()["error"]
    json.dumps(outcome.as_row())  # the row stays JSON


def test_records_the_handler_emits_carry_its_tasks_fields(pg, caplog):
    task_id = tasks.logs_a_line.enqueue()
    (claimed,) = claim(pg, worker_id="w-a")
    handler_logger = logging.getLogger("tests.tasks")
    log_filter = ExecutionFilter()
    handler_logger.addFilter(log_filter)
    try:
        with caplog.at_level(logging.INFO, logger="tests.tasks"):
            execute(claimed, "default", None)
    finally:
        handler_logger.removeFilter(log_filter)

    (record,) = [r for r in caplog.records if r.name == "tests.tasks"]
    assert (record.task_id, record.task_name, record.queue, record.attempt) == (
        task_id,
        "tests.tasks.logs_a_line",
        "default",
        1,
    )


# -- configure_logging: --log-level and LOGGING ------------------------------------------


@pytest.fixture
def pgqueue_loggers() -> Iterator[tuple[logging.Logger, logging.Logger]]:
    """The django_pgqueue loggers, their levels restored afterwards."""
    loggers = (logging.getLogger("django_pgqueue"), logging.getLogger("django_pgqueue.worker"))
    levels = [lg.level for lg in loggers]
    yield loggers
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)


def test_without_log_level_the_level_logging_set_stays(pgqueue_loggers):
    pgqueue, _ = pgqueue_loggers
    pgqueue.setLevel(logging.WARNING)  # as LOGGING would

    configure_logging(None)

    assert pgqueue.level == logging.WARNING


def test_without_log_level_or_a_level_in_logging_the_level_is_info(pgqueue_loggers):
    pgqueue, _ = pgqueue_loggers
    pgqueue.setLevel(logging.NOTSET)

    configure_logging(None)

    assert pgqueue.level == logging.INFO


def test_a_given_log_level_wins_over_the_levels_logging_set(pgqueue_loggers):
    pgqueue, worker = pgqueue_loggers
    pgqueue.setLevel(logging.WARNING)
    worker.setLevel(logging.ERROR)

    configure_logging("DEBUG")

    assert worker.getEffectiveLevel() == logging.DEBUG


# -- real workers --------------------------------------------------------------------------


def test_without_log_level_a_worker_keeps_the_level_logging_sets(start_worker):
    worker = start_worker(wait=False, env={"PGQUEUE_TEST_LOGGING_LEVEL": "WARNING"})
    task_id = tasks.fail_always.enqueue("kaput")
    wait_until(lambda: failed_for_good(task_id), timeout=30, message="the dead letter")
    wait_until(lambda: "failure -> failed" in worker.log(), message="the dead letter's line")
    worker.stop()

    log = worker.log()
    assert re.search(r" WARNING .*failure -> scheduled", log)  # a retried attempt
    assert " started: " not in log  # INFO, below LOGGING's WARNING


def test_a_log_level_given_on_the_command_line_wins_over_logging(start_worker):
    worker = start_worker("--log-level", "INFO", env={"PGQUEUE_TEST_LOGGING_LEVEL": "WARNING"})

    assert " started: " in worker.log()  # wait_started saw the INFO line


@pytest.mark.slow
@pytest.mark.parametrize("execution", ["thread", "process"])
def test_log_format_json_writes_one_json_object_per_line_with_the_tasks_fields(
    start_worker, execution: str
):
    worker = start_worker(
        "--log-format",
        "json",
        "--execution",
        execution,
        "--concurrency",
        "1",
        env={"PGQUEUE_TEST_LOGGING": "no-handlers"},
    )
    failing = tasks.fail_always.enqueue("kaput")
    talking = tasks.logs_a_line.enqueue()
    wait_until(lambda: failed_for_good(failing), timeout=30, message="the dead letter")
    wait_until(lambda: "failure -> failed" in worker.log(), message="the dead letter's line")
    worker.stop()

    lines = [json.loads(line) for line in worker.log().splitlines() if line.strip()]
    (dead,) = [e for e in lines if e.get("task_id") == failing and e["level"] == "ERROR"]
    assert {k: dead[k] for k in ("logger", "task_name", "queue", "attempt", "outcome")} == {
        "logger": "django_pgqueue.worker",
        "task_name": FAIL_ALWAYS,
        "queue": "default",
        "attempt": 3,
        "outcome": "failure",
    }
    assert dead["state"] == "failed" and dead["database"] == "default" and dead["worker"]
    assert isinstance(dead["duration"], float) and dead["timestamp"]
    assert "ValueError: kaput on attempt 3" in dead["exception"]
    assert "in fail_always" in dead["exception"]
    retried = [e for e in lines if e.get("task_id") == failing and e["level"] == "WARNING"]
    assert [e["attempt"] for e in retried] == [1, 2]
    (said,) = [e for e in lines if e["message"] == "hello from the handler"]
    assert (said["logger"], said["task_id"], said["attempt"]) == ("tests.tasks", talking, 1)


# -- Sentry, in the worker's process ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("execution", ["thread", "process"])
def test_a_dead_letter_reaches_sentry_as_one_error_event_with_the_handlers_traceback(
    start_worker, tmp_path: Path, execution: str
):
    events_file = tmp_path / "sentry-events.jsonl"
    worker = start_worker(
        "--execution",
        execution,
        "--concurrency",
        "1",
        env={sentry_capture.SENTRY_EVENTS_ENV: str(events_file)},
    )
    task_id = tasks.fail_always.enqueue("kaput")  # 3 attempts: 2 retried, 1 dead letter
    wait_until(lambda: failed_for_good(task_id), timeout=30, message="the dead letter")
    wait_until(lambda: "failure -> failed" in worker.log(), message="the dead letter's line")
    worker.stop()

    events = [
        e
        for e in sentry_capture.read(events_file)
        if e.get("extra", {}).get("task_id") == task_id
    ]
    (event,) = events  # the retried attempts (WARNING) are no events
    assert event["level"] == "error"
    assert {k: event["extra"][k] for k in ("task_name", "queue", "attempt", "outcome")} == {
        "task_name": FAIL_ALWAYS,
        "queue": "default",
        "attempt": 3,
        "outcome": "failure",
    }
    exception = event["exception"]["values"][-1]
    assert (exception["type"], exception["value"]) == ("ValueError", "kaput on attempt 3")
    frames = exception["stacktrace"]["frames"]
    handler = [f for f in frames if f["function"] == "fail_always"]
    assert handler and handler[-1]["module"] == "tests.tasks"
    assert "raise ValueError" in handler[-1]["context_line"]


# -- a normal life, as an operator reads it ------------------------------------------------

# What a worker says at INFO and above through a start, an idle spell, a task that
# succeeds, and a Ctrl-C that finds a task still running: each line plain, nothing about
# the worker's internals (those are at DEBUG).
NORMAL_LIFE = [
    r"INFO worker (?P<worker>\S+) started: queues default; 2 slots; \d+ task\(s\): "
    r"tests\.\S+(, tests\.\S+)*",
    r"INFO SIGTERM: stopping\. No new task is claimed; running tasks get up to 1s to "
    r"finish \(another signal exits at once\)",
    r"WARNING task (?P<task>\d+) \(tests\.tasks\.just_sleep\) attempt 1 lease \w{8} was "
    r"still running after the 1s shutdown grace: released, to run again on the next free "
    r"worker; "
    r"this attempt counts \(1 of 3 used\)",
    r"INFO task (?P=task) \(tests\.tasks\.just_sleep\) attempt 1 lease \w{8}: released -> "
    r"scheduled",
    r"INFO worker (?P=worker) stopped: 2 task\(s\) claimed; success=1 released=1",
]


@pytest.mark.slow
def test_a_normal_start_idle_and_stop_log_only_plain_lines_at_info(start_worker):
    # given: a worker that runs one task, then idles while a long one runs
    worker = start_worker("--concurrency", "2", "--shutdown-grace", "1")
    done = tasks.noop.enqueue(1)
    long = tasks.just_sleep.enqueue(60)
    wait_until(lambda: Task.objects.filter(pk=done, state="succeeded").exists())
    wait_until(lambda: Task.objects.filter(pk=long, state="running").exists())

    # when: it is stopped (Ctrl-C / SIGTERM) with the long task still running
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()

    # then: these lines and no other, in this order
    # (tests/settings.py's format: date, time, level, pid, message)
    records = [re.fullmatch(r"\S+ \S+ (\w+) \d+ (.*)", line) for line in worker.log().splitlines()]
    lines = [f"{r[1]} {r[2]}" for r in records if r is not None]
    assert re.fullmatch("\n".join(NORMAL_LIFE), "\n".join(lines)), "\n".join(lines)
