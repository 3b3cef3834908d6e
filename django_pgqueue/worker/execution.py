"""Running one claimed task and turning what the handler did into an Outcome.

Handlers never touch the queue row: they return, or raise, and the settler writes the
consequence. This module decides that consequence (success, retry with backoff, dead
letter, snooze, continue, cancel), using the retry policy frozen on the row.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from django_pgqueue.context import TaskContext
from django_pgqueue.exceptions import (
    Cancelled,
    Continue,
    InvalidTaskError,
    LeaseLost,
    Retry,
    Snooze,
    TaskNotRegistered,
)
from django_pgqueue.payload import check_json
from django_pgqueue.registry import TaskDefinition, registry
from django_pgqueue.retry import RetryPolicy

logger = logging.getLogger("django_pgqueue.worker")


@dataclass
class ClaimedTask:
    """A row as the claim returned it, plus the worker's bookkeeping."""

    id: int
    task_name: str
    handler_version: int
    queue: str
    priority: int
    args: list[Any]
    kwargs: dict[str, Any]
    attempt: int
    max_attempts: int
    retry_policy_json: str
    timeout: float | None
    lease_token: str
    lease_expires_at: datetime
    claimed_at: datetime
    enqueued_at: datetime
    run_at: datetime
    checkpoint_json: str | None
    cancel_requested: bool
    metadata_json: str
    received_monotonic: float = field(default_factory=time.monotonic)
    context: TaskContext | None = None

    @classmethod
    def from_row(cls, row: tuple) -> ClaimedTask:
        return cls(*row)

    # Rarely needed columns arrive as JSON text and are parsed on first use.
    @property
    def retry_policy(self) -> dict[str, float]:
        return json.loads(self.retry_policy_json) if self.retry_policy_json else {}

    @property
    def checkpoint(self) -> Any:
        return json.loads(self.checkpoint_json) if self.checkpoint_json else None

    @property
    def metadata(self) -> dict[str, Any]:
        return json.loads(self.metadata_json) if self.metadata_json else {}

    @property
    def deadline(self) -> datetime | None:
        if self.timeout is None:
            return None
        return self.claimed_at + timedelta(seconds=self.timeout)

    @property
    def deadline_monotonic(self) -> float | None:
        """The watchdog's deadline on this process's monotonic clock.

        The handler's deadline is the claim's database now() plus the timeout
        (``deadline``). The claim's result arrives one round trip after that stamp, and
        the watchdog starts counting then: at most a round trip of extra budget, and no
        dependence on the worker's wall clock being in step with the database's.
        """
        if self.timeout is None:
            return None
        return self.received_monotonic + self.timeout

    def fence(self) -> dict[str, Any]:
        return {"id": self.id, "attempt": self.attempt, "token": self.lease_token}


# The labels of the outcomes counter (metrics and logs).
SUCCESS = "success"
FAILURE = "failure"
TIMEOUT = "timeout"
LOST = "lost"
CANCELLED = "cancelled"
CONTINUED = "continued"
SNOOZED = "snoozed"
RELEASED = "released"


@dataclass
class Outcome:
    """What to write about one claimed task; the settler applies it, fenced."""

    task: ClaimedTask
    label: str
    state: str
    result: Any = None
    error: dict[str, Any] | None = None
    delay: float | None = None
    attempt_reset: bool = False
    attempt_refund: bool = False
    checkpoint: Any = None
    save_checkpoint: bool = False
    runtime: float | None = None

    def as_row(self) -> dict[str, Any]:
        t = self.task
        return {
            "id": t.id,
            "attempt": t.attempt,
            "token": t.lease_token,
            "state": self.state,
            "result": self.result,
            "error": self.error,
            "delay": self.delay,
            "attempt_reset": self.attempt_reset,
            "attempt_refund": self.attempt_refund,
            "checkpoint": self.checkpoint,
            "save_checkpoint": self.save_checkpoint,
        }


def error_entry(task: ClaimedTask, exc: BaseException, kind: str | None = None) -> dict[str, Any]:
    return {
        "attempt": task.attempt,
        "type": kind or f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def failed(
    task: ClaimedTask,
    error: dict[str, Any],
    label: str = FAILURE,
    retry_delay: float | None = None,
    retryable: bool = True,
) -> Outcome:
    """A failed attempt: back to pending after the backoff, or dead-lettered if spent."""
    error = {**error, "outcome": label}
    if retryable and task.attempt < task.max_attempts:
        if retry_delay is None:
            retry_delay = RetryPolicy.from_value(task.retry_policy or {}).delay(task.attempt)
        return Outcome(task, label, "pending", error=error, delay=retry_delay)
    return Outcome(task, label, "failed", error=error)


def released(task: ClaimedTask) -> Outcome:
    """Shutdown gave up on a running handler: hand the task back, attempt not refunded.

    On the final attempt there is nothing to hand back to; the task dead-letters with an
    error saying why, so the dead letter is never unexplained.
    """
    if task.attempt >= task.max_attempts:
        error = {
            "attempt": task.attempt,
            "type": "WorkerShutdown",
            "message": "the worker shut down while the final attempt was running",
            "traceback": None,
            "outcome": RELEASED,
        }
        return Outcome(task, RELEASED, "failed", error=error)
    return Outcome(task, RELEASED, "pending", delay=0)


def timed_out(task: ClaimedTask, message: str) -> Outcome:
    error = {"attempt": task.attempt, "type": "TimeoutError", "message": message, "traceback": None}
    return failed(task, error, label=TIMEOUT)


class AsyncRunner:
    """One event loop on its own thread; ``async def`` handlers run there."""

    def __init__(self) -> None:
        import threading

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="pgqueue-asyncio", daemon=True
        )
        self._thread.start()

    def run(self, coro: Any, timeout: float | None) -> Any:
        async def bounded() -> Any:
            # Async handlers reach the ORM through sync_to_async, whose connections
            # live in asgiref's thread: recycle those like a request would.
            await sync_to_async(close_old_connections)()
            try:
                if timeout is None:
                    return await coro
                return await asyncio.wait_for(coro, timeout)
            finally:
                await sync_to_async(close_old_connections)()

        return asyncio.run_coroutine_threadsafe(bounded(), self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


def make_context(task: ClaimedTask, database: str) -> TaskContext:
    context = TaskContext(
        task_id=task.id,
        task_name=task.task_name,
        queue=task.queue,
        attempt=task.attempt,
        max_attempts=task.max_attempts,
        enqueued_at=task.enqueued_at,
        claimed_at=task.claimed_at,
        deadline=task.deadline,
        checkpoint=task.checkpoint,
        metadata=task.metadata,
        lease_token=task.lease_token,
        database=database,
    )
    context._cancel_requested = task.cancel_requested
    return context


def execute(task: ClaimedTask, database: str, async_runner: AsyncRunner | None) -> Outcome:
    """Run the handler of ``task`` and return the outcome to settle. Never raises."""
    try:
        definition = registry.get(task.task_name)
    except TaskNotRegistered as exc:  # the claim filters on routes; defensive only
        return failed(task, error_entry(task, exc), retryable=False)
    if definition.takes_context:
        task.context = make_context(task, database)
        call_args = [task.context, *task.args]
    else:
        call_args = task.args

    close_old_connections()
    started = time.monotonic()
    try:
        result = _invoke(definition, task, call_args, async_runner)
        runtime = time.monotonic() - started
        try:
            result = check_json(result, "result")
        except InvalidTaskError as exc:
            return failed(task, error_entry(task, exc), retryable=False)
        return Outcome(task, SUCCESS, "succeeded", result=result, runtime=runtime)
    except Snooze as exc:
        return Outcome(task, SNOOZED, "pending", delay=exc.delay, attempt_refund=True)
    except Continue as exc:
        try:
            checkpoint = check_json(exc.checkpoint, "checkpoint")
        except InvalidTaskError as bad:
            return failed(task, error_entry(task, bad), retryable=False)
        return Outcome(
            task,
            CONTINUED,
            "pending",
            delay=0,
            attempt_reset=True,
            checkpoint=checkpoint,
            save_checkpoint=exc.checkpoint is not None,
        )
    except Cancelled as exc:
        error = {**error_entry(task, exc, "Cancelled"), "outcome": CANCELLED}
        return Outcome(task, CANCELLED, "cancelled", error=error)
    except Retry as exc:
        return failed(task, error_entry(task, exc), retry_delay=exc.delay)
    except LeaseLost as exc:
        return failed(task, error_entry(task, exc), label=LOST)
    except TimeoutError as exc:
        deadline = task.deadline_monotonic
        if deadline is not None and time.monotonic() >= deadline - 0.01:
            return timed_out(task, f"the attempt exceeded its timeout of {task.timeout:g}s")
        return failed(task, error_entry(task, exc))
    except Exception as exc:
        # A TypeError may mean the stored arguments do not fit the function (checked
        # only now, so the common path pays nothing): that fails for good.
        if isinstance(exc, TypeError):
            bind_error = _check_signature(definition, call_args, task.kwargs)
            if bind_error is not None:
                return failed(task, error_entry(task, bind_error), retryable=False)
        if task.cancel_requested or (task.context is not None and task.context.cancel_requested):
            error = {**error_entry(task, exc), "outcome": CANCELLED}
            return Outcome(task, CANCELLED, "cancelled", error=error)
        return failed(task, error_entry(task, exc))
    except BaseException as exc:  # SystemExit from a handler must not kill its slot
        return failed(task, error_entry(task, exc))
    finally:
        close_old_connections()


def _invoke(
    definition: TaskDefinition,
    task: ClaimedTask,
    call_args: list[Any],
    async_runner: AsyncRunner | None,
) -> Any:
    if definition.is_async:
        if async_runner is None:
            raise RuntimeError("async task without an event loop")
        remaining = None
        if task.deadline_monotonic is not None:
            remaining = max(0.0, task.deadline_monotonic - time.monotonic())
        return async_runner.run(definition.func(*call_args, **task.kwargs), remaining)
    result = definition.func(*call_args, **task.kwargs)
    if inspect.isawaitable(result):  # a sync wrapper around a coroutine function
        raise InvalidTaskError(f"task {definition.name!r} returned an awaitable; use async def")
    return result


def _check_signature(
    definition: TaskDefinition, args: list[Any], kwargs: dict[str, Any]
) -> Exception | None:
    """A payload that cannot be bound to the function fails for good, with the reason."""
    try:
        inspect.signature(definition.func).bind(*args, **kwargs)
    except TypeError as exc:
        signature = inspect.signature(definition.func)
        return InvalidTaskError(
            f"the stored arguments do not fit {definition.name}{signature}: {exc}"
        )
    except ValueError:  # builtins without a signature: let the call decide
        return None
    return None
