"""PGQUEUE["MIDDLEWARE"]: enqueue hooks in the enqueuing process, execution hooks in
real worker processes (sync and async handlers, thread and process execution), their
order, an exception in a hook as the attempt's outcome, and the task_started signal."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from django_pgqueue import InvalidTaskError
from django_pgqueue.checks import check_settings
from django_pgqueue.models import Task
from django_pgqueue.tasking.workflows import chain
from tests import framework_tasks, tasks
from tests import middleware_fixtures as fixtures
from tests.conftest import wait_until
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

FIXTURES = "tests.middleware_fixtures"


def middleware(*names: str) -> override_settings:
    """The test process's PGQUEUE with these middleware of tests/middleware_fixtures.py."""
    paths = [f"{FIXTURES}.{name}" for name in names]
    return override_settings(PGQUEUE={**settings.PGQUEUE, "MIDDLEWARE": paths})


def worker_env(*names: str, **extra: str) -> dict[str, str]:
    """The environment of a worker running these middleware (tests/settings.py)."""
    return {"PGQUEUE_TEST_MIDDLEWARE": ",".join(f"{FIXTURES}.{n}" for n in names), **extra}


def run_burst(start_worker, *args: str, env: dict[str, str]) -> str:
    worker = start_worker("--burst", *args, wait=False, env=env)
    assert worker.wait(60) == 0, worker.log()
    return worker.log()


# -- enqueue hooks ---------------------------------------------------------------------


def test_an_enqueue_hook_stamps_metadata_that_the_handler_sees_in_its_context(start_worker):
    with middleware("StampTenant"):
        task_id = fixtures.show_metadata.using(metadata={"source": "view"}).enqueue()

    run_burst(start_worker, env={})

    row = Task.objects.get(pk=task_id)
    assert row.state == "succeeded"
    assert row.result == {"source": "view", "tenant": "acme"}


def test_enqueue_hooks_apply_to_enqueue_on_commit_enqueue_many_and_workflows():
    with middleware("StampTenant"):
        with transaction.atomic():
            on_commit = tasks.noop.enqueue_on_commit(1)
        many = tasks.noop.enqueue_many([2, 3])
        steps = chain(tasks.noop.step(4), tasks.noop.step(5))

    tenants = dict(Task.objects.values_list("id", "metadata__tenant"))
    assert {tenants[i] for i in [on_commit, *many, *steps]} == {"acme"}


def test_an_enqueue_hook_applies_to_the_tasks_framework_backend():
    with middleware("StampTenant"):
        result = framework_tasks.add.enqueue(1, 2)

    assert Task.objects.get(pk=int(result.id)).metadata["tenant"] == "acme"


def test_an_enqueue_hook_can_route_a_task_to_another_queue():
    with middleware("ForceQueue"):
        task_id = tasks.noop.enqueue(1)

    assert Task.objects.get(pk=task_id).queue == "other"


def test_an_option_set_by_an_enqueue_hook_is_validated_like_the_callers_and_nothing_is_written():
    with middleware("ForceUrgent"), pytest.raises(InvalidTaskError) as raised:
        tasks.noop.enqueue(1)
    with middleware("ForceUrgent"), pytest.raises(InvalidTaskError):
        tasks.noop.enqueue_many([1, 2])

    assert "priority 500 is out of range" in str(raised.value)
    assert f"{FIXTURES}.ForceUrgent" in str(raised.value)
    assert Task.objects.count() == 0


def test_without_middleware_the_enqueue_is_untouched():
    task_id = tasks.noop.using(metadata={"source": "view"}).enqueue(1)

    row = Task.objects.get(pk=task_id)
    assert row.metadata == {"source": "view"}
    assert row.queue == "default"


# -- execution hooks -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("execution", ["thread", "process"])
def test_an_execution_hook_wraps_sync_and_async_handlers_with_their_context(
    start_worker, execution
):
    with middleware("StampTenant"):
        sync_id = fixtures.show_tenant.enqueue()
        async_id = fixtures.async_show_tenant.enqueue()

    # two slots: in process mode each is a child process that sets Django up
    run_burst(
        start_worker, "--execution", execution, "--concurrency", "2", env=worker_env("TenantScope")
    )

    rows = {row.pk: row for row in Task.objects.all()}
    assert rows[sync_id].state == rows[async_id].state == "succeeded"
    assert rows[sync_id].result == f"acme task {sync_id} attempt 1"
    assert rows[async_id].result == f"acme task {async_id} attempt 1"


def test_middleware_run_in_djangos_order_the_first_listed_outermost(start_worker):
    task_id = fixtures.mark.enqueue()

    run_burst(start_worker, env=worker_env("Outer", "Inner"))

    labels = list(Run.objects.filter(task_id=task_id).values_list("label", flat=True))
    assert labels == ["outer before", "inner before", "handler", "inner after", "outer after"]


@pytest.mark.parametrize("task_name", ["show_tenant", "async_show_tenant"])
def test_an_exception_raised_by_a_hook_fails_the_attempt_and_it_is_retried_like_the_handlers(
    start_worker, task_name
):
    task_id = getattr(fixtures, task_name).enqueue()

    start_worker(env=worker_env("RefuseFirstAttempt"))
    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="succeeded").first())

    assert row.attempt == 2
    assert [(e["attempt"], e["type"]) for e in row.errors] == [(1, "builtins.RuntimeError")]
    assert row.errors[0]["message"] == "the middleware refused attempt 1"


def test_a_worker_refuses_to_start_with_a_middleware_that_does_not_import(start_worker):
    worker = start_worker(wait=False, env=worker_env("Missing"))

    assert worker.wait(60) != 0
    assert "django_pgqueue.E040" in worker.log()


# -- manage.py check ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("Missing", "cannot be imported"),
        ("NotAMiddleware", "not a subclass of django_pgqueue.middleware.TaskMiddleware"),
    ],
)
def test_check_reports_a_middleware_path_that_is_not_a_task_middleware(name, problem):
    with middleware("StampTenant", name):
        messages = [m for m in check_settings(None) if m.id == "django_pgqueue.E040"]

    assert len(messages) == 1
    assert f"{FIXTURES}.{name}" in messages[0].msg
    assert problem in messages[0].msg


# -- task_started ----------------------------------------------------------------------


def test_task_started_is_sent_for_native_tasks_before_the_handler_even_with_a_broken_receiver(
    start_worker,
):
    sync_id = fixtures.mark.enqueue()
    async_id = tasks.async_double.enqueue(2)

    log = run_burst(start_worker, env={"PGQUEUE_TEST_TASK_STARTED": "1"})

    assert Task.objects.filter(pk__in=[sync_id, async_id], state="succeeded").count() == 2
    sync_runs = list(Run.objects.filter(task_id=sync_id).values_list("label", flat=True))
    assert sync_runs == [
        f"started {fixtures.mark.name} queue=default database=default",
        "handler",
    ]
    assert Run.objects.get(task_id=async_id).label == (
        f"started {tasks.async_double.name} queue=default database=default"
    )
    assert "a broken task_started receiver" in log
