"""Celery's canvas (``signature``, ``chain``, ``group``, ``chord``) and every call's
publication, on this queue's enqueue and workflows.

A signature's ``apply_async()`` is an ``enqueue()`` of its task with the call's options
translated (options.py), in the caller's transaction. A chain, a group and a chord are
enqueues tied by ``after=`` (docs/workflows.md): each step waits for the steps before
it in the database, and a chord's callback runs once, after its last member. As in
Celery, a step receives what its parent returned as its first argument (a chord's
callback: the list of its members' results, in order), unless it is immutable
(``.si()``): the row notes which parents to read (its metadata's ``"celery"`` key),
and the worker reads their results when the step starts (``parent_results()``).

Where Celery and this queue differ (docs/celery.md): a step after a failed one is
cancelled (REVOKED) rather than left PENDING, and a chord whose member failed has its
callback cancelled rather than failed with a ChordError.
"""

from __future__ import annotations

import inspect
import os
import socket
import uuid
from collections.abc import Iterable
from typing import Any

from django_pgqueue.celery import options as celery_options
from django_pgqueue.celery import registry as celery_registry
from django_pgqueue.celery.encoding import encode
from django_pgqueue.celery.exceptions import Unsupported
from django_pgqueue.celery.result import TASK_ID_KEY, AsyncResult, GroupResult
from django_pgqueue.celery.signals import after_task_publish, before_task_publish
from django_pgqueue.celery.state import get_current_app
from django_pgqueue.core.conf import database_for, get_settings
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.options import validate_task_name
from django_pgqueue.core.reprs import short_repr
from django_pgqueue.core.retry import RetryPolicy
from django_pgqueue.tasking.registry import TaskDefinition
from django_pgqueue.tasking.workflows import Step
from django_pgqueue.tasking.workflows import group as group_steps

# The key of a row's metadata where a Celery call notes what the worker needs:
# "pipe" (the parent whose result is the first argument, or a chord's members, whose
# list of results is), "errback" (a link_error's task), "headers" (custom headers),
# "ignore_result".
META = "celery"

# The options apply_async() takes, beyond countdown/eta/expires/queue/priority/
# task_id/link/link_error/time_limit/soft_time_limit/serializer/headers/ignore_result:
# these are about publishing to a broker, and have no effect here.
_BROKER_OPTIONS = frozenset({
    "retry", "retry_policy", "add_to_parent", "producer", "connection", "publisher",
    "mandatory", "delivery_mode", "reply_to", "declare", "router", "result_cls",
    "route_name", "root_id", "parent_id", "group_index", "retries", "task_type",
    "replaced_task_nesting", "stamped_headers", "stamps",
})  # fmt: skip
_CALL_OPTIONS = frozenset({
    "countdown", "eta", "expires", "queue", "priority", "task_id", "link", "link_error",
    "time_limit", "soft_time_limit", "serializer", "headers", "ignore_result",
    "routing_key", "exchange", "compression", "shadow", "group_id", "chord", "chain",
    "immutable",
})  # fmt: skip
# Celery's protocol-2 headers; any other key a before_task_publish receiver adds is
# kept on the row (metadata) for the worker's request.headers.
_STANDARD_HEADERS = frozenset({
    "lang", "task", "id", "shadow", "eta", "expires", "group", "group_index", "retries",
    "timelimit", "root_id", "parent_id", "argsrepr", "kwargsrepr", "origin",
    "ignore_result", "replaced_task_nesting", "stamped_headers", "stamps",
})  # fmt: skip

_HOSTNAME = socket.gethostname()
# Celery's defaults for a task this process does not know (send_task of a name
# registered only in the workers): its retry policy is frozen at the call.
CELERY_MAX_RETRIES = 3
CELERY_RETRY_DELAY = 180


class Signature(dict):
    """A task call, not yet sent: ``add.s(2, 2)``, ``signature("proj.tasks.add",
    args=(2, 2), countdown=10)``. A dict, as Celery's is."""

    def __init__(
        self,
        task: Any = None,
        args: Any = None,
        kwargs: Any = None,
        options: dict[str, Any] | None = None,
        type: Any = None,
        subtask_type: str | None = None,
        immutable: bool = False,
        app: Any = None,
        **ex: Any,
    ) -> None:
        if isinstance(task, dict):
            super().__init__(task)
            self._type = None
            self._app = app
            return
        task_type = type if type is not None else (None if isinstance(task, str) else task)
        name = task if isinstance(task, str) else getattr(task_type, "name", task)
        super().__init__(
            task=name,
            args=tuple(args or ()),
            kwargs=dict(kwargs or {}),
            options={**(options or {}), **ex},
            subtask_type=subtask_type,
            immutable=immutable,
        )
        self._type = task_type
        self._app = app

    # -- Celery's attributes ---------------------------------------------------------
    @property
    def task(self) -> str:
        return self["task"]

    @property
    def name(self) -> str:
        return self["task"]

    @property
    def args(self) -> tuple[Any, ...]:
        return tuple(self["args"])

    @property
    def kwargs(self) -> dict[str, Any]:
        return self["kwargs"]

    @property
    def options(self) -> dict[str, Any]:
        return self["options"]

    @property
    def immutable(self) -> bool:
        return bool(self.get("immutable"))

    @property
    def subtask_type(self) -> str | None:
        return self.get("subtask_type")

    @property
    def type(self) -> Any:
        """The task object (None when no task of this name is registered here)."""
        if self._type is None:
            self._type = celery_registry.find(self.task)
        return self._type

    @property
    def app(self) -> Any:
        return self._app or getattr(self.type, "app", None) or get_current_app()

    @property
    def id(self) -> str | None:
        return self.options.get("task_id")

    # -- building ----------------------------------------------------------------------
    def clone(self, args: Any = None, kwargs: Any = None, **opts: Any) -> Signature:
        """A copy, with ``args`` before its own (unless immutable), ``kwargs`` and
        options merged."""
        copy = Signature(
            self._type or self.task,
            self._merged_args(args),
            {**self.kwargs, **(kwargs or {})},
            {**self.options, **opts},
            immutable=self.immutable,
            app=self._app,
        )
        return copy

    def _merged_args(self, args: Any) -> tuple[Any, ...]:
        if args and not self.immutable:
            return tuple(args) + self.args
        return self.args

    def set(self, immutable: bool | None = None, **options: Any) -> Signature:
        if immutable is not None:
            self["immutable"] = immutable
        self.options.update(options)
        return self

    def set_immutable(self, immutable: bool) -> None:
        self["immutable"] = immutable

    def link(self, callback: Signature) -> Signature:
        self.options.setdefault("link", []).append(callback)
        return callback

    def link_error(self, errback: Signature) -> Signature:
        self.options.setdefault("link_error", []).append(errback)
        return errback

    def on_error(self, errback: Signature) -> Signature:
        self.link_error(errback)
        return self

    def freeze(self, *args: Any, **kwargs: Any) -> Any:
        raise Unsupported(
            "freeze() has no counterpart: a task's id is its row's, given by the INSERT; "
            "apply_async() returns it at once (in your transaction), or choose one with "
            "apply_async(task_id=...)"
        )

    def __or__(self, other: Any) -> Any:
        if isinstance(other, group):
            return chain(self, other)
        if isinstance(other, _chain):
            return chain(self, *other.tasks)
        if isinstance(other, Signature):
            return chain(self, other)
        return NotImplemented

    def __deepcopy__(self, memo: dict[int, Any]) -> Signature:
        return self.clone()

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.task}({', '.join(parts)}){'!' if self.immutable else ''}"

    # -- calling -----------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the task's function here, now (as Celery does), with these arguments
        after the signature's."""
        task = _task_of(self)
        return task(*self._merged_args(args), **{**self.kwargs, **kwargs})

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Enqueue the call, in the caller's transaction; returns its AsyncResult."""
        if self.app.conf.task_always_eager:
            return self.apply(args, kwargs, **options)
        result, _ = _publish_node(self, args, kwargs, options, after=(), pipe=None)
        return result

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Run the call here, now (``task.apply()``); returns an EagerResult."""
        task = _task_of(self)
        return task.apply(
            self._merged_args(args), {**self.kwargs, **(kwargs or {})},
            **{**self.options, **options},
        )  # fmt: skip


def _task_of(sig: Signature) -> Any:
    task = sig.type
    if task is None:
        celery_registry.get(sig.task)  # raises NotRegistered, naming the known tasks
    return task


def takes_request(task: Any, partial: int) -> bool:
    """Whether an errback takes Celery's ``(request, exc, traceback)`` (three positional
    parameters beyond its ``partial`` arguments), else the failed task's id."""
    function = type(task).__dict__.get("__wrapped__")  # @app.task's function
    try:
        parameters = [
            p for p in inspect.signature(function or task.run).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]  # fmt: skip
    except (TypeError, ValueError):
        return False
    if function is not None and getattr(task, "_bind", False):
        parameters = parameters[1:]  # self
    return len(parameters) - partial >= 3


class _chain(Signature):
    """Tasks one after the other, each receiving its parent's result first:
    ``chain(add.s(2, 2), mul.s(4))`` or ``add.s(2, 2) | mul.s(4)``."""

    def __init__(self, *tasks: Any, **options: Any) -> None:
        if len(tasks) == 1 and not isinstance(tasks[0], Signature):
            tasks = tuple(tasks[0])
        super().__init__("celery.chain", (), {}, options, subtask_type="chain")
        self.tasks = [_signature(t) for t in tasks]

    def __or__(self, other: Any) -> Any:
        if isinstance(other, _chain):
            return chain(*self.tasks, *other.tasks)
        if isinstance(other, Signature):
            return chain(*self.tasks, other)
        return NotImplemented

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def clone(self, args: Any = None, kwargs: Any = None, **opts: Any) -> Signature:
        copy = type(self)(*[t.clone() for t in self.tasks], **{**self.options, **opts})
        if args or kwargs:
            copy.tasks[0] = copy.tasks[0].clone(args, kwargs)
        return copy

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        result, previous = None, None
        for index, task in enumerate(self.tasks):
            call_args = args if index == 0 else (previous,)
            result = task.apply(call_args, kwargs if index == 0 else None, **options)
            previous = result.get(propagate=True) if hasattr(result, "get") else result
        return result

    def __repr__(self) -> str:
        return " | ".join(repr(t) for t in self.tasks) or "chain()"


chain = _chain


class group(Signature):
    """Tasks side by side: ``group(add.s(i, i) for i in range(10))``; ``apply_async()``
    returns a GroupResult. A group followed by a task is a chord."""

    def __init__(self, *tasks: Any, **options: Any) -> None:
        if len(tasks) == 1 and not isinstance(tasks[0], Signature):
            tasks = tuple(tasks[0])
        super().__init__("celery.group", (), {}, options, subtask_type="group")
        self.tasks = [_signature(t) for t in tasks]

    def __or__(self, other: Any) -> Any:
        if isinstance(other, group):
            return chain(self, other)
        if isinstance(other, _chain):
            return chain(chord(self, other.tasks[0]), *other.tasks[1:])
        if isinstance(other, Signature):
            return chord(self, other)
        return NotImplemented

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def __iter__(self) -> Any:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def clone(self, args: Any = None, kwargs: Any = None, **opts: Any) -> Signature:
        return type(self)(
            *[t.clone(args, kwargs) for t in self.tasks], **{**self.options, **opts}
        )

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        return GroupResult(
            str(uuid.uuid4()), [t.apply(args, kwargs, **options) for t in self.tasks]
        )

    def __repr__(self) -> str:
        return f"group([{', '.join(repr(t) for t in self.tasks)}])"


class chord(Signature):
    """A group, then a callback that runs once with the list of their results:
    ``chord(add.s(i, i) for i in range(10))(tsum.s())`` or ``chord(header, body)``."""

    def __init__(self, header: Any, body: Any = None, **options: Any) -> None:
        super().__init__("celery.chord", (), {}, options, subtask_type="chord")
        self.header = header if isinstance(header, group) else group(header)
        self.body = None if body is None else _signature(body)

    @property
    def tasks(self) -> list[Signature]:
        return self.header.tasks

    def __call__(self, body: Any = None, **options: Any) -> Any:
        if body is not None:
            return chord(self.header, body).apply_async(**options)
        return self.apply_async(**options)

    def __or__(self, other: Any) -> Any:
        if isinstance(other, Signature):
            return chain(self, other)
        return NotImplemented

    def clone(self, args: Any = None, kwargs: Any = None, **opts: Any) -> Signature:
        return chord(
            self.header.clone(args, kwargs), self.body and self.body.clone(),
            **{**self.options, **opts},
        )  # fmt: skip

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        if self.body is None:
            raise InvalidTaskError(_NO_BODY)
        return super().apply_async(args, kwargs, **options)

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        if self.body is None:
            raise InvalidTaskError(_NO_BODY)
        results = self.header.apply(args, kwargs, **options)
        return self.body.apply((results.get(propagate=True),))

    def __repr__(self) -> str:
        return f"chord({self.header!r}, {self.body!r})"


_NO_BODY = "a chord needs a body: chord(header, body) or chord(header)(body)"


def signature(varies: Any, *args: Any, **kwargs: Any) -> Signature:
    """``signature("proj.tasks.add", args=(2, 2), countdown=10)``, or a signature (or its
    dict) as a Signature."""
    if isinstance(varies, dict):
        if isinstance(varies, Signature):
            return varies.clone()
        return _from_dict(varies)
    return Signature(varies, *args, **kwargs)


subtask = signature


def maybe_signature(d: Any, app: Any = None, clone: bool = False) -> Any:
    if d is None:
        return None
    sig = _signature(d)
    return sig.clone() if clone else sig


def _signature(value: Any) -> Signature:
    if isinstance(value, Signature):
        return value
    if isinstance(value, dict):
        return _from_dict(value)
    raise InvalidTaskError(
        f"{short_repr(value)} is not a signature: use task.s(...), task.si(...) or "
        "signature('name', args=...)"
    )


def _from_dict(d: dict[str, Any]) -> Signature:
    kind = d.get("subtask_type")
    tasks = d.get("kwargs", {}).get("tasks", ())
    if kind == "chain":
        return chain(*tasks, **d.get("options", {}))
    if kind == "group":
        return group(*tasks, **d.get("options", {}))
    if kind == "chord":
        return chord(d["kwargs"]["header"], d["kwargs"].get("body"), **d.get("options", {}))
    return Signature(
        d["task"], d.get("args"), d.get("kwargs"), d.get("options"),
        immutable=d.get("immutable", False),
    )  # fmt: skip


class _Refused:
    """Celery's chunks / xmap / xstarmap: there is no counterpart."""

    def __init__(self, name: str, instead: str) -> None:
        self.name, self.instead = name, instead

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise Unsupported(
            f"{self.name} has no counterpart in django_pgqueue.celery: {self.instead}"
        )

    def __repr__(self) -> str:
        return f"<{self.name}: refused>"


_ONE_ROW_EACH = (
    "enqueue one task per item with a group (group(task.s(*item) for item in items)), "
    "which writes them in one INSERT; or django_pgqueue's task.enqueue_many(items)"
)
chunks = _Refused("chunks", _ONE_ROW_EACH)
xmap = _Refused("xmap (task.map)", _ONE_ROW_EACH)
xstarmap = _Refused("xstarmap (task.starmap)", _ONE_ROW_EACH)


# -- publication --------------------------------------------------------------------
def _publish_node(
    node: Signature, args: Any, kwargs: Any, options: dict[str, Any],
    after: Iterable[int], pipe: Any,
) -> tuple[Any, list[int] | int]:
    """Enqueue a signature, chain, group or chord after the tasks ``after``, piping the
    result of ``pipe`` (an id, a list of ids, or None) into its first argument. Returns
    its result and its tail: the id whose result the next step receives, or the list
    of ids (a group's members) whose results it receives as a list."""
    if isinstance(node, chord):
        header, tails = _publish_node(node.header, args, kwargs, options, after, pipe)
        result, tail = _publish_node(node.body, None, None, {}, tails, tails)
        result.parent = header
        return result, tail
    if isinstance(node, group):
        return _publish_group(node, args, kwargs, {**node.options, **options}, after, pipe)
    if isinstance(node, _chain):
        if not node.tasks:
            raise InvalidTaskError("an empty chain has nothing to run")
        result, tail, parent = None, pipe, None
        ids = list(after)
        links = _links(node.options, "link")
        for index, step in enumerate(node.tasks):
            first = index == 0
            extra = options if first else {}
            if index == len(node.tasks) - 1 and links:
                extra = {**extra, "link": [*_links(step.options, "link"), *links]}
            if node.options.get("link_error"):
                extra = {**extra, "link_error": [
                    *_links(step.options, "link_error"), *_links(node.options, "link_error"),
                ]}  # fmt: skip
            result, tail = _publish_node(
                step, args if first else None, kwargs if first else None, extra, ids, tail
            )
            if parent is not None and getattr(result, "parent", None) is None:
                result.parent = parent
            parent = result
            ids = tail if isinstance(tail, list) else [tail]
        return result, tail
    return _publish(node, args, kwargs, options, after, pipe)


def _publish_group(
    node: group, args: Any, kwargs: Any, options: dict[str, Any],
    after: Iterable[int], pipe: Any,
) -> tuple[GroupResult, list[int]]:
    """A group's members: plain calls of the same task and options in one INSERT
    (workflows.group), nested chains and chords one by one."""
    after = list(after)
    results: list[Any] = [None] * len(node.tasks)
    tails: list[list[int]] = [[] for _ in node.tasks]
    plain: list[tuple[int, Prepared]] = []
    for index, member in enumerate(node.tasks):
        if type(member) is Signature and not _has_links(member, options):
            plain.append((index, _prepare(member, args, kwargs, options, pipe)))
        else:
            result, tail = _publish_node(member, args, kwargs, options, after, pipe)
            results[index], tails[index] = result, tail if isinstance(tail, list) else [tail]
    if plain:
        ids = group_steps([c.step for _, c in plain], after=after)
        for (index, call), task_id in zip(plain, ids, strict=True):
            results[index] = call.published(task_id)
            tails[index] = [task_id]
    return GroupResult(str(uuid.uuid4()), results), [i for tail in tails for i in tail]


def _has_links(sig: Signature, options: dict[str, Any]) -> bool:
    return any(source.get(k) for source in (sig.options, options) for k in ("link", "link_error"))


def links(value: Any) -> list[Signature]:
    """A link or link_error option (a signature, or a list of them) as a list."""
    if not value:
        return []
    return [_signature(v) for v in (value if isinstance(value, list | tuple) else [value])]


def _links(options: dict[str, Any], key: str) -> list[Signature]:
    return links(options.get(key))


def _publish(
    sig: Signature, args: Any, kwargs: Any, options: dict[str, Any],
    after: Iterable[int], pipe: Any,
) -> tuple[AsyncResult, int]:
    """One call: translated, enqueued after ``after``, then its links; its result
    and its row's id."""
    call = _prepare(sig, args, kwargs, options, pipe, after=list(after))
    if call.on_commit:
        task_id = call.step.task.enqueue_on_commit(*call.step.args, **call.step.kwargs)
    else:
        task_id = call.step.enqueue()
    result = call.published(task_id)
    for link in call.links:
        _publish_node(link, None, None, {}, [task_id], task_id)
    for errback in call.errbacks:
        _publish_errback(errback, task_id)
    return result, task_id


def _publish_errback(errback: Signature, parent: int) -> None:
    """A link_error: a task after ``parent`` that runs however it ends (the worker
    cancels it when the parent succeeded), told which task it is the errback of."""
    call = _prepare(errback, None, None, {}, None, after=[parent], errback_of=parent)
    call.published(call.step.enqueue(after_failure="run"))


class Prepared:
    """One call ready to enqueue: its Step (the task with the call's options), and
    what publishing it sends and enqueues after it."""

    def __init__(
        self, sig: Signature, step: Step, headers: dict[str, Any], body: tuple,
        queue: str, links: list[Signature], errbacks: list[Signature], on_commit: bool,
    ) -> None:
        self.sig, self.step, self.headers, self.body = sig, step, headers, body
        self.queue, self.links, self.errbacks, self.on_commit = queue, links, errbacks, on_commit

    def published(self, task_id: int) -> AsyncResult:
        """after_task_publish, once the row is written; the call's result (by the
        task_id it chose, else by the row's id)."""
        if self.headers.get("id") is None:
            self.headers["id"] = str(task_id)
        _send(after_task_publish, self.sig.task, body=self.body, headers=self.headers,
              exchange="", routing_key=self.queue)  # fmt: skip
        return AsyncResult(
            self.headers["id"], task_name=self.sig.task, app=self.sig.app,
            database=database_for(self.queue),
        )  # fmt: skip


def _prepare(
    sig: Signature, args: Any, kwargs: Any, options: dict[str, Any], pipe: Any,
    after: list[int] | None = None, errback_of: int | None = None,
) -> Prepared:
    """The call of ``sig`` with ``args``/``kwargs`` (before its own) and ``options``
    (over its own), translated onto the task; before_task_publish is sent here."""
    app = sig.app
    conf = app.conf
    options = {**sig.options, **options}
    _check_options(options)
    name = sig.task
    call_args = list(sig._merged_args(args))
    call_kwargs = {**sig.kwargs, **(kwargs or {})}
    task = sig.type
    definition = task.definition() if task is not None else unregistered(name, conf)
    style = celery_options.priority_style(conf)
    using: dict[str, Any] = {}
    routed = celery_options.route(
        conf.task_routes, name, call_args, call_kwargs, options, task
    ) if options.get("queue") is None else {}  # fmt: skip
    queue = options.get("queue") or routed.get("queue") or options.get("routing_key")
    if queue:
        using["queue"] = queue
    chosen = options.get("priority", routed.get("priority"))
    if chosen is not None:
        using["priority"] = celery_options.priority(chosen, style)
    using.update(celery_options.when(options.get("countdown"), options.get("eta")))
    if options.get("expires") is not None:
        using["expires"] = celery_options.expires(options["expires"])
    if options.get("time_limit") is not None or options.get("soft_time_limit") is not None:
        using["timeout"] = celery_options.time_limit(
            options.get("time_limit"), options.get("soft_time_limit")
        )
    celery_options.check_serializer(options.get("serializer"), "serializer")
    task_id = options.get("task_id")
    if task_id is not None:
        if not isinstance(task_id, str | uuid.UUID) or not str(task_id):
            raise InvalidTaskError(f"task_id must be a string, not {short_repr(task_id)}")
        using["unique_key"] = TASK_ID_KEY + str(task_id)
    meta: dict[str, Any] = {}
    if pipe is not None and not sig.immutable:
        meta["pipe"] = pipe
    if errback_of is not None:
        meta["errback"] = errback_of
    if options.get("ignore_result"):
        meta["ignore_result"] = True
    queue = using.get("queue") or definition.options.queue or definition.queue
    headers: dict[str, Any] = {"id": None if task_id is None else str(task_id)}
    body: tuple = ()
    if before_task_publish.receivers or after_task_publish.receivers:  # else: not built
        headers = _headers(name, task_id, using, options, call_args, call_kwargs)
        body = (call_args, call_kwargs, {"callbacks": None, "errbacks": None, "chain": None,
                                         "chord": None})  # fmt: skip
    _send(before_task_publish, name, body=body, exchange="", routing_key=queue,
          headers=headers, properties={"correlation_id": headers["id"], "priority": chosen},
          declare=[], retry_policy=None)  # fmt: skip
    custom = {k: v for k, v in headers.items() if k not in _STANDARD_HEADERS}
    custom.update(options.get("headers") or {})
    if custom:
        meta["headers"] = custom
    if meta:
        using["metadata"] = {**definition.options.metadata, META: meta}
    if after:
        using["after"] = [*definition.options.after, *after]
    step = Step(
        definition.using(**using) if using else definition,
        tuple(encode(call_args)), encode(call_kwargs),
    )  # fmt: skip
    return Prepared(
        sig, step, headers, body, queue, _links(options, "link"),
        _links(options, "link_error"), bool(options.get("on_commit")),
    )  # fmt: skip


def _check_options(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - _CALL_OPTIONS - _BROKER_OPTIONS - {"on_commit"})
    if unknown:
        raise TypeError(
            f"apply_async() got unknown option(s) {', '.join(unknown)}; it takes "
            f"{', '.join(sorted(_CALL_OPTIONS - {'immutable'}))} (docs/celery.md, 'Calling')"
        )
    refused = {
        "exchange": "a task goes to a queue: pass queue= (there are no exchanges)",
        "shadow": "a task's name is its row's task_name; the admin and logs show it",
        "group_id": "a group is its members' rows: build it with group(...)",
        "chord": "build the chord with chord(header, body)",
        "chain": "build the chain with chain(...) or |",
    }
    for key, instead in refused.items():
        if options.get(key):
            raise Unsupported(f"apply_async({key}=...) has no counterpart: {instead}")
    if options.get("compression") is not None:
        raise Unsupported(
            "apply_async(compression=...) has no counterpart: PostgreSQL compresses large "
            "jsonb values itself (TOAST)"
        )


def _headers(
    name: str, task_id: Any, using: dict[str, Any], options: dict[str, Any],
    args: list[Any], kwargs: dict[str, Any],
) -> dict[str, Any]:
    run_at = using.get("run_at")
    expiry = options.get("expires")
    return {
        "lang": "py",
        "task": name,
        "id": None if task_id is None else str(task_id),
        "shadow": None,
        "eta": run_at.isoformat() if run_at is not None else None,
        "expires": expiry.isoformat() if hasattr(expiry, "isoformat") else expiry,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [options.get("soft_time_limit"), options.get("time_limit")],
        "root_id": None,
        "parent_id": None,
        "argsrepr": repr(tuple(args)),
        "kwargsrepr": repr(kwargs),
        "origin": f"{os.getpid()}@{_HOSTNAME}",
        "ignore_result": bool(options.get("ignore_result")),
    }


def _send(signal: Any, sender: str, **named: Any) -> None:
    if signal.receivers:
        signal.send(sender=sender, **named)


def unregistered(name: str, conf: Any) -> TaskDefinition:
    """The definition of a call to a task this process does not have (``send_task`` of
    a name only the workers register): Celery's defaults (3 retries, 180 s apart), the
    default queue, JSON arguments. It waits, pending, until a worker that has it runs
    (docs/tasks.md, "Routing")."""
    defaults = get_settings()
    try:
        return TaskDefinition(
            func=_not_here,
            name=validate_task_name(name),
            queue=conf.task_default_queue or defaults.DEFAULT_QUEUE,
            priority=defaults.DEFAULT_PRIORITY,
            max_attempts=CELERY_MAX_RETRIES + 1,
            backoff=RetryPolicy.from_value(CELERY_RETRY_DELAY),
            timeout=defaults.DEFAULT_TIMEOUT,
            version=1,
            takes_context=True,
            retry_on=(),
            discard_on=("builtins.TimeoutError",),
        )
    except InvalidTaskError as exc:
        raise InvalidTaskError(f"send_task({name!r}): {exc}") from exc


def _not_here(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a task sent by name is run by the workers that register it")
