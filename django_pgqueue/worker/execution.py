"""Running one claimed task's handler and naming how it ended.

Handlers never touch the queue row: they return, or raise, and the settler writes the
consequence. What each ending does to the row is decided in ``outcomes.py``; this
module only runs the handler and maps what happened onto that policy.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from django_pgqueue.core.exceptions import (
    _UNSET,
    Cancelled,
    Continue,
    EncryptionError,
    InvalidTaskError,
    LeaseLost,
    PayloadTooLarge,
    Retry,
    Snooze,
    Suspend,
    TaskNotRegistered,
)
from django_pgqueue.core.payload import (
    CHECKPOINT_LIMIT,
    RESULT_LIMIT,
    check_json,
    check_stored_call,
    check_value_size,
)
from django_pgqueue.core.signals import task_started
from django_pgqueue.tasking import middleware, tracing
from django_pgqueue.tasking.batch import BatchCall
from django_pgqueue.tasking.context import TaskContext
from django_pgqueue.tasking.registry import TaskDefinition, registry
from django_pgqueue.worker import atomic, outcomes, task_logs
from django_pgqueue.worker.asyncio_runner import AsyncRunner
from django_pgqueue.worker.claimed import ClaimedTask
from django_pgqueue.worker.logging import current_lease
from django_pgqueue.worker.outcomes import Outcome

logger = logging.getLogger("django_pgqueue.worker")


def make_context(task: ClaimedTask, database: str) -> TaskContext:
    """The handler's context; an encrypted task's encrypts what it saves."""
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
        signals=task.signals,
        wake=task.wake,
    )
    context._cancel_requested = task.cancel_requested
    context._encrypted = task.encrypted
    return context


def execute(
    task: ClaimedTask,
    database: str,
    async_runner: AsyncRunner | None,
    *,
    recycle_connections: bool = True,
    renewed_lease: bool = True,
) -> Outcome:
    """Run the handler of ``task`` and return the outcome to settle. Never raises.

    While it runs, log records name this execution (``logging.ExecutionFilter``), and,
    with TASK_LOGS, are kept in its outcome (``task_logs``).
    ``recycle_connections=False`` leaves the thread's connections alone around the
    handler (django_pgqueue.testing runs handlers on a test's own connection, inside
    its transaction); the worker always recycles them. An atomic task's outcome is
    written here, with its handler's writes (atomic.py: ``Outcome.written``);
    ``renewed_lease=False`` (django_pgqueue.testing, where no heartbeat renews the
    lease) lets it commit after the lease's expiry.
    """
    if async_runner is not None and _is_async(task):
        # On the runner's loop, as an async slot runs it (in process mode's children).
        return async_runner.result(execute_async(task, database))
    marker = current_lease.set(task)
    try:
        outcome = _execute(task, database, recycle_connections, renewed_lease)
    finally:
        current_lease.reset(marker)
    outcome.logs = task_logs.take(task)
    return outcome


def _is_async(task: ClaimedTask) -> bool:
    try:
        return registry.get(task.task_name, task.handler_version).is_async
    except TaskNotRegistered:
        return False  # _execute reports it


@tracing.consumer
def _execute(
    task: ClaimedTask, database: str, recycle_connections: bool = True, renewed_lease: bool = True
) -> Outcome:
    prepared = _prepare(task, database)
    if isinstance(prepared, Outcome):
        return prepared
    definition, call_args = prepared
    if recycle_connections and time.monotonic() - getattr(_recycled, "at", -1e9) >= 1.0:
        close_old_connections()
    if task_started.receivers:
        _send_started(definition, task, database)
    started = time.monotonic()

    def attempt() -> Outcome:
        try:
            result = _invoke(definition, task, call_args)
            return _succeeded(task, result, time.monotonic() - started)
        except BaseException as exc:  # SystemExit from a handler must not kill its slot
            return _raised(task, definition, call_args, exc)

    try:
        if atomic.chosen(definition, task):
            return atomic.run(task, database, attempt, any_expiry=not renewed_lease)
        return attempt()
    finally:
        if recycle_connections:
            close_old_connections()
            _recycled.at = time.monotonic()


# When this thread last recycled its Django connections (after its last task), as a
# request does when it finishes. A handler's thread recycles them after each task, and
# before one only when the thread has been idle for a second or more since (its
# connections may have grown too old, or broken, meanwhile): the check costs some 3 us,
# and a busy slot would otherwise run it twice in a row with nothing between.
_recycled = threading.local()


@tracing.aconsumer
async def execute_async(
    task: ClaimedTask, database: str, *, recycle_connections: bool = True
) -> Outcome:
    """``execute`` for an ``async def`` handler awaited on the worker's event loop (an
    async slot, see async_slots.py): the same outcomes, the timeout by ``wait_for``.
    Never raises. ``recycle_connections``: as for ``execute``."""
    marker = current_lease.set(task)
    try:
        outcome = await _execute_async(task, database, recycle_connections)
    finally:
        current_lease.reset(marker)
    outcome.logs = task_logs.take(task)
    return outcome


async def _execute_async(task: ClaimedTask, database: str, recycle_connections: bool) -> Outcome:
    try:
        prepared = _prepare(task, database)
        if isinstance(prepared, Outcome):
            return prepared
        definition, call_args = prepared
        if atomic.chosen(definition, task):  # refused at enqueue: the handler changed since
            return outcomes.unrunnable(
                task,
                "InvalidTaskError",
                "this task was enqueued with atomic=True, and its handler is now an async "
                "def, which cannot run in a transaction of its own: make it a plain def "
                "again to run it (requeue it then), or enqueue it without atomic",
            )
        # Async handlers reach the ORM through sync_to_async, whose connections live in
        # asgiref's thread: recycle those like a request would.
        if recycle_connections:
            await sync_to_async(close_old_connections)()
        if task_started.receivers:
            await _asend_started(definition, task, database)
        started = time.monotonic()
        try:
            chain = middleware.stack().aexecute
            if chain is None:
                coro = definition.func(*call_args, **task.kwargs)
            else:
                coro = chain(task.context, lambda: definition.func(*call_args, **task.kwargs))
            remaining = None
            if task.deadline_monotonic is not None:
                remaining = max(0.0, task.deadline_monotonic - time.monotonic())
            result = await (coro if remaining is None else asyncio.wait_for(coro, remaining))
            return _succeeded(task, result, time.monotonic() - started)
        except asyncio.CancelledError as exc:
            if task.cancel_requested:  # a hard cancel (AsyncSlots.cancel)
                interrupted = Cancelled(
                    "cancelled with hard=True: the async handler was interrupted at its await"
                )
                return outcomes.cancelled(task, outcomes.error_entry(task, interrupted))
            return outcomes.failed(task, outcomes.error_entry(task, exc))
        except BaseException as exc:
            return _raised(task, definition, call_args, exc)
        finally:
            if recycle_connections:
                await sync_to_async(close_old_connections)()
    except BaseException as exc:  # a bug above must not lose the task: fail the attempt
        logger.exception("%s: the async slot failed", task.log_prefix())
        return outcomes.failed(task, outcomes.error_entry(task, exc))


def _prepare(task: ClaimedTask, database: str) -> tuple[TaskDefinition, list[Any]] | Outcome:
    """The handler and its positional arguments, or the outcome of a row that cannot run."""
    try:
        definition = registry.get(task.task_name, task.handler_version)
    except TaskNotRegistered as exc:  # the claim filters on routes; defensive only
        return outcomes.failed(task, outcomes.error_entry(task, exc), retryable=False)
    if type(task.args) is dict:  # an encrypted row (a plain row's args are an array)
        try:
            task.open_payloads()
        except EncryptionError as exc:
            return outcomes.undecryptable(task, str(exc))
    problem = check_stored_call(task.args, task.kwargs)
    if problem is not None:
        return outcomes.unrunnable(task, "InvalidTaskError", problem)
    if definition.takes_context:
        task.context = make_context(task, database)
        return definition, [task.context, *task.args]
    if middleware.stack().wraps_execution:  # the hooks see the attempt's context
        task.context = make_context(task, database)
    return definition, task.args


def _send_started(definition: TaskDefinition, task: ClaimedTask, database: str) -> None:
    _log_failed_receivers(
        task_started.send_robust(
            definition, task_id=task.id, attempt=task.attempt, queue=task.queue, database=database
        )
    )


async def _asend_started(definition: TaskDefinition, task: ClaimedTask, database: str) -> None:
    _log_failed_receivers(
        await task_started.asend_robust(
            definition, task_id=task.id, attempt=task.attempt, queue=task.queue, database=database
        )
    )


def _log_failed_receivers(results: list[tuple[Any, Any]]) -> None:
    for receiver, result in results:
        if isinstance(result, Exception):
            logger.error("task_started receiver %r raised %r (ignored)", receiver, result)


def _succeeded(task: ClaimedTask, result: Any, runtime: float) -> Outcome:
    """A result that cannot be stored, or is larger than MAX_RESULT_BYTES, fails the
    task (no retry: the same code returns the same value) and is never written."""
    try:
        result = check_json(result, "result")
        check_value_size(RESULT_LIMIT, result)
    except InvalidTaskError as exc:
        kind = "PayloadTooLarge" if isinstance(exc, PayloadTooLarge) else "TypeError"
        return outcomes.unrunnable(
            task, kind, f"the task returned a value that cannot be stored: {exc}"
        )
    return outcomes.succeeded(task, result, runtime)


def _raised(
    task: ClaimedTask, definition: TaskDefinition, call_args: list[Any], exc: BaseException
) -> Outcome:
    """The outcome of a handler that raised ``exc``."""
    if isinstance(exc, Snooze):
        return outcomes.snoozed(task, exc.delay)
    if isinstance(exc, Suspend):
        save = exc.checkpoint is not _UNSET
        try:
            checkpoint = check_json(exc.checkpoint, "checkpoint") if save else None
            check_value_size(CHECKPOINT_LIMIT, checkpoint)
        except InvalidTaskError as bad:
            return outcomes.failed(task, outcomes.error_entry(task, bad), retryable=False)
        return outcomes.suspended(task, exc.reason, exc.signal, exc.timeout, checkpoint, save)
    if isinstance(exc, Continue):
        try:
            checkpoint = check_json(exc.checkpoint, "checkpoint")
            check_value_size(CHECKPOINT_LIMIT, checkpoint)
        except InvalidTaskError as bad:
            return outcomes.failed(task, outcomes.error_entry(task, bad), retryable=False)
        return outcomes.continued(task, checkpoint, save=exc.checkpoint is not None)
    if isinstance(exc, Cancelled):
        return outcomes.cancelled(task, outcomes.error_entry(task, exc, "Cancelled"))
    if isinstance(exc, Retry):
        return outcomes.failed(task, outcomes.error_entry(task, exc), retry_delay=exc.delay)
    if isinstance(exc, LeaseLost):
        return outcomes.failed(task, outcomes.error_entry(task, exc), label=outcomes.LOST)
    if isinstance(exc, TimeoutError):
        deadline = task.deadline_monotonic
        if deadline is not None and time.monotonic() >= deadline - 0.01:
            return outcomes.timed_out(
                task, f"the attempt exceeded its timeout of {task.timeout:g}s"
            )
        return outcomes.raised(task, exc)
    if isinstance(exc, Exception):
        # A TypeError may mean the stored arguments do not fit the function (checked
        # only now, so the common path pays nothing): that fails for good.
        if isinstance(exc, TypeError):
            bind_error = _check_signature(definition, call_args, task.kwargs)
            if bind_error is not None:
                return outcomes.failed(
                    task, outcomes.error_entry(task, bind_error), retryable=False
                )
        if task.cancel_requested or (task.context is not None and task.context.cancel_requested):
            return outcomes.cancelled(task, outcomes.error_entry(task, exc))
    return outcomes.raised(task, exc)


def _invoke(definition: TaskDefinition, task: ClaimedTask, call_args: list[Any]) -> Any:
    if definition.is_async:  # async slots (or the child's loop) run these
        raise RuntimeError("async task without an event loop")
    chain = middleware.stack().execute
    if chain is None:
        result = definition.func(*call_args, **task.kwargs)
    else:
        result = chain(task.context, lambda: definition.func(*call_args, **task.kwargs))
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


def execute_batch(
    tasks: list[ClaimedTask], database: str, *, recycle_connections: bool = True
) -> list[Outcome]:
    """Run a batch handler (docs/tenants.md) on the calls of ``tasks`` (one route, in
    claim order) and return each task's outcome. Never raises. A call whose stored
    arguments cannot be read fails on its own, before the handler runs; one the handler
    marked failed (``BatchCall.fail``) fails by its own policy; the others succeed with
    their ``result``. A handler that raises fails every call. Middleware and the
    task_started signal are not applied (they are about one task's attempt).
    ``recycle_connections``: as for ``execute``."""
    first = tasks[0]
    marker = current_lease.set(first)
    try:
        try:
            definition = registry.get(first.task_name, first.handler_version)
        except TaskNotRegistered as exc:  # the claim filters on routes; defensive only
            return [outcomes.failed(t, outcomes.error_entry(t, exc), retryable=False)
                    for t in tasks]  # fmt: skip
        done: list[Outcome] = []
        calls: list[tuple[ClaimedTask, BatchCall]] = []
        for task in tasks:
            if type(task.args) is dict:  # an encrypted row, as in _prepare
                try:
                    task.open_payloads()
                except EncryptionError as exc:
                    done.append(outcomes.undecryptable(task, str(exc)))
                    continue
            problem = check_stored_call(task.args, task.kwargs)
            if problem is not None:
                done.append(outcomes.unrunnable(task, "InvalidTaskError", problem))
                continue
            calls.append((task, BatchCall(task.id, task.attempt, task.max_attempts,
                                          tuple(task.args), task.kwargs, task.metadata)))
        if not calls:
            return done
        if recycle_connections:
            close_old_connections()
        started = time.monotonic()
        try:
            definition.func([call for _, call in calls])
        except BaseException as exc:  # SystemExit from a handler must not kill its slot
            return done + [_batch_raised(task, exc) for task, _ in calls]
        finally:
            if recycle_connections:
                close_old_connections()
        runtime = time.monotonic() - started
        for task, call in calls:
            if call.error is not None:
                done.append(_batch_raised(task, call.error))
            else:
                done.append(_succeeded(task, call.result, runtime))
        return done
    finally:
        current_lease.reset(marker)


def _batch_raised(task: ClaimedTask, exc: BaseException) -> Outcome:
    """The outcome of one call of a batch that failed with ``exc`` (raised by the
    handler for them all, or given to ``BatchCall.fail``): by its own policy."""
    if isinstance(exc, Snooze):
        return outcomes.snoozed(task, exc.delay)
    if isinstance(exc, Cancelled):
        return outcomes.cancelled(task, outcomes.error_entry(task, exc, "Cancelled"))
    if isinstance(exc, Retry):
        return outcomes.failed(task, outcomes.error_entry(task, exc), retry_delay=exc.delay)
    return outcomes.raised(task, exc)
