"""A Celery project ported by its imports (tests/celery_project), run by real workers.

The workers start with the project's own settings module
(``DJANGO_SETTINGS_MODULE=tests.celery_project.proj.settings``): its ``proj/__init__.py``
imports ``proj/celery.py`` while the settings load, as Celery's Django layout does. The
tasks are Celery's documentation's (bind + retry, autoretry with backoff, canvas, beat
entries, signals); this process calls them as the project's views would.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from django_pgqueue.celery import AsyncResult, TaskRevokedError, chain, chord, group
from django_pgqueue.celery import states as celery_states
from django_pgqueue.celery.exceptions import MaxRetriesExceededError
from django_pgqueue.models import Schedule, Task
from tests import ledger
from tests.celery_project.proj import celery as proj_celery
from tests.celery_project.proj import settings as proj_settings
from tests.celery_project.shop import tasks
from tests.celery_project.shop.services import RequestException, Twitter
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PROJECT = {"DJANGO_SETTINGS_MODULE": "tests.celery_project.proj.settings"}
TIMEOUT = 30


@pytest.fixture(autouse=True)
def celery_settings(settings):
    """This process reads the project's Celery settings too (routes, priorities)."""
    for name in dir(proj_settings):
        if name.startswith("CELERY_"):
            setattr(settings, name, getattr(proj_settings, name))


@pytest.fixture
def ledger_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    path.touch()
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    return path


@pytest.fixture
def project_worker(start_worker, ledger_file):
    """Start a worker of the Celery project (queues default and emails)."""

    def start(*args: str):
        return start_worker("--queues", "default,emails", "--concurrency", "4", *args,
                            env=PROJECT)  # fmt: skip

    return start


def calls(path: Path, label: str) -> list[dict]:
    return [e for e in ledger.read(path) if e["event"] == "call" and e["label"] == label]


def signals(path: Path, task_id: str) -> list[dict]:
    return [e for e in ledger.read(path) if e["event"] == "signal" and e["task_id"] == task_id]


def row(result: AsyncResult) -> Task:
    return Task.objects.get(pk=int(result.id))


# -- the app -------------------------------------------------------------------------
def test_the_project_layout_starts_a_worker_that_runs_its_tasks(project_worker):
    worker = project_worker()
    result = tasks.add.delay(2, 3)
    assert result.get(timeout=TIMEOUT) == 5
    assert result.state == celery_states.SUCCESS and result.successful() and result.ready()
    assert row(result).task_name == "tests.celery_project.shop.tasks.add"
    # the app's own task in proj/celery.py, declared while the settings loaded
    assert proj_celery.debug_task.delay().get(timeout=TIMEOUT) is None
    assert "Traceback" not in worker.log()


def test_task_routes_send_a_task_to_its_queue(project_worker):
    project_worker()
    result = tasks.send_welcome_email.delay(7)
    assert row(result).queue == "emails"
    assert result.get(timeout=TIMEOUT) == "welcome 7"


def test_send_task_by_name_runs_the_registered_task(project_worker):
    project_worker()
    result = proj_celery.app.send_task("tests.celery_project.shop.tasks.mul", (6, 7))
    assert result.get(timeout=TIMEOUT) == 42


# -- bind, retry, autoretry ----------------------------------------------------------
def test_a_bound_task_sees_its_request(project_worker):
    project_worker()
    result = tasks.dump_context.apply_async((1, 2), {"z": 3}, headers={"trace": "abc"})
    assert result.get(timeout=TIMEOUT) == {
        "id": result.id,
        "retries": 0,
        "args": [1, 2],
        "kwargs": {"z": 3},
        "routing_key": "default",
        "headers": {"trace": "abc"},
        "is_eager": False,
    }


def test_self_retry_runs_the_task_again_until_it_succeeds(project_worker, ledger_file):
    project_worker()
    result = tasks.send_twitter_status.delay({"fail": 2}, "retry-ok")
    assert result.get(timeout=TIMEOUT) == "posted retry-ok"
    assert len(calls(ledger_file, "retry-ok")) == 3
    assert result.retries == 2
    errors = row(result).errors
    assert [e["message"] for e in errors] == [
        "Retry in 0.1s: tests.celery_project.shop.services.Twitter.FailWhaleError: "
        "over capacity (retry-ok)"
    ] * 2


def test_past_max_retries_the_task_fails_with_the_exception_it_retried(
    project_worker, ledger_file
):
    project_worker()
    result = tasks.send_twitter_status.delay({"fail": 99}, "retry-spent")
    with pytest.raises(Twitter.FailWhaleError, match="over capacity"):
        result.get(timeout=TIMEOUT)
    assert result.state == celery_states.FAILURE and result.failed()
    assert len(calls(ledger_file, "retry-spent")) == 4  # max_retries=3: 1 + 3
    assert "FailWhaleError: over capacity" in result.traceback


def test_max_retries_exceeded_can_be_caught_by_the_task(project_worker, ledger_file):
    project_worker()
    result = tasks.give_up_politely.delay({"fail": 99}, "polite")
    assert result.get(timeout=TIMEOUT) == "gave up"
    assert len(calls(ledger_file, "polite")) == 2


def test_a_retry_without_exc_past_max_retries_fails_with_max_retries_exceeded(project_worker):
    project_worker()
    result = tasks.retry_without_exc.delay({"fail": 99}, "no-exc")
    with pytest.raises(MaxRetriesExceededError, match="Can't retry"):
        result.get(timeout=TIMEOUT)


def test_an_exception_fails_the_task_at_once_as_in_celery(project_worker):
    project_worker()
    result = tasks.fail.delay("boom")
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=TIMEOUT)
    assert row(result).attempt == 1
    assert "ValueError: boom" in result.traceback
    assert isinstance(result.get(timeout=1, propagate=False), ValueError)


@pytest.mark.slow
def test_autoretry_for_retries_with_celerys_backoff(project_worker, ledger_file):
    project_worker()
    result = tasks.refresh_timeline.delay("https://example.com/u1", fail=2)
    assert result.get(timeout=TIMEOUT) == "<html>https://example.com/u1</html>"
    assert len(calls(ledger_file, "https://example.com/u1")) == 3
    # retry_backoff=True, retry_backoff_max=1, retry_jitter: 0 or 1 s each time
    for error in row(result).errors:
        delay, kind = re.match(r"Retry in (\S+)s: (\S+):", error["message"]).groups()
        assert float(delay) in (0.0, 1.0)
        assert kind == "tests.celery_project.shop.services.RequestException"


def test_autoretry_past_its_retry_kwargs_max_retries_fails(project_worker, ledger_file):
    project_worker()
    result = tasks.refresh_timeline.delay("https://example.com/down", fail=99)
    with pytest.raises(RequestException):
        result.get(timeout=TIMEOUT)
    assert len(calls(ledger_file, "https://example.com/down")) == 6  # max_retries=5


def test_dont_autoretry_for_fails_at_once(project_worker):
    project_worker()
    result = tasks.read_feed.delay("/missing")
    with pytest.raises(FileNotFoundError):
        result.get(timeout=TIMEOUT)
    assert row(result).attempt == 1


@pytest.mark.slow
def test_ignore_result_stores_no_result(project_worker):
    project_worker()
    result = tasks.fire_and_forget.delay(5)
    assert result.get(timeout=TIMEOUT) is None
    assert result.state == celery_states.SUCCESS


# -- results -------------------------------------------------------------------------
def test_a_running_task_reads_started_then_its_custom_state(project_worker, ledger_file):
    project_worker()
    result = tasks.long_report.delay(0, "started")
    wait_until(lambda: result.state == celery_states.STARTED, TIMEOUT, message="STARTED")
    progress = tasks.long_report.delay(3, "progress")
    wait_until(lambda: progress.state == "PROGRESS", TIMEOUT, message="PROGRESS")
    wait_until(lambda: progress.info == {"current": 3, "total": 3}, TIMEOUT, message="3 of 3")
    assert not progress.ready()
    ledger.append(ledger_file, {"event": "release", "label": "started"})
    ledger.append(ledger_file, {"event": "release", "label": "progress"})
    assert result.get(timeout=TIMEOUT) == progress.get(timeout=TIMEOUT) == "done"
    assert progress.state == celery_states.SUCCESS


@pytest.mark.slow
def test_revoke_terminate_kills_a_running_task(project_worker):
    project_worker("--execution", "process", "--heartbeat", "0.2")
    result = tasks.long_report.delay(0, "never-released")
    wait_until(lambda: result.state == celery_states.STARTED, TIMEOUT, message="STARTED")
    result.revoke(terminate=True)
    with pytest.raises(TaskRevokedError):
        result.get(timeout=TIMEOUT)
    assert result.state == celery_states.REVOKED


def test_forget_deletes_the_row_of_a_finished_task(project_worker):
    project_worker()
    result = tasks.add.delay(1, 1)
    assert result.get(timeout=TIMEOUT) == 2
    result.forget()
    assert not Task.objects.filter(pk=int(result.id)).exists()
    assert result.state == celery_states.PENDING  # as an expired result in Celery


# -- canvas --------------------------------------------------------------------------
def test_a_chain_passes_each_result_to_the_next_step(project_worker):
    project_worker()
    result = (tasks.add.s(2, 2) | tasks.mul.s(4) | tasks.mul.s(8)).apply_async()
    assert result.get(timeout=TIMEOUT) == 128
    assert result.parent.get(timeout=TIMEOUT) == 16
    assert result.parent.parent.get(timeout=TIMEOUT) == 4


def test_an_immutable_signature_ignores_its_parents_result(project_worker):
    project_worker()
    assert chain(tasks.add.s(1, 1), tasks.add.si(5, 5))().get(timeout=TIMEOUT) == 10


def test_a_group_returns_its_results_in_order(project_worker):
    project_worker()
    result = group(tasks.add.s(i, i) for i in range(10))()
    assert result.get(timeout=TIMEOUT) == [i + i for i in range(10)]
    assert result.ready() and result.successful() and result.completed_count() == 10


def test_a_chord_callback_runs_once_with_every_result(project_worker):
    project_worker()
    result = chord(tasks.add.s(i, i) for i in range(10))(tasks.xsum.s())
    assert result.get(timeout=TIMEOUT) == 90
    assert Task.objects.filter(task_name="tests.celery_project.shop.tasks.xsum").count() == 1
    assert result.parent.get(timeout=TIMEOUT) == [i + i for i in range(10)]


def test_a_group_piped_into_a_task_is_a_chord(project_worker):
    project_worker()
    workflow = tasks.add.s(1, 1) | group(tasks.mul.s(i) for i in (1, 2, 3)) | tasks.xsum.s()
    assert workflow.apply_async().get(timeout=TIMEOUT) == 12  # 2 * (1 + 2 + 3)


def test_a_chain_stops_at_a_failed_step(project_worker):
    project_worker()
    result = (tasks.fail.s("first") | tasks.add.s(1)).apply_async()
    with pytest.raises(TaskRevokedError):
        result.get(timeout=TIMEOUT)
    with pytest.raises(ValueError, match="first"):
        result.parent.get(timeout=TIMEOUT)


def test_link_runs_a_callback_with_the_result(project_worker):
    project_worker()
    tasks.add.apply_async((2, 2), link=tasks.mul.s(10))
    linked = Task.objects.get(task_name="tests.celery_project.shop.tasks.mul")
    assert AsyncResult(linked.id).get(timeout=TIMEOUT) == 40


def test_link_error_runs_an_errback_with_request_exc_and_traceback(project_worker):
    project_worker()
    failed = tasks.fail.apply_async(("bad",), link_error=tasks.on_error.s())
    errback = Task.objects.get(task_name="tests.celery_project.shop.tasks.on_error")
    assert AsyncResult(errback.id).get(timeout=TIMEOUT) == {
        "task": failed.id, "exc": "ValueError: bad", "traceback": True,
    }  # fmt: skip
    old = tasks.fail.apply_async(("old",), link_error=tasks.on_error_old_style.s())
    errback = Task.objects.get(task_name="tests.celery_project.shop.tasks.on_error_old_style")
    assert AsyncResult(errback.id).get(timeout=TIMEOUT) == {"task": old.id}


def test_link_error_of_a_task_that_succeeds_does_not_run(project_worker):
    project_worker()
    ok = tasks.add.apply_async((1, 2), link_error=tasks.on_error.s())
    errback = Task.objects.get(task_name="tests.celery_project.shop.tasks.on_error")
    assert ok.get(timeout=TIMEOUT) == 3
    with pytest.raises(TaskRevokedError, match="succeeded"):
        AsyncResult(errback.id).get(timeout=TIMEOUT)


# -- beat ----------------------------------------------------------------------------
@pytest.mark.slow
def test_beat_entries_are_fired_by_the_workers(project_worker):
    project_worker()

    def ran(name: str, args: list) -> int:
        return Task.objects.filter(task_name=name, args=args, state="succeeded").count()

    wait_until(lambda: ran("tests.celery_project.shop.tasks.add", [16, 16]) >= 2, TIMEOUT,
               message="two ticks of add-every-second")  # fmt: skip
    wait_until(lambda: ran("tests.celery_project.proj.celery.ping", ["hello"]) >= 1, TIMEOUT,
               message="a tick of add_periodic_task's 'ping every 2'")  # fmt: skip
    tick = Task.objects.filter(task_name="tests.celery_project.shop.tasks.add").first()
    assert tick.result == 32 and tick.metadata["schedule"] == "add-every-second"
    wait_until(lambda: Schedule.objects.filter(name="report-monday-morning").exists(), TIMEOUT)
    report = Schedule.objects.get(name="report-monday-morning")
    assert (report.spec, report.timezone) == ("30 7 * * 1", "Europe/Paris")


# -- signals -------------------------------------------------------------------------
def test_the_task_signals_reach_the_projects_receivers(project_worker, ledger_file):
    project_worker()
    ok = tasks.add.delay(4, 4)
    bad = tasks.fail.delay("signal")
    retried = tasks.send_twitter_status.delay({"fail": 1}, "signal-retry")
    assert ok.get(timeout=TIMEOUT) == 8
    with pytest.raises(ValueError):
        bad.get(timeout=TIMEOUT)
    retried.get(timeout=TIMEOUT)
    seen = {e["signal"]: e for e in signals(ledger_file, ok.id)}
    assert seen["task_prerun"] == {**seen["task_prerun"], "task": tasks.add.name,
                                   "args": [4, 4], "same": True}  # fmt: skip
    assert seen["task_success"]["result"] == "8"
    assert (seen["task_postrun"]["state"], seen["task_postrun"]["retval"]) == ("SUCCESS", "8")
    failure = {e["signal"]: e for e in signals(ledger_file, bad.id)}
    assert failure["task_failure"]["exception"] == "ValueError('signal')"
    assert failure["task_failure"]["has_traceback"]
    assert failure["task_failure"]["einfo"] == "ValueError"
    assert failure["task_postrun"]["state"] == "FAILURE"
    retry = [e for e in signals(ledger_file, retried.id) if e["signal"] == "task_retry"]
    assert [e["retries"] for e in retry] == [0]
    assert "over capacity (signal-retry)" in retry[0]["reason"]


def test_custom_headers_from_before_task_publish_reach_the_request(project_worker):
    from django_pgqueue.celery.signals import before_task_publish

    def add_header(sender=None, headers=None, **kwargs):
        headers["tenant"] = "acme"

    before_task_publish.connect(add_header, sender=tasks.dump_context.name)
    try:
        project_worker()
        result = tasks.dump_context.delay(1, 2)
    finally:
        before_task_publish.disconnect(add_header, sender=tasks.dump_context.name)
    assert result.get(timeout=TIMEOUT)["headers"] == {"tenant": "acme"}

