"""The queue's side of Django's Tasks framework: registering a framework Task so the
worker can run it, and reading a row back as the framework's TaskResult.

A framework Task becomes a TaskDefinition in ``django_pgqueue.registry`` under the
task's ``module_path`` (``register``). Its handler is the bridge: the worker calls it like
any ``takes_context=True`` handler; it reads the claimed row, builds the framework's
TaskResult (status RUNNING) and TaskContext from it, sends ``task_started`` and calls
the task's function. ``task_finished`` is sent for terminal outcomes from a receiver of
``task_settled`` (so only once the outcome is written), on a thread of its own so that a
slow receiver never holds up the settler; for a FAILED task it is sent inside an
``except`` block of the task's last error, rebuilt from the row, as the framework's own
backends send it. Every framework signal is sent robustly: a receiver that raises is
logged, and changes neither the task's outcome nor the worker.

Nothing here imports a dotted path read from a row: a row is matched to code only
through the registry, filled when the modules that define the tasks are imported.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import queue
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.dispatch import Signal

from django_pgqueue.core import exceptions as queue_errors
from django_pgqueue.core.compat import (
    InvalidTaskError,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from django_pgqueue.core.conf import database_of, get_settings
from django_pgqueue.core.exceptions import PgQueueError, TaskNotRegistered
from django_pgqueue.core.options import (
    TASK_NAME_MAX_LENGTH,
    validate_backoff,
    validate_queue,
    validate_task_name,
    validate_timeout,
)
from django_pgqueue.core.reprs import short_repr
from django_pgqueue.core.signals import task_settled
from django_pgqueue.tasking.context import TaskContext as QueueContext
from django_pgqueue.tasking.registry import TaskDefinition, registry

logger = logging.getLogger("django_pgqueue.framework")

# The row's metadata key that marks a task enqueued through the framework:
# {"backend": <TASKS alias>, "run_after": <ISO-8601 or null, as the caller asked>}.
MARKER = "tasks_framework"

STATUS = {
    "scheduled": TaskResultStatus.READY,
    "pending": TaskResultStatus.READY,
    "waiting": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


class LeaseExpired(PgQueueError):
    """Recorded (never raised) when an attempt's lease lapsed: its worker crashed, hung or
    lost the database, and the lease sweep took the task back."""


class WorkerShutdown(PgQueueError):
    """Recorded (never raised) when a worker shut down during a task's final attempt."""


class Expired(PgQueueError):
    """Recorded (never raised) when a task had not started by its expiry (``expires``):
    it was cancelled instead of started."""


class RecordedError(PgQueueError):
    """Stands in, in ``task_finished``'s exception, for a task's exception whose class
    this process has not imported (a row never makes this process import a module)."""


# Errors the queue itself writes name no exception class; give them one the framework's
# TaskError.exception_class can resolve.
_RECORDED_TYPES = {
    "LeaseExpired": f"{__name__}.LeaseExpired",
    "WorkerShutdown": f"{__name__}.WorkerShutdown",
    "Expired": f"{__name__}.Expired",
    "TimeoutError": "builtins.TimeoutError",
    "Cancelled": "django_pgqueue.exceptions.Cancelled",
}
_CANCELLED = _RECORDED_TYPES["Cancelled"]


# -- registration ---------------------------------------------------------------------
def framework_task_of(definition: TaskDefinition) -> Task | None:
    """The framework Task a TaskDefinition was registered for, or None (native task)."""
    return getattr(definition.func, "framework_task", None)


def register(task: Task) -> TaskDefinition:
    """The TaskDefinition of a framework Task, registered under ``task.module_path``.

    Idempotent: ``using()`` copies and repeated validation find the existing entry.
    Raises the framework's InvalidTaskError when ``module_path`` cannot be a task name
    (this runs inside the backend's ``validate_task``).
    """
    name = _task_name(task)
    if name in registry:
        existing = registry.get(name)
        known = framework_task_of(existing)
        if known is not None and known.func is task.func:
            return existing
    conf = get_settings()
    definition: TaskDefinition[..., Any] = TaskDefinition(
        func=_make_handler(task),
        name=name,
        queue=validate_queue(task.queue_name),
        priority=int(task.priority),
        max_attempts=conf.DEFAULT_MAX_ATTEMPTS,
        backoff=validate_backoff(conf.DEFAULT_BACKOFF),
        timeout=validate_timeout(conf.DEFAULT_TIMEOUT),
        version=1,
        takes_context=True,
    )
    registry.register(definition)
    # The settled-outcome receiver exists once a framework task does: a worker of native
    # tasks only pays no signal per settlement for it.
    task_settled.connect(_on_settled, dispatch_uid="django_pgqueue.framework.task_finished")
    return definition


def _task_name(task: Task) -> str:
    """``task.module_path``, the framework task's name in the queue, once checked: the
    task_name column holds it, and every worker looks the task up by it."""
    path = task.module_path
    try:
        return validate_task_name(path)
    except queue_errors.InvalidTaskError as exc:
        if len(path) > TASK_NAME_MAX_LENGTH:
            problem = (
                f"it is {len(path)} characters long, and a task name holds at most "
                f"{TASK_NAME_MAX_LENGTH}"
            )
        else:
            problem = str(exc)
        raise InvalidTaskError(
            f"the Tasks framework task {short_repr(path)} cannot be registered: its "
            f"module_path is its task name in the queue, and {problem}. Rename the "
            "function or its module."
        ) from None


def _make_handler(task: Task) -> Callable[..., Any]:
    """The function the worker calls: ``handler(queue_context, *args, **kwargs)``.

    ``async def`` when the task's function is a coroutine function, so the worker runs
    it on its event loop; its ``__signature__`` is the task function's (with the queue
    context first, and without the framework's ``context``), so the worker's check of
    the stored arguments applies unchanged.
    """
    func = task.func

    if inspect.iscoroutinefunction(func):

        async def handler(queue_context: QueueContext, /, *args: Any, **kwargs: Any) -> Any:
            started = await sync_to_async(_start_in_thread, thread_sensitive=False)(
                task, queue_context
            )
            value = await func(*_call_args(task, started, args), **kwargs)
            return _returned(value)

    else:

        def handler(queue_context: QueueContext, /, *args: Any, **kwargs: Any) -> Any:
            started = _start(task, queue_context)
            value = func(*_call_args(task, started, args), **kwargs)
            return _returned(value)

    handler.__module__ = func.__module__
    handler.__name__ = func.__name__
    handler.__qualname__ = func.__qualname__
    handler.__doc__ = func.__doc__
    handler.__signature__ = _handler_signature(task)  # type: ignore[attr-defined]
    handler.framework_task = task  # type: ignore[attr-defined]
    return handler


def _handler_signature(task: Task) -> inspect.Signature:
    signature = inspect.signature(task.func)
    params = list(signature.parameters.values())
    if task.takes_context:
        params = params[1:]
    queue_context = inspect.Parameter(
        "__pgqueue_context__", inspect.Parameter.POSITIONAL_ONLY, annotation=QueueContext
    )
    return signature.replace(parameters=[queue_context, *params])


def _start(task: Task, queue_context: QueueContext) -> TaskResult:
    """Read the claimed row as a RUNNING TaskResult and announce ``task_started``."""
    from django_pgqueue.models import Task as Row

    row = Row.objects.using(queue_context.database).get(pk=queue_context.task_id)
    result = result_from_row(row, task)
    send_robust(task_started, result)
    return result


def _start_in_thread(task: Task, queue_context: QueueContext) -> TaskResult:
    # A pool thread, outside the worker's slots: recycle its connection like a request.
    close_old_connections()
    try:
        return _start(task, queue_context)
    finally:
        close_old_connections()


def _call_args(task: Task, result: TaskResult, args: tuple[Any, ...]) -> tuple[Any, ...]:
    if task.takes_context:
        return (TaskContext(task_result=result), *args)
    return args


def _returned(value: Any) -> Any:
    """The framework's JSON normalisation of a return value (tuples become lists...).

    A value it cannot normalise is returned as is: the worker then refuses it with the
    path of the offending part, and fails the task without retrying it.
    """
    try:
        return normalize_json(value)
    except (TypeError, ValueError):
        return value


# -- rows as TaskResults --------------------------------------------------------------
def result_id(task_id: int, database: str | None) -> str:
    """A TaskResult's id: the task's id, prefixed ``alias:`` for a task on another
    database than DATABASE (task ids are per database: PGQUEUE['DATABASES'])."""
    if database is None or database_of(database) == get_settings().DATABASE:
        return str(task_id)
    return f"{database}:{task_id}"


def result_from_row(row: Any, task: Task | None = None) -> TaskResult:
    """The framework's view of a task row.

    ``task`` is the registered framework Task (looked up from the registry by the row's
    task name when not given). Raises TaskResultDoesNotExist when the row was not
    enqueued through the framework or its task is not registered in this process. An
    encrypted task's args, kwargs and return value are decrypted (EncryptionError if
    no key of ENCRYPTION_KEYS decrypts them).
    """
    if task is None:
        task = _registered_task(row)
    marker = row.metadata.get(MARKER) or {}
    run_after = marker.get("run_after")
    result_task = task.using(
        priority=row.priority,
        queue_name=row.queue,
        run_after=datetime.fromisoformat(run_after) if run_after else None,
        backend=marker.get("backend") or task.backend,
    )
    result = TaskResult(
        task=result_task,
        id=result_id(row.id, row._state.db),
        status=STATUS[row.state],
        enqueued_at=row.enqueued_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_attempted_at=row.last_attempted_at,
        args=row.cleartext("args"),
        kwargs=row.cleartext("kwargs"),
        backend=result_task.backend,
        errors=[_task_error(entry) for entry in _recorded_errors(row)],
        worker_ids=worker_ids(row.attempt, row.worker_id, row.errors),
    )
    if row.state == "succeeded":
        object.__setattr__(result, "_return_value", row.cleartext("result"))
    return result


def _registered_task(row: Any) -> Task:
    try:
        definition = registry.get(row.task_name)
    except TaskNotRegistered:
        raise TaskResultDoesNotExist(
            f"task {row.id} runs {row.task_name!r}, which is not registered in this "
            "process: import the module that defines it (an installed app's tasks.py, "
            "or PGQUEUE['TASK_MODULES'])"
        ) from None
    task = framework_task_of(definition)
    if task is None or MARKER not in row.metadata:
        raise TaskResultDoesNotExist(
            f"task {row.id} was enqueued with django_pgqueue's own API, not through "
            "the Tasks framework; read it with django_pgqueue.get_task()"
        )
    return task


def _recorded_errors(row: Any) -> list[dict[str, Any]]:
    """The row's error entries, each attempt's in order.

    A cancelled task always ends with an entry saying so. The row has none when the
    task was cancelled before it started, or when its handler answered the cancel
    request by raising an exception of its own; one is added here (it is not stored).
    """
    errors = list(row.errors)
    if row.state == "cancelled" and not (errors and _class_path(errors[-1]) == _CANCELLED):
        when = f"after attempt {row.attempt}" if row.attempt else "before it started"
        errors.append(
            {
                "attempt": row.attempt,
                "type": "Cancelled",
                "message": f"task {row.id} was cancelled {when}",
                "traceback": None,
            }
        )
    return errors


def _class_path(entry: dict[str, Any]) -> str:
    kind = entry.get("type") or "Exception"
    if "." not in kind:
        kind = _RECORDED_TYPES.get(kind, f"builtins.{kind}")
    return kind


def _task_error(entry: dict[str, Any]) -> TaskError:
    traceback = entry.get("traceback") or f"{entry.get('type')}: {entry.get('message', '')}\n"
    return TaskError(exception_class_path=_class_path(entry), traceback=traceback)


def _recorded_exception(entry: dict[str, Any]) -> BaseException:
    """The exception an error entry records, rebuilt to be handled again.

    Its own class when this process has already imported it (nothing is imported for
    it), with the recorded message and without calling the class's ``__init__``;
    otherwise a RecordedError naming the class. The worker's traceback text is attached
    as a note, so a logged exception shows where the task failed.
    """
    path = _class_path(entry)
    message = entry.get("message") or ""
    exc = _rebuilt(_imported_exception_class(path), message)
    if exc is None:
        exc = RecordedError(f"{path}: {message}")
    if entry.get("traceback"):
        exc.add_note(
            f"Traceback recorded by the worker (attempt {entry.get('attempt')}):\n"
            f"{entry['traceback'].rstrip()}"
        )
    return exc


def _rebuilt(cls: type[BaseException] | None, message: str) -> BaseException | None:
    if cls is None:
        return None
    try:
        exc = cls.__new__(cls)
    except Exception:  # a __new__ that wants arguments of its own
        return None
    exc.args = (message,)
    return exc


def _imported_exception_class(path: str) -> type[BaseException] | None:
    module_name, _, qualname = path.rpartition(".")
    found: Any = sys.modules.get(module_name)
    for name in qualname.split("."):
        found = getattr(found, name, None)
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    return None


def worker_ids(attempt: int, last_worker: str | None, errors: list[dict[str, Any]]) -> list[str]:
    """One worker id per attempt, so ``TaskResult.attempts`` equals the row's attempt.

    Earlier attempts are named by their error entries; the latest by the row's
    worker_id. An attempt with no record (handed back at shutdown) reads "unknown".
    """
    by_attempt = {e.get("attempt"): e.get("worker_id") for e in errors if e.get("worker_id")}
    ids = []
    for number in range(1, attempt + 1):
        worker = by_attempt.get(number)
        if worker is None and number == attempt:
            worker = last_worker
        ids.append(worker or "unknown")
    return ids


# -- signals --------------------------------------------------------------------------
def send_robust(signal: Signal, result: TaskResult) -> None:
    """Send a framework signal as the framework does (sender: the backend class), but
    log and ignore a receiver that raises: it must not change the task's outcome."""
    sender = type(result.task.get_backend())
    for receiver, response in signal.send_robust(sender, task_result=result):
        if isinstance(response, Exception):
            logger.error(
                "receiver %r of a Tasks framework signal raised for task %s; ignored",
                receiver,
                result.id,
                exc_info=response,
            )


class FinishedAnnouncer:
    """Sends ``task_finished`` for settled framework tasks, on its own thread.

    The settler hands over ids (``put``); this thread reads the rows in one query per
    batch and sends the signal with each TaskResult. Started on first use; at process
    exit it gets a few seconds to announce what is still queued.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def put(self, task_id: int, database: str | None = None) -> None:
        """Announce the task ``task_id`` of ``database`` (default: DATABASE)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pgqueue-tasks-finished", daemon=True
                )
                self._thread.start()
                atexit.register(self.stop, 5.0)
        self._queue.put((database or get_settings().DATABASE, task_id))

    def stop(self, timeout: float) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < 500:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            by_database: dict[str, list[int]] = {}
            for item in batch:
                if item is not None:
                    by_database.setdefault(item[0], []).append(item[1])
            for database, ids in by_database.items():
                self._announce(ids, database)
            if None in batch:
                return

    def _announce(self, ids: list[int], database: str) -> None:
        from django_pgqueue.models import Task as Row

        close_old_connections()
        try:
            rows = list(Row.objects.using(database).filter(pk__in=ids))
            for row in rows:
                try:
                    result = result_from_row(row)
                except Exception:
                    logger.exception("task_finished: cannot read task %s", row.id)
                    continue
                _send_finished(result, row)
        except Exception:
            logger.exception("task_finished: could not announce tasks %s", ids)
        finally:
            close_old_connections()


def _send_finished(result: TaskResult, row: Any) -> None:
    """Send ``task_finished``: for a FAILED task, while its last error is being handled.

    The framework's backends send it from their ``except`` block, and receivers rely on
    that: Django's own log line reads ``sys.exc_info()``. This thread never saw the
    exception, so it raises the recorded one again and sends from its handler.
    """
    errors = _recorded_errors(row)
    if result.status != TaskResultStatus.FAILED or not errors:
        send_robust(task_finished, result)
        return
    exc = _recorded_exception(errors[-1])
    try:
        raise exc
    except BaseException:
        # This thread's frame is no part of the task's failure: the worker's traceback
        # is the note. exc_info reads the traceback from the exception.
        exc.__traceback__ = None
        send_robust(task_finished, result)


announcer = FinishedAnnouncer()


def _on_settled(
    sender: TaskDefinition, *, task_id: int, state: str | None, written: bool, **kwargs: Any
) -> None:
    if written and state in TERMINAL and framework_task_of(sender) is not None:
        announcer.put(task_id, kwargs.get("database"))

