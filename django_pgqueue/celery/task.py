"""Celery's ``Task`` on this queue: what ``@app.task`` and ``@shared_task`` make.

A Celery task here is two things under one name:

- the object Celery code uses (``add.delay(2, 2)``, ``self.retry(...)``,
  ``self.request.id``): a ``Task``, one instance per task, as in Celery;
- a django_pgqueue task (``@task(takes_context=True)``) that a worker claims and runs:
  its handler (``_handler``) builds ``self.request`` from the attempt's TaskContext,
  pipes a parent's result into a chain's step, sends Celery's task signals, runs the
  function, and turns ``self.retry()`` into the row's next attempt.

Celery's options map onto the row (docs/celery.md has the table):

- ``max_retries`` N -> ``max_attempts`` N + 1 (None: unlimited, 1,000,000);
  ``default_retry_delay`` -> the backoff of a retry with no countdown.
- An exception fails the task at once (``retry_on=()``), as in Celery, unless the
  function retries it: ``self.retry()``, or ``autoretry_for`` (with ``retry_backoff``,
  ``retry_backoff_max``, ``retry_jitter``, ``retry_kwargs``, ``dont_autoretry_for``),
  computed as Celery computes it.
- ``time_limit`` (else ``soft_time_limit``) -> ``timeout``: the attempt ends as a
  timeout, and a timeout fails the task at once (``discard_on=TimeoutError``), as
  Celery's TimeLimitExceeded does.
- ``rate_limit`` -> a fleet-wide ``key_rate`` on the task's name.
- ``priority``, ``queue``, ``expires`` -> the row's.
- ``acks_late``, ``reject_on_worker_lost``, ``track_started``, ``ignore_result`` (no
  result stored), ``typing``, ``throws``, ``trail``, ``send_events``,
  ``store_errors_even_if_ignored``, ``resultrepr_maxsize``: accepted (docs/celery.md
  says what each means here).

The django_pgqueue task is registered once Django's settings are loaded (the
``proj/celery.py`` of Celery's layout is imported while they load): at once when they
are, else when the app's tasks are imported (``django_pgqueue.signals.tasks_imported``).
"""

from __future__ import annotations

import inspect
import random
import socket
import threading
import traceback as traceback_module
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import wraps
from typing import Any

from django.utils import timezone

from django_pgqueue.celery import canvas, states
from django_pgqueue.celery import options as celery_options
from django_pgqueue.celery import registry as celery_registry
from django_pgqueue.celery.encoding import decode, encode
from django_pgqueue.celery.exceptions import (
    MaxRetriesExceededError,
    Retry,
    Unsupported,
)
from django_pgqueue.celery.result import AsyncResult, EagerResult, exception_from_error
from django_pgqueue.celery.signals import (
    task_failure,
    task_postrun,
    task_prerun,
    task_retry,
    task_success,
)
from django_pgqueue.celery.state import get_current_app, pop_task, push_task
from django_pgqueue.core.exceptions import Cancelled, HandlerSignal, InvalidTaskError
from django_pgqueue.core.exceptions import Retry as QueueRetry
from django_pgqueue.core.options import MAX_ATTEMPTS_LIMIT
from django_pgqueue.core.retry import exception_name
from django_pgqueue.ops.operations import get_task
from django_pgqueue.tasking.context import TaskContext
from django_pgqueue.tasking.registry import TaskDefinition
from django_pgqueue.tasking.registry import task as queue_task

_HOSTNAME = f"pgqueue@{socket.gethostname()}"


class Request:
    """``self.request``: the running attempt, under Celery's names.

    ``id`` (the row's id, a string), ``retries`` (earlier attempts: ``attempt - 1``;
    attempts lost with a worker count), ``args``, ``kwargs``, ``hostname``,
    ``delivery_info`` (``routing_key``: the queue), ``headers`` (custom ones),
    ``is_eager``, ``called_directly``, ``timelimit``; and ``task_context``, this
    queue's TaskContext (checkpoints, progress, cancellation, deadline).
    """

    id: str | None = None
    task: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    retries = 0
    is_eager = False
    called_directly = True
    hostname: str | None = None
    delivery_info: dict[str, Any] | None = None
    headers: dict[str, Any] | None = None
    eta = None
    expires = None
    group = None
    group_index = None
    chord = None
    chain = None
    callbacks = None
    errbacks = None
    root_id = None
    parent_id = None
    correlation_id = None
    reply_to = None
    origin = None
    ignore_result = False
    timelimit: tuple[Any, Any] = (None, None)
    task_context: TaskContext | None = None

    def __init__(self, *dicts: Any, **fields: Any) -> None:
        for given in dicts:
            self.__dict__.update(given if isinstance(given, dict) else vars(given))
        self.__dict__.update(fields)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "task_context"}

    def __repr__(self) -> str:
        return f"<Context: {self.as_dict()!r}>"


Context = Request  # Celery's name of the class


class ExceptionInfo:
    """billiard's ExceptionInfo, as Celery hands it to on_failure and the signals."""

    def __init__(self, exc: BaseException) -> None:
        self.exception = exc
        self.type = type(exc)
        self.tb = exc.__traceback__
        self.traceback = "".join(traceback_module.format_exception(exc))

    def __str__(self) -> str:
        return self.traceback


class Task:
    """A Celery task. ``@app.task`` makes one from a function; a subclass with ``run``
    is one too (``app.register_task(MyTask())``), and a base class
    (``@app.task(base=MyTask)``) lends its hooks and attributes."""

    name: str | None = None
    app: Any = None
    typing = True
    max_retries: int | None = 3
    default_retry_delay: float = 180
    rate_limit: Any = None
    ignore_result = False
    trail = True
    send_events = True
    store_errors_even_if_ignored = False
    serializer: str | None = None
    time_limit: float | None = None
    soft_time_limit: float | None = None
    autoretry_for: tuple[type[BaseException], ...] = ()
    dont_autoretry_for: tuple[type[BaseException], ...] = ()
    retry_kwargs: dict[str, Any] = {}
    retry_backoff: bool | float = False
    retry_backoff_max = 600
    retry_jitter = True
    acks_late: bool | None = None
    acks_on_failure_or_timeout: bool | None = None
    reject_on_worker_lost: bool | None = None
    track_started: bool | None = None
    priority: int | None = None
    expires: Any = None
    queue: str | None = None
    throws: tuple[type[BaseException], ...] = ()
    resultrepr_maxsize = 1024
    abstract = True
    MaxRetriesExceededError = MaxRetriesExceededError

    def __init__(self) -> None:
        self._local = threading.local()
        self._definition: TaskDefinition | None = None

    # -- what Celery code calls --------------------------------------------------------
    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("Tasks must define the run method.")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here, now, as a plain call (``request.called_directly``)."""
        self.push_request(args=args, kwargs=kwargs)
        try:
            return self.run(*args, **kwargs)
        finally:
            self.pop_request()

    @property
    def request(self) -> Request:
        stack = getattr(self._local, "stack", None)
        return stack[-1] if stack else Request()

    @property
    def request_stack(self) -> list[Request]:
        if getattr(self._local, "stack", None) is None:
            self._local.stack = []
        return self._local.stack

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        self.request_stack.append(Request(*args, **kwargs))

    def pop_request(self) -> None:
        self.request_stack.pop()

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Enqueue a call, **in the caller's transaction** (as ``enqueue()``): it rolls
        back with it, and a worker sees it once it commits."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
        link: Any = None, link_error: Any = None, **options: Any,
    ) -> AsyncResult:  # fmt: skip
        """Enqueue a call with Celery's options (docs/celery.md, "Calling"), in the
        caller's transaction; returns its AsyncResult at once."""
        options.update(
            {k: v for k, v in (("task_id", task_id), ("link", link),
                               ("link_error", link_error)) if v is not None}
        )  # fmt: skip
        return canvas.Signature(self, args, kwargs, options).apply_async()

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Enqueue when the outermost atomic block commits (Celery's DjangoTask)."""
        return self.apply_async_on_commit(args, kwargs)

    def apply_async_on_commit(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        return self.apply_async(args, kwargs, on_commit=True, **options)

    def apply(
        self, args: Any = None, kwargs: Any = None, link: Any = None, link_error: Any = None,
        task_id: str | None = None, retries: int | None = None, throw: bool | None = None,
        headers: dict[str, Any] | None = None, **options: Any,
    ) -> EagerResult:  # fmt: skip
        """Run the task here, now, as Celery's ``apply()`` does: its signals and hooks,
        its retries at once (no countdown); an EagerResult."""
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        task_id = task_id or str(uuid.uuid4())
        request = Request(
            id=task_id, task=self.name, args=args, kwargs=kwargs, retries=retries or 0,
            is_eager=True, called_directly=False, hostname=_HOSTNAME, headers=headers,
            delivery_info={"is_eager": True, "exchange": None, "routing_key": None,
                           "priority": options.get("priority")},
            timelimit=(None, None),
        )  # fmt: skip
        conf = self._app().conf
        throw = conf.task_eager_propagates if throw is None else throw
        try:
            retval = _trace(self, request, args, kwargs)
        except Retry as exc:
            if exc.sig is not None:
                return self.apply(
                    exc.sig.args, exc.sig.kwargs, link=link, link_error=link_error,
                    task_id=task_id, retries=request.retries + 1, throw=throw,
                    headers=headers,
                )  # fmt: skip
            return EagerResult(task_id, exc, states.RETRY, name=self.name)
        except Exception as exc:
            tb = "".join(traceback_module.format_exception(exc))
            for errback in canvas.links(link_error):
                wants_request = canvas.takes_request(errback.type, len(errback.args))
                errback.apply((request, exc, tb) if wants_request else (task_id,))
            if throw:
                raise
            return EagerResult(task_id, exc, states.FAILURE, traceback=tb, name=self.name)
        for callback in canvas.links(link):
            callback.apply((retval,))
        return EagerResult(task_id, retval, states.SUCCESS, name=self.name)

    def retry(
        self, args: Any = None, kwargs: Any = None, exc: BaseException | None = None,
        throw: bool = True, eta: datetime | None = None, countdown: float | None = None,
        max_retries: int | None = None, **options: Any,
    ) -> Retry:  # fmt: skip
        """Retry this attempt: raises Retry, which the worker turns into the row's next
        attempt ``countdown`` seconds (default ``default_retry_delay``) or at ``eta``
        later. Past ``max_retries``, raises ``exc`` (or MaxRetriesExceededError): the
        task fails."""
        request = self.request
        if request.called_directly:
            # A plain call, not a worker's: as Celery, raise the exception itself.
            raise exc or Retry("Task can be retried", None)
        if args is not None or kwargs is not None or options:
            given = ", ".join([*(["args"] if args is not None else []),
                               *(["kwargs"] if kwargs is not None else []), *options])  # fmt: skip
            raise Unsupported(
                f"self.retry({given}=...) has no counterpart: a retry is the row's next "
                "attempt, with its stored arguments and options; save what changes with "
                "self.request.task_context.save_checkpoint(...), or enqueue a new task"
            )
        if not throw:
            raise Unsupported(
                "self.retry(throw=False) has no counterpart: the retry is this task's "
                "next attempt, which starts only once this one has ended; write "
                "`raise self.retry(...)`"
            )
        retries = request.retries + 1
        limit = self.max_retries if max_retries is None else max_retries
        if limit is not None and retries > limit:
            if exc is not None:
                raise exc
            raise self.MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}] args:{request.args} "
                f"kwargs:{request.kwargs}",
                task_args=request.args, task_kwargs=request.kwargs,
            )  # fmt: skip
        context = request.task_context
        if context is not None and retries >= context.max_attempts:
            raise self.MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}]: max_retries={limit} asks for more "
                f"retries than the {context.max_attempts} attempts this task was enqueued "
                f"with (max_retries={self.max_retries}, plus the first run); declare "
                f"max_retries={limit} on the task"
            )
        if countdown is None and eta is None:
            countdown = self.default_retry_delay
        if eta is not None:
            if timezone.is_naive(eta):
                eta = timezone.make_aware(eta, timezone.get_fixed_timezone(0))
            countdown = max(0.0, (eta - timezone.now()).total_seconds())
        sig = self.signature_from_request(request) if request.is_eager else None
        raise Retry(exc=exc, when=float(countdown), is_eager=request.is_eager, sig=sig)

    def signature_from_request(self, request: Request | None = None) -> canvas.Signature:
        request = request or self.request
        return canvas.Signature(self, request.args, request.kwargs)

    def update_state(
        self, task_id: str | None = None, state: str | None = None, meta: Any = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        """Publish a custom state and its meta (``self.update_state(state="PROGRESS",
        meta={"current": 5})``): stored as the row's progress, a fenced write; read by
        ``AsyncResult.state`` and ``.info`` while the task runs."""
        context = self.request.task_context
        if context is None:
            if self.request.is_eager or self.request.called_directly:
                return
            raise Unsupported("update_state outside a worker's attempt has no row to write")
        if task_id is not None and str(task_id) != str(context.task_id):
            raise Unsupported(
                "update_state(task_id=...) of another task has no counterpart: a task "
                "writes only its own row (its progress is fenced on its lease)"
            )
        context.report_progress({"state": state or states.PENDING, "meta": encode(meta)})

    # -- canvas ------------------------------------------------------------------------
    def s(self, *args: Any, **kwargs: Any) -> canvas.Signature:
        return canvas.Signature(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> canvas.Signature:
        return canvas.Signature(self, args, kwargs, immutable=True)

    def signature(self, args: Any = None, *starargs: Any, **starkwargs: Any) -> canvas.Signature:
        kwargs = starkwargs.pop("kwargs", None)
        options = starkwargs.pop("options", None) or {}
        immutable = starkwargs.pop("immutable", False)
        return canvas.Signature(
            self, args, kwargs, {**options, **starkwargs}, immutable=immutable
        )

    subtask = signature

    def map(self, *args: Any, **kwargs: Any) -> Any:
        return canvas.xmap(*args, **kwargs)

    def starmap(self, *args: Any, **kwargs: Any) -> Any:
        return canvas.xstarmap(*args, **kwargs)

    def chunks(self, *args: Any, **kwargs: Any) -> Any:
        return canvas.chunks(*args, **kwargs)

    def AsyncResult(self, task_id: str, **kwargs: Any) -> AsyncResult:
        return AsyncResult(task_id, task_name=self.name, app=self._app(), **kwargs)

    # -- Celery's hooks (a base class overrides them) ----------------------------------
    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        pass

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        pass

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        pass

    def on_retry(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        pass

    def after_return(
        self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        pass

    # -- what has no counterpart -------------------------------------------------------
    def replace(self, sig: Any) -> Any:
        raise Unsupported(
            "self.replace() has no counterpart: enqueue the new work and wait for it "
            "without holding a slot (self.request.task_context.wait_for(...)), or build the "
            "whole chain when you enqueue"
        )

    def add_to_chord(self, sig: Any, lazy: bool = False) -> Any:
        raise Unsupported(
            "add_to_chord() has no counterpart: a chord's members are fixed when it is "
            "enqueued"
        )

    def send_event(self, type_: str, **fields: Any) -> None:
        raise Unsupported(
            "send_event() has no counterpart: there are no worker events; report "
            "progress with self.update_state(...) or the signals"
        )

    @property
    def backend(self) -> Any:
        raise Unsupported(
            "task.backend has no counterpart: the result is the task's row; read it "
            "with AsyncResult(id)"
        )

    # -- the django_pgqueue task -------------------------------------------------------
    def _app(self) -> Any:
        return self.app or get_current_app()

    def definition(self) -> TaskDefinition:
        """The django_pgqueue task this one runs as, registered on first use."""
        if self._definition is None:
            self._definition = self._register()
        return self._definition

    def _register(self) -> TaskDefinition:
        conf = self._app().conf
        celery_options.check_serializer(self.serializer, f"@task(serializer) on {self.name}")
        style = celery_options.priority_style(conf)
        chosen = self.priority if self.priority is not None else conf.task_default_priority
        hard = self.time_limit if self.time_limit is not None else conf.task_time_limit
        soft = (
            self.soft_time_limit if self.soft_time_limit is not None
            else conf.task_soft_time_limit
        )  # fmt: skip
        rate = celery_options.rate_limit(
            self.rate_limit if self.rate_limit is not None else conf.task_default_rate_limit
        )
        timeout = celery_options.time_limit(hard, soft)
        options: dict[str, Any] = {
            "name": self.name,
            "queue": self.queue or conf.task_default_queue,
            "priority": celery_options.priority(chosen, style),
            "max_attempts": self._max_attempts(),
            "backoff": _seconds(self.default_retry_delay, "default_retry_delay"),
            "retry_on": (),
            "discard_on": TimeoutError,
            "takes_context": True,
        }
        if timeout is not None:
            options["timeout"] = timeout
        if self.expires is not None:
            options["expires"] = celery_options.expires(self.expires)
        if rate is not None:
            name = self.name
            options["key_rate"] = rate
            options["concurrency_key"] = lambda *args, **kwargs: name
        handler = _handler(self)
        try:
            return queue_task(**options)(handler)
        except InvalidTaskError as exc:
            raise InvalidTaskError(f"@app.task {self.name}: {exc}") from exc

    def _max_attempts(self) -> int:
        """max_retries + 1: the task's, or autoretry's retry_kwargs' when larger (None:
        unlimited, as many as a row allows)."""
        limits = [self.max_retries]
        if self.autoretry_for and "max_retries" in self.retry_kwargs:
            limits.append(self.retry_kwargs["max_retries"])
        if None in limits:
            return MAX_ATTEMPTS_LIMIT
        return min(MAX_ATTEMPTS_LIMIT, max(limits) + 1)

    def __repr__(self) -> str:
        return f"<@task: {self.name}>"


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidTaskError(f"{what} must be seconds >= 0, not {value!r}")
    return float(value)


def make_task(app: Any, fun: Callable[..., Any], options: dict[str, Any]) -> Task:
    """The Task of ``@app.task(**options)`` on ``fun``: an instance of a subclass of
    ``base`` (default: the app's Task) with the options as attributes, as Celery
    makes it."""
    if inspect.iscoroutinefunction(fun):
        raise Unsupported(
            f"@app.task on {fun.__module__}.{fun.__qualname__}: an async def task has no "
            "counterpart in Celery's API; declare it with django_pgqueue's @task, which "
            "runs async def handlers on an event loop (docs/tasks.md)"
        )
    options = dict(options)
    base = options.pop("base", None) or app.Task
    bind = options.pop("bind", False)
    name = options.pop("name", None) or celery_registry.task_name(
        fun.__module__, fun.__name__, app.main
    )
    options.pop("shared", None)
    options.pop("filter", None)
    _check_task_options(name, options)
    attributes = {
        "name": name,
        "app": app,
        "run": fun if bind else staticmethod(fun),
        "__doc__": fun.__doc__,
        "__module__": fun.__module__,
        "__qualname__": fun.__qualname__,
        "__wrapped__": fun,
        "_bind": bind,
        **options,
    }
    task = type(fun.__name__, (base,), attributes)()
    add_autoretry(task)
    return task


def _check_task_options(name: str, options: dict[str, Any]) -> None:
    if "serializer" in options:
        celery_options.check_serializer(options["serializer"], f"@task(serializer) on {name}")
    for key in ("autoretry_for", "dont_autoretry_for", "throws"):
        value = options.get(key, ())
        classes = value if isinstance(value, tuple | list) else (value,)
        if not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
            raise InvalidTaskError(
                f"@task on {name}: {key} must be a tuple of exception classes, not {value!r}"
            )
        if key in options:
            options[key] = tuple(classes)


def add_autoretry(task: Task) -> None:
    """Celery's autoretry_for: the function's exceptions of those classes (not of
    dont_autoretry_for) retry, with retry_kwargs and the backoff Celery computes."""
    autoretry_for = tuple(task.autoretry_for)
    if not autoretry_for or "run" in vars(task):  # none, or wrapped already
        return
    dont = tuple(task.dont_autoretry_for)
    run = task.run

    @wraps(run)
    def autoretrying(*args: Any, **kwargs: Any) -> Any:
        try:
            return run(*args, **kwargs)
        except (Retry, HandlerSignal):
            raise
        except dont:
            raise
        except autoretry_for as exc:
            retry_kwargs = dict(task.retry_kwargs)
            if task.retry_backoff:
                retry_kwargs["countdown"] = backoff_interval(
                    factor=int(max(1.0, float(task.retry_backoff))),
                    retries=task.request.retries,
                    maximum=int(task.retry_backoff_max),
                    full_jitter=task.retry_jitter,
                )
            raise task.retry(exc=exc, **retry_kwargs) from exc

    task.run = autoretrying  # type: ignore[method-assign]


def backoff_interval(factor: int, retries: int, maximum: int, full_jitter: bool = False) -> int:
    """Celery's exponential backoff: ``min(maximum, factor * 2 ** retries)``, with full
    jitter (a random number of seconds from 0 to that) when asked."""
    countdown = min(maximum, factor * (2**retries))
    if full_jitter:
        countdown = random.randrange(countdown + 1)
    return max(0, countdown)


# -- running -------------------------------------------------------------------------
def _trace(task: Task, request: Request, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the task's function with ``request`` as ``self.request``, sending Celery's
    signals and calling its hooks, as Celery's tracer does; returns its value or
    raises (a retry as Celery's Retry)."""
    task.request_stack.append(request)
    push_task(task)
    task_id = request.id
    state, retval, einfo = states.FAILURE, None, None
    _send(task_prerun, task, task_id=task_id, task=task, args=args, kwargs=kwargs)
    try:
        task.before_start(task_id, args, kwargs)
        retval = task.run(*args, **kwargs)
    except Retry as exc:
        state, retval, einfo = states.RETRY, exc, ExceptionInfo(exc)
        task.on_retry(exc.exc or exc, task_id, args, kwargs, einfo)
        _send(task_retry, task, request=request, reason=exc, einfo=einfo)
        raise
    except HandlerSignal as exc:  # this queue's own outcomes (Snooze, Cancelled...)
        state, retval = states.REVOKED if isinstance(exc, Cancelled) else states.RETRY, exc
        raise
    except Exception as exc:
        retval, einfo = exc, ExceptionInfo(exc)
        task.on_failure(exc, task_id, args, kwargs, einfo)
        _send(task_failure, task, task_id=task_id, exception=exc, args=args, kwargs=kwargs,
              traceback=exc.__traceback__, einfo=einfo)  # fmt: skip
        raise
    else:
        state = states.SUCCESS
        task.on_success(retval, task_id, args, kwargs)
        _send(task_success, task, result=retval)
        return retval
    finally:
        try:
            task.after_return(state, retval, task_id, args, kwargs, einfo)
            _send(task_postrun, task, task_id=task_id, task=task, args=args, kwargs=kwargs,
                  retval=retval, state=state)  # fmt: skip
        finally:
            pop_task()
            task.request_stack.pop()


def _send(signal: Any, sender: Any, **named: Any) -> None:
    if signal.receivers:
        signal.send(sender=sender, **named)


def _handler(task: Task) -> Callable[..., Any]:
    """The django_pgqueue handler of a Celery task (takes_context=True)."""

    def handler(context: TaskContext, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = tuple(decode(list(args))), decode(kwargs)
        meta = context.metadata.get(canvas.META) or {}
        if "errback" in meta:
            args = _errback_args(task, context, meta["errback"], args)
        elif "pipe" in meta:
            args = (_piped(context, meta["pipe"]), *args)
        request = Request(
            id=str(context.task_id), task=task.name, args=args, kwargs=kwargs,
            retries=max(0, context.attempt - 1), is_eager=False, called_directly=False,
            hostname=_HOSTNAME, headers=meta.get("headers"), correlation_id=str(context.task_id),
            delivery_info={"routing_key": context.queue, "exchange": "",
                           "redelivered": context.attempt > 1},
            timelimit=(task.soft_time_limit, task.time_limit), task_context=context,
            ignore_result=bool(
                meta.get("ignore_result") or task.ignore_result
                or task._app().conf.task_ignore_result
            ),
        )  # fmt: skip
        try:
            retval = _trace(task, request, args, kwargs)
        except Retry as exc:
            raise QueueRetry(delay=exc.when, reason=_retry_reason(exc)) from exc.exc
        if request.ignore_result:
            return None
        return encode(retval)

    handler.__module__ = task.__module__
    handler.__name__ = handler.__qualname__ = type(task).__qualname__
    handler.__doc__ = task.__doc__
    return handler


def _retry_reason(exc: Retry) -> str:
    """The retry's error message; AsyncResult reads the exception back from it."""
    if exc.exc is None:
        return f"Retry in {exc.when:g}s"
    return f"Retry in {exc.when:g}s: {exception_name(type(exc.exc))}: {exc.exc}"


def _piped(context: TaskContext, pipe: Any) -> Any:
    """What a chain's step receives first: its parent's result, or a chord callback's
    list of its members' results (in the members' order)."""
    parents = context.parent_results()
    if isinstance(pipe, list):
        return [decode(parents.get(i, {}).get("result")) for i in pipe]
    return decode(parents.get(pipe, {}).get("result"))


def _errback_args(task: Task, context: TaskContext, parent_id: int, args: tuple) -> tuple:
    """A link_error's arguments: ``(request, exc, traceback)`` of the failed task when
    its function takes three or more, else its id (Celery's old style); and it is not
    run (cancelled) when that task succeeded."""
    parent = get_task(parent_id, database=context.database)
    if parent.state == "succeeded":
        raise Cancelled(f"task {parent_id}, whose errback this is, succeeded")
    error = parent.errors[-1] if parent.errors else {"type": "Exception", "message": ""}
    if canvas.takes_request(task, len(args)):
        request = Request(
            id=str(parent.id), task=parent.task_name,
            args=tuple(decode(parent.cleartext("args"))),
            kwargs=decode(parent.cleartext("kwargs")), retries=max(0, parent.attempt - 1),
            called_directly=False,
        )  # fmt: skip
        return (request, exception_from_error(error), error.get("traceback"), *args)
    return (str(parent.id), *args)

