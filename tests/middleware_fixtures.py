"""Task middleware, tasks and a task_started receiver for tests/test_middleware.py.

Worker subprocesses import this module (TASK_MODULES). They run the middleware that
PGQUEUE_TEST_MIDDLEWARE lists (tests/settings.py), and connect the receivers only when
PGQUEUE_TEST_TASK_STARTED is set, so other tests' workers pay for none of it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from django.utils import timezone

from django_pgqueue import TaskContext, task
from django_pgqueue.core.signals import task_started
from django_pgqueue.tasking.middleware import TaskMiddleware
from django_pgqueue.tasking.registry import TaskDefinition
from tests.testapp.models import Run

# What TenantScope sets around a handler, and the handlers below return.
tenant: ContextVar[str | None] = ContextVar("tenant", default=None)


def _run(context: TaskContext, label: str) -> None:
    Run.objects.create(
        task_id=context.task_id,
        attempt=context.attempt,
        label=label,
        pid=os.getpid(),
        started_at=timezone.now(),
    )


# -- enqueue hooks ---------------------------------------------------------------------
class StampTenant(TaskMiddleware):
    """Stamps the enqueuing code's tenant into the task's metadata."""

    def enqueue(self, task: TaskDefinition) -> TaskDefinition:
        return task.using(metadata={**task.options.metadata, "tenant": "acme"})


class ForceUrgent(TaskMiddleware):
    """Forces priority 500 (out of range), past using(): the enqueue must still refuse it."""

    def enqueue(self, task: TaskDefinition) -> TaskDefinition:
        options = dataclasses.replace(task.options, priority=500)
        return dataclasses.replace(task, options=options)


class ForceQueue(TaskMiddleware):
    """Routes every task to the queue "other"."""

    def enqueue(self, task: TaskDefinition) -> TaskDefinition:
        return task.using(queue="other")


# -- execution hooks -------------------------------------------------------------------
class TenantScope(TaskMiddleware):
    """Sets ``tenant`` from the context around sync and async handlers."""

    def execute(self, context: TaskContext, call_next: Callable[[], Any]) -> Any:
        marker = tenant.set(_scope(context))
        try:
            return call_next()
        finally:
            tenant.reset(marker)

    async def aexecute(self, context: TaskContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        marker = tenant.set(_scope(context))
        try:
            return await call_next()
        finally:
            tenant.reset(marker)


def _scope(context: TaskContext) -> str:
    return f"{context.metadata.get('tenant')} task {context.task_id} attempt {context.attempt}"


class Outer(TaskMiddleware):
    def execute(self, context: TaskContext, call_next: Callable[[], Any]) -> Any:
        _run(context, "outer before")
        result = call_next()
        _run(context, "outer after")
        return result


class Inner(TaskMiddleware):
    def execute(self, context: TaskContext, call_next: Callable[[], Any]) -> Any:
        _run(context, "inner before")
        result = call_next()
        _run(context, "inner after")
        return result


class RefuseFirstAttempt(TaskMiddleware):
    """Raises on a task's first attempt, before its handler, in sync and async."""

    def execute(self, context: TaskContext, call_next: Callable[[], Any]) -> Any:
        if context.attempt == 1:
            raise RuntimeError(f"the middleware refused attempt {context.attempt}")
        return call_next()

    async def aexecute(self, context: TaskContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        if context.attempt == 1:
            raise RuntimeError(f"the middleware refused attempt {context.attempt}")
        return await call_next()


class Passthrough(TaskMiddleware):
    """A no-op execution hook (the benchmark's W2a-middleware uses the same)."""

    def execute(self, context: TaskContext, call_next: Callable[[], Any]) -> Any:
        return call_next()


class NotAMiddleware:
    pass


# -- tasks -----------------------------------------------------------------------------
@task(takes_context=True)
def show_metadata(context: TaskContext) -> dict[str, Any]:
    return context.metadata


@task
def show_tenant() -> str | None:
    return tenant.get()


@task
async def async_show_tenant() -> str | None:
    return tenant.get()


@task(takes_context=True)
def mark(context: TaskContext) -> str:
    _run(context, "handler")
    return "done"


# -- task_started ----------------------------------------------------------------------
def on_started(sender: TaskDefinition, **kwargs: Any) -> None:
    Run.objects.create(
        task_id=kwargs["task_id"],
        attempt=kwargs["attempt"],
        label=f"started {sender.name} queue={kwargs['queue']} database={kwargs['database']}",
        pid=os.getpid(),
        started_at=timezone.now(),
    )


def broken_receiver(sender: TaskDefinition, **kwargs: Any) -> None:
    raise RuntimeError("a broken task_started receiver")


if os.environ.get("PGQUEUE_TEST_TASK_STARTED"):
    task_started.connect(broken_receiver)
    task_started.connect(on_started)
