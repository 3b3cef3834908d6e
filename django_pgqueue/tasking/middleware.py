"""Task middleware: hooks around every enqueue and every execution (docs/middleware.md).

``PGQUEUE["MIDDLEWARE"]`` lists dotted paths of ``TaskMiddleware`` subclasses, ordered
like Django's ``MIDDLEWARE``: the first one listed is the outermost. Each class is
imported and instantiated (without arguments) once per process, at the worker's start
or at the first enqueue, and its hooks are composed into one chain then::

    class TenantMiddleware(TaskMiddleware):
        def enqueue(self, task):
            return task.using(metadata={**task.options.metadata, "tenant": tenant_id()})

        def execute(self, context, call_next):
            with tenant(context.metadata.get("tenant")):
                return call_next()

        async def aexecute(self, context, call_next):
            with tenant(context.metadata.get("tenant")):
                return await call_next()

A middleware overrides only the hooks it needs; the others cost nothing: a chain is
built of the classes that override each hook, and with none, enqueue and the worker
call the handler directly.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from django_pgqueue.core.conf import get_setting
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.options import OPTION_NAMES
from django_pgqueue.tasking.context import TaskContext
from django_pgqueue.tasking.registry import TaskDefinition


class TaskMiddleware:
    """The base of a task middleware: every hook passes through unchanged.

    ``enqueue(task)`` runs in the enqueuing code before the row is built, once per
    ``enqueue``, ``enqueue_on_commit`` (at the call), ``enqueue_many`` (once for the
    batch) and Tasks framework ``enqueue``; it returns the task, or a copy with other
    options (``task.using(queue=..., priority=..., metadata=...)``). The options it
    returns are validated like the caller's: a bad one raises InvalidTaskError and
    nothing is written. It sees neither the arguments nor the id.

    ``execute(context, call_next)`` wraps a sync handler's call in the worker, and
    ``aexecute(context, call_next)`` (``async def``) an ``async def`` handler's, on the
    worker's event loop. ``context`` is the attempt's TaskContext (task_id, task_name,
    queue, attempt, metadata, database...), the same object a ``takes_context=True``
    handler receives; ``call_next()`` runs the next middleware, the last one the
    handler, and returns (or for ``aexecute``, its awaitable returns) the handler's
    value. Return that value, or another one that is JSON. An exception raised here is
    the attempt's outcome exactly as if the handler had raised it (a retry, ``Retry``,
    ``Snooze``, ``Cancelled``...). Both hooks run inside the attempt's timeout.
    """

    def enqueue(self, task: TaskDefinition) -> TaskDefinition:
        return task

    def execute(self, context: TaskContext, call_next: Callable[[], Any]) -> Any:
        return call_next()

    async def aexecute(self, context: TaskContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        return await call_next()


# A composed chain: chain(context, handler) runs the hooks around handler().
Chain = Callable[[TaskContext, Callable[[], Any]], Any]


class Stack(NamedTuple):
    """The middleware of this process, loaded once: the enqueue hooks in order (with
    the path each came from, for errors), and the composed execution chains (None:
    no middleware overrides the hook, and the handler is called directly)."""

    enqueue: tuple[tuple[str, Callable[[TaskDefinition], TaskDefinition]], ...]
    execute: Chain | None
    aexecute: Chain | None

    @property
    def wraps_execution(self) -> bool:
        return self.execute is not None or self.aexecute is not None


_stack: Stack | None = None


def stack() -> Stack:
    """This process's middleware, imported on first use."""
    return _stack or _load()


def _load() -> Stack:
    global _stack
    middleware = [(path, instantiate(path)) for path in get_setting("MIDDLEWARE")]
    _stack = Stack(
        enqueue=tuple((path, m.enqueue) for path, m in middleware if _overrides(m, "enqueue")),
        execute=_compose([m.execute for _, m in middleware if _overrides(m, "execute")]),
        aexecute=_compose([m.aexecute for _, m in middleware if _overrides(m, "aexecute")]),
    )
    return _stack


def _reset(*, setting: str, **kwargs: Any) -> None:
    """``override_settings(PGQUEUE=...)`` loads the middleware again."""
    global _stack
    if setting == "PGQUEUE":
        _stack = None


setting_changed.connect(_reset, dispatch_uid="django_pgqueue.middleware")


def problem(path: Any) -> str | None:
    """Why ``path`` is not a task middleware (for ``manage.py check``), or None."""
    try:
        cls = import_string(path)
    except Exception as exc:  # ImportError, or whatever importing its module raised
        return f"{path!r} cannot be imported: {type(exc).__name__}: {exc}"
    if not (isinstance(cls, type) and issubclass(cls, TaskMiddleware)):
        return f"{path!r} is {cls!r}, not a subclass of django_pgqueue.middleware.TaskMiddleware"
    if inspect.iscoroutinefunction(cls.execute):
        return f"{path}.execute is async def: async handlers are wrapped by aexecute"
    if not inspect.iscoroutinefunction(cls.aexecute):
        return f"{path}.aexecute must be async def (it wraps async def handlers)"
    return None


def instantiate(path: str) -> TaskMiddleware:
    wrong = problem(path)
    if wrong is not None:
        raise ImproperlyConfigured(f"PGQUEUE['MIDDLEWARE']: {wrong}; see docs/middleware.md")
    return import_string(path)()


def _overrides(middleware: TaskMiddleware, hook: str) -> bool:
    return getattr(type(middleware), hook) is not getattr(TaskMiddleware, hook)


def _compose(hooks: list[Callable[..., Any]]) -> Chain | None:
    """One callable running ``hooks`` in order around a handler, built once: the
    first hook is the outermost, as in Django's MIDDLEWARE."""
    if not hooks:
        return None
    chain: Chain = _innermost
    for hook in reversed(hooks):
        chain = _layer(hook, chain)
    return chain


def _innermost(context: TaskContext, handler: Callable[[], Any]) -> Any:
    return handler()


def _layer(hook: Callable[..., Any], inner: Chain) -> Chain:
    # The same for execute and aexecute: an async hook returns its coroutine, which
    # awaits call_next()'s (the next hook's coroutine, or the handler's).
    def layer(context: TaskContext, handler: Callable[[], Any]) -> Any:
        return hook(context, lambda: inner(context, handler))

    return layer


# -- the enqueue hooks -----------------------------------------------------------------
# What an enqueue hook may not change: everything of the task but its call's options.
_DEFINITION_FIELDS = tuple(
    f.name for f in dataclasses.fields(TaskDefinition) if f.name != "options"
)


def before_enqueue(definition: TaskDefinition) -> TaskDefinition:
    """``definition`` as the enqueue hooks leave it, its changed options validated like
    the caller's own (``using``). Called by every enqueue before the row is built."""
    for path, hook in (_stack or _load()).enqueue:
        changed = hook(definition)
        if changed is not definition:
            definition = _validated(definition, changed, path)
    return definition


def _validated(before: TaskDefinition, after: Any, path: str) -> TaskDefinition:
    if not isinstance(after, TaskDefinition):
        raise TypeError(
            f"PGQUEUE['MIDDLEWARE'] {path}: enqueue() returned {after!r}; return the task "
            "it was given, or task.using(...)"
        )
    if any(getattr(after, name) != getattr(before, name) for name in _DEFINITION_FIELDS):
        raise TypeError(
            f"PGQUEUE['MIDDLEWARE'] {path}: enqueue() returned another task than "
            f"{before.name!r}; it may change the call's options only: return "
            "task.using(...)"
        )
    changed = {
        name: getattr(after.options, name)
        for name in OPTION_NAMES
        if getattr(after.options, name) != getattr(before.options, name)
    }
    try:
        return before.using(**changed)
    except InvalidTaskError as exc:
        raise type(exc)(f"PGQUEUE['MIDDLEWARE'] {path}: {exc}; nothing was enqueued") from exc
