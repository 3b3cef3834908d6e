"""Several worker processes (--processes): the supervisor and the fresh child processes it
starts (worker/spawn.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_pgqueue.models import Task
from django_pgqueue.worker import spawn
from tests import tasks
from tests.conftest import WorkerProcess, wait_until
from tests.testapp.models import Run

UNGUARDED_MANAGE = Path(__file__).with_name("unguarded_manage.py")


def _children_started(supervisor: WorkerProcess) -> int:
    return supervisor.log().count(" started: ")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_supervisor_run_by_a_manage_py_without_main_guard_starts_only_the_children_asked_for(
    start_worker,
):
    # given: tasks, and a manage.py that runs its command at import time
    ids = tasks.record.enqueue_many([(f"t{n}",) for n in range(20)])

    # when: it runs a supervisor of two processes, which run the tasks and get SIGTERM
    supervisor = start_worker(
        "--processes", "2", "--shutdown-grace", "5", script=UNGUARDED_MANAGE, wait=False
    )
    wait_until(
        lambda: (
            Task.objects.filter(pk__in=ids, state="succeeded").count() == len(ids)
            or supervisor.proc.poll() is not None
        ),
        timeout=60,
        message="the tasks to succeed",
    )
    wait_until(lambda: _children_started(supervisor) >= 2, timeout=30, message="two children")
    supervisor.signal(signal.SIGTERM)
    code = supervisor.wait(30)

    # then: exactly two children started, they ran everything, and the stop was clean
    log = supervisor.log()
    assert code == 0, log
    assert log.count("started worker process") == 2, log
    assert _children_started(supervisor) == 2, log
    assert Task.objects.filter(pk__in=ids, state="succeeded").count() == len(ids)
    assert len(set(Run.objects.values_list("pid", flat=True))) <= 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_child_that_dies_after_it_started_is_replaced(start_worker):
    # given: a supervisor whose child is running a long task
    task_id = tasks.sleep_and_record.enqueue(60)
    supervisor = start_worker("--processes", "2", "--shutdown-grace", "1")
    run = wait_until(lambda: Run.objects.filter(task_id=task_id).first())
    wait_until(lambda: _children_started(supervisor) == 2, message="two children")

    # when: that child is killed
    os.kill(run.pid, signal.SIGKILL)

    # then: a third child is started in its place and the supervisor carries on
    wait_until(lambda: _children_started(supervisor) == 3, timeout=30, message="a replacement")
    assert f"worker process {run.pid} was killed by SIGKILL" in supervisor.log()
    assert supervisor.proc.poll() is None


@pytest.mark.slow  # five failed starts of a child, 7.5 s of restart backoff between them
@pytest.mark.django_db(transaction=True)
def test_a_supervisor_whose_children_cannot_start_stops_with_their_exit_codes(start_worker):
    # given: the first child's metrics port is taken, so that child fails at every start
    # (the second child's port, one higher, may or may not be free: it does not matter)
    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        began = time.monotonic()

        # when: the supervisor starts
        supervisor = start_worker("--processes", "2", "--metrics-port", str(port), wait=False)
        code = supervisor.wait(90)

    # then: it gave up within a bounded time, saying why and where to look
    log = supervisor.log()
    assert code == 1, log
    assert time.monotonic() - began < 60
    assert "failed to start 5 times in a row (exit codes 1, 1, 1, 1, 1)" in log
    assert "Address already in use" in log


@pytest.fixture
def registration_refused(pg) -> Iterator[str]:
    """The test database refuses every worker registration, with this message."""
    message = "registration refused by the test"
    pg.execute(
        "CREATE FUNCTION pgqueue_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN RAISE EXCEPTION '{message}'; END $$"
    )
    pg.execute(
        "CREATE TRIGGER pgqueue_test_refuse BEFORE INSERT OR UPDATE ON pgqueue_worker "
        "FOR EACH ROW EXECUTE FUNCTION pgqueue_test_refuse()"
    )
    try:
        yield message
    finally:
        pg.execute("DROP TRIGGER pgqueue_test_refuse ON pgqueue_worker")
        pg.execute("DROP FUNCTION pgqueue_test_refuse()")


@pytest.mark.slow  # five failed starts of a child, 7.5 s of restart backoff between them
@pytest.mark.django_db(transaction=True)
def test_a_child_whose_worker_fails_before_it_started_is_a_start_up_failure(
    start_worker, registration_refused
):
    # given: children that set Django up and build their worker, whose run() then fails
    # (the database refuses the registration), before the worker says it started

    # when: the supervisor starts
    supervisor = start_worker("--processes", "2", wait=False)
    code = supervisor.wait(90)

    # then: those were start-up failures, so the supervisor gave up, naming them
    log = supervisor.log()
    assert code == 1, log
    assert "failed to start 5 times in a row (exit codes 1, 1, 1, 1, 1)" in log
    assert registration_refused in log
    assert _children_started(supervisor) == 0


def test_a_child_target_outside_django_pgqueue_is_refused():
    with pytest.raises(ValueError, match="only functions of django_pgqueue"):
        spawn.start_child("os.system", {"command": "true"})


def test_a_child_target_that_is_not_a_function_of_its_module_is_refused():
    # "signal" is a module imported by supervisor.py, not a function defined there.
    with pytest.raises(ValueError, match="not a function defined in"):
        spawn.start_child("django_pgqueue.worker.supervisor.signal", {})


def test_child_kwargs_must_be_json():
    with pytest.raises(TypeError, match="JSON"):
        spawn.start_child("django_pgqueue.worker.supervisor.run_child", {"when": object()})


def test_a_child_refuses_a_target_outside_django_pgqueue_given_on_its_command_line(tmp_path):
    # given: a child command line forged to name another module's function
    mark = tmp_path / "ran"
    argv = spawn._command_line("os.system", {"command": f"touch {mark}"})

    # when: the child runs it
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
    )

    # then: it exits non-zero, says why, and ran nothing
    assert result.returncode == 1
    assert "only functions of django_pgqueue" in result.stderr
    assert not mark.exists()
