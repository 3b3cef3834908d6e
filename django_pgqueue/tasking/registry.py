"""Task definitions and the registry of decorated functions.

The registry is the only way a worker finds code: a row names a task, and the worker
looks the name up here. Nothing ever imports a dotted path read from a row.

The options a task and a call take, and their checks, are in options.py (their names
are importable from here too).
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from importlib.util import find_spec
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    TypedDict,
    TypeVar,
    Unpack,
    overload,
)

from django.core.exceptions import ImproperlyConfigured

from django_pgqueue.core.conf import SETTINGS_BY_NAME, get_settings
from django_pgqueue.core.exceptions import InvalidTaskError, TaskNotRegistered
from django_pgqueue.core.limits import Rate, parse_rate
from django_pgqueue.core.options import (
    AFTER_FAILURE,
    ON_FAILURE,
    OPTION_NAMES,
    TASK_DEFAULT,
    VERSION_MAX,
    Call,
    EnqueueOptions,
    UniqueState,
    UsingOptions,
    check_expires_after_start,
    check_sequenced,
    is_number,
    validate_after,
    validate_atomic,
    validate_backoff,
    validate_commit_alias,
    validate_delay,
    validate_encrypt,
    validate_exceptions,
    validate_expires,
    validate_max_attempts,
    validate_on_conflict,
    validate_priority,
    validate_queue,
    validate_task_name,
    validate_timeout,
    validate_unique_for,
    validate_unique_states,
)
from django_pgqueue.core.options import LIVE_STATES as LIVE_STATES
from django_pgqueue.core.options import MAX_ATTEMPTS_LIMIT as MAX_ATTEMPTS_LIMIT
from django_pgqueue.core.options import PRIORITY_MAX as PRIORITY_MAX
from django_pgqueue.core.options import PRIORITY_MIN as PRIORITY_MIN
from django_pgqueue.core.options import TASK_NAME_MAX_LENGTH as TASK_NAME_MAX_LENGTH
from django_pgqueue.core.options import TASK_STATES as TASK_STATES
from django_pgqueue.core.options import call as call
from django_pgqueue.core.options import in_utc as in_utc
from django_pgqueue.core.reprs import short_repr
from django_pgqueue.core.retry import RetryPolicy

if TYPE_CHECKING:
    from django_pgqueue.tasking.batch import BatchCall
    from django_pgqueue.tasking.context import TaskContext

# A task's parameters (what enqueue, step and a direct call take) and its function's
# return type (for an async def, the coroutine: what a direct call returns). R is
# covariant: a task returning int is a task returning object.
P = ParamSpec("P")
R = TypeVar("R", covariant=True)


class _TaskOptions(TypedDict, total=False):
    """The options of ``@task(...)`` besides ``takes_context`` and ``batch_size``."""

    name: str | None
    queue: str | None
    priority: int | None
    max_attempts: int | None
    backoff: RetryPolicy | dict[str, float] | float | None
    timeout: float | None
    version: int
    concurrency_key: Callable[..., str | None] | None
    key_concurrency: int | None
    key_rate: str | None
    fair_key: Callable[..., str | None] | None
    sequence_key: Callable[..., str | None] | None
    on_failure: Literal["hold", "continue"]
    batch_wait: float
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | None
    discard_on: type[BaseException] | tuple[type[BaseException], ...]
    expires: float | timedelta | None
    unique_for: float | timedelta | None
    unique_states: Iterable[UniqueState] | None
    on_conflict: Literal["keep", "replace"] | None
    atomic: bool
    encrypt: bool | None


class TaskOptions(_TaskOptions, total=False):
    """The options of ``@task(...)`` besides ``takes_context``, for type checkers (the
    overloads of ``task``; tests/test_typing.py keeps them in step with its signature)."""

    batch_size: int | None


@dataclass(frozen=True, eq=False)
class TaskDefinition(Generic[P, R]):
    """A function registered with ``@task``; enqueue it, or call it directly.

    ``TaskDefinition[P, R]``: ``P`` are the arguments its enqueue, step and direct call
    take, ``R`` what its function returns (docs/tasks.md, "Type checking").
    """

    func: Callable[..., Any]
    name: str
    queue: str
    priority: int
    max_attempts: int
    backoff: RetryPolicy
    timeout: float | None
    version: int
    takes_context: bool
    options: EnqueueOptions = field(default_factory=EnqueueOptions)
    # Per-key concurrency (docs/limits.md): at most key_concurrency running rows per
    # (queue, key), fleet-wide; the key comes from using(concurrency_key=...) or from
    # concurrency_key(*args, **kwargs). None: the task is not limited by key.
    concurrency_key: Callable[..., str | None] | None = None
    key_concurrency: int | None = None
    # Per-key rate (docs/limits.md): at most key_rate.count starts per key_rate.seconds
    # per (queue, key), fleet-wide (None: no rate per key).
    key_rate: Rate | None = None
    # Fair share (docs/tenants.md): the key of a call, computed at enqueue from its
    # arguments (or given by using(fair_key=...)); keys share the slots of a task by
    # their weights. None: not a fair task.
    fair_key: Callable[..., str | None] | None = None
    # Ordered work per key (docs/tenants.md): the sequence of a call, computed at enqueue
    # from its arguments (or given by using(sequence_key=...)); the tasks of one
    # sequence run one at a time, in enqueue order. None: not a sequenced task.
    # on_failure: what a task that fails for good does to the rest of its sequence,
    # "hold" it until released, or let it "continue".
    sequence_key: Callable[..., str | None] | None = None
    on_failure: str = "hold"
    # Batch handlers (docs/tenants.md, batch.py): the function takes a list of at most
    # batch_size calls, the due calls a worker found, or those that came within
    # batch_wait seconds of the first. None: a task of one call.
    batch_size: int | None = None
    batch_wait: float = 0.0
    # Which exceptions retry (None: all) and which fail at once, as exception names
    # (module.qualname); frozen on each row at enqueue.
    retry_on: tuple[str, ...] | None = None
    discard_on: tuple[str, ...] = ()
    # Seconds after its enqueue by which a task must have started (None: no expiry).
    expires: float | None = None
    # Unique jobs: defaults for the calls given a unique_key (docs/tasks.md).
    unique_for: float | None = None
    unique_states: tuple[str, ...] | None = None
    on_conflict: str | None = None
    # The handler runs in a transaction on the task's database that also carries its
    # success, fenced by its lease (worker/atomic.py, docs/guarantees.md).
    atomic: bool = False
    # Its payloads are encrypted in its rows (encryption.py, docs/security.md); None:
    # as PGQUEUE["ENCRYPT_ALL"] says when the task is enqueued.
    encrypt: bool | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    @property
    def route(self) -> str:
        """The key a worker claims by: ``name@version``."""
        return f"{self.name}@{self.version}"

    @property
    def call_timeout(self) -> float | None:
        """The ceiling of this call: ``using(timeout=...)`` if given, else the task's."""
        if self.options.timeout is TASK_DEFAULT:
            return self.timeout
        return self.options.timeout

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)  # type: ignore[no-any-return]

    def using(self, **typed: Unpack[UsingOptions]) -> TaskDefinition[P, R]:
        """A copy of this task with per-call options (queue, priority, run_at or delay, ...).

        The options are typed (UsingOptions) for type checkers; an unknown one is still
        a TypeError here, for callers that are not checked.
        """
        options: dict[str, Any] = dict(typed)
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise TypeError(
                f"unknown enqueue option(s) {unknown} for task {self.name!r}; "
                f"valid options: {', '.join(OPTION_NAMES)}"
            )
        if "queue" in options:
            validate_queue(options["queue"])
        if "priority" in options:
            validate_priority(options["priority"])
        if "max_attempts" in options:
            validate_max_attempts(options["max_attempts"])
        if "timeout" in options:
            options["timeout"] = validate_timeout(options["timeout"])
        if "backoff" in options:
            options["backoff"] = validate_backoff(options["backoff"])
        if "delay" in options:
            options["delay"] = validate_delay(options["delay"])
        if "metadata" in options and not isinstance(options["metadata"], dict):
            raise InvalidTaskError("metadata must be a dict of JSON values")
        if options.get("commit_alias") is not None:
            validate_commit_alias(options["commit_alias"])
        if (
            options.get("concurrency_key") is not None
            and self.key_concurrency is None
            and self.key_rate is None
        ):
            raise InvalidTaskError(
                f"task {self.name!r} declares no per-key limit, so a concurrency_key would "
                "limit nothing: declare it with @task(key_concurrency=N), "
                "@task(key_rate='N/period') or @task(concurrency_key=...)"
            )
        if options.get("fair_key") is not None and self.fair_key is None:
            raise InvalidTaskError(
                f"task {self.name!r} is not a fair task, so a fair_key would share nothing: "
                "declare it with @task(fair_key=...)"
            )
        if options.get("sequence_key") is not None and self.sequence_key is None:
            raise InvalidTaskError(
                f"task {self.name!r} is not a sequenced task, so a sequence_key would order "
                "nothing: declare it with @task(sequence_key=...)"
            )
        if "after" in options:
            options["after"] = validate_after(options["after"])
        for rule in ("retry_on", "discard_on"):
            if options.get(rule) is not None:
                options[rule] = validate_exceptions(options[rule], rule)
        if options.get("expires") is not None:
            options["expires"] = validate_expires(options["expires"])
        if options.get("unique_for") is not None:
            options["unique_for"] = validate_unique_for(options["unique_for"])
        if options.get("unique_states") is not None:
            options["unique_states"] = validate_unique_states(options["unique_states"])
        if options.get("on_conflict") is not None:
            validate_on_conflict(options["on_conflict"])
        if "atomic" in options:
            validate_atomic(options["atomic"], self.func)
            if options["atomic"] and self.batch_size is not None:
                raise InvalidTaskError(
                    f"{self.name} is a batch handler (batch_size), which does not run "
                    "atomically: its calls' leases are settled one by one"
                )
        if "after_failure" in options and options["after_failure"] not in AFTER_FAILURE:
            raise InvalidTaskError(
                f"after_failure must be one of {', '.join(map(repr, AFTER_FAILURE))}, "
                f"not {short_repr(options['after_failure'])}"
            )
        merged = replace(self.options, **options)
        if merged.after and merged.unique_key is not None:
            raise InvalidTaskError(
                "a task cannot have both after= and unique_key: a duplicate would share "
                "none of the original's dependencies"
            )
        if merged.run_at is not None and merged.delay is not None:
            raise InvalidTaskError("pass either run_at or delay, not both")
        if self.sequence_key is not None:
            check_sequenced(self.name, merged)
        check_expires_after_start(merged, self.expires)
        return replace(self, options=merged)

    # enqueue.py and middleware.py take a TaskDefinition, so these three methods import
    # enqueue when called: an import circle kept on purpose, listed in pyproject.toml's
    # import contracts (docs/architecture.md).
    def enqueue(self, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """Insert the task in the current transaction; returns its id."""
        from django_pgqueue.tasking.enqueue import enqueue

        return enqueue(self, args, kwargs)

    def enqueue_on_commit(self, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """Insert the task when the outermost atomic block commits; returns its id now."""
        from django_pgqueue.tasking.enqueue import enqueue_on_commit

        return enqueue_on_commit(self, args, kwargs)

    def step(self, /, *args: P.args, **kwargs: P.kwargs) -> Step:
        """This call as a step of a workflow (chain, group, chord: workflows.py)."""
        return Step(self, args, kwargs)

    def enqueue_many(
        self, calls: Iterable[Call | tuple[Any, ...] | dict[str, Any] | object]
    ) -> list[int]:
        """Insert many tasks in one statement; returns their ids in order.

        Each item is a ``tuple`` of positional args, a ``dict`` of keyword args, a
        ``call(*args, **kwargs)``, or any other value as the single positional arg (so
        a type checker accepts any item: the items' fit to the function is not checked
        statically).
        """
        from django_pgqueue.tasking.enqueue import enqueue_many

        return enqueue_many(self, calls)


@dataclass(frozen=True)
class Step:
    """One call of a task, not yet enqueued: ``send_receipt.step(order.id)``; chains,
    groups and chords (workflows.py) enqueue steps."""

    task: TaskDefinition[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def enqueue(self, after: Iterable[int] = (), after_failure: str | None = None) -> int:
        options: dict[str, Any] = {}
        if after:
            options["after"] = [*self.task.options.after, *after]
        if after_failure is not None:
            options["after_failure"] = after_failure
        definition = self.task.using(**options) if options else self.task
        return definition.enqueue(*self.args, **self.kwargs)


class ContextTaskDefinition(TaskDefinition[P, R]):
    """A task declared with ``takes_context=True``: its function takes a TaskContext
    first, so a direct call passes one, while enqueue and step take only ``P``."""

    def __call__(  # type: ignore[override]
        self, context: TaskContext, /, *args: P.args, **kwargs: P.kwargs
    ) -> R:  # pyright: ignore[reportIncompatibleMethodOverride]
        return self.func(context, *args, **kwargs)  # type: ignore[no-any-return]


class Registry:
    """(task name, handler version) -> TaskDefinition. Filled by importing modules that
    use ``@task``.

    One process may hold several versions of a task (the old handler kept beside the
    new one during a rollout): each is routed by (name, version), and a worker claims
    exactly the pairs registered here.
    """

    def __init__(self) -> None:
        self._tasks: dict[str, dict[int, TaskDefinition[..., Any]]] = {}
        self._lock = threading.Lock()

    def register(self, definition: TaskDefinition[..., Any]) -> None:
        with self._lock:
            versions = self._tasks.setdefault(definition.name, {})
            existing = versions.get(definition.version)
            if existing is not None and _origin(existing.func) != _origin(definition.func):
                raise ImproperlyConfigured(
                    f"task {definition.name!r} version {definition.version} is registered "
                    f"twice: by {_origin(existing.func)} and by {_origin(definition.func)}; "
                    "give one of them another name=... or version=..."
                )
            versions[definition.version] = definition

    def unregister(self, name: str, version: int | None = None) -> None:
        """Forget a task (every version of it, unless ``version`` is given)."""
        with self._lock:
            if version is None:
                self._tasks.pop(name, None)
                return
            versions = self._tasks.get(name, {})
            versions.pop(version, None)
            if not versions:
                self._tasks.pop(name, None)

    def get(self, name: str, version: int | None = None) -> TaskDefinition[..., Any]:
        """The definition of ``name`` at ``version`` (default: the newest registered)."""
        versions = self._tasks.get(name)
        if versions and version is None:
            return versions[max(versions)]
        if versions and version in versions:
            return versions[version]
        if versions:
            raise TaskNotRegistered(
                f"task {name!r} version {version} is not registered in this process; "
                f"registered versions: {', '.join(map(str, sorted(versions)))}. Keep the old "
                "handler beside the new one (@task(name=..., version=...)) while rows of "
                "that version remain"
            )
        known = ", ".join(sorted(self._tasks)) or "(none)"
        raise TaskNotRegistered(
            f"task {name!r} is not registered in this process; known tasks: {known}. "
            "Is the module that defines it imported (an installed app's tasks.py, or "
            "PGQUEUE['TASK_MODULES'])?"
        )

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def all(self) -> list[TaskDefinition[..., Any]]:
        """Every registered (name, version), by name then version."""
        return [
            definition
            for name in sorted(self._tasks)
            for _, definition in sorted(self._tasks[name].items())
        ]


def _origin(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


registry = Registry()


@overload
def task(func: Callable[P, R], /) -> TaskDefinition[P, R]: ...


@overload
def task(
    *, batch_size: int, takes_context: Literal[False] = False, **options: Unpack[_TaskOptions]
) -> Callable[[Callable[[list[BatchCall]], R]], TaskDefinition[..., R]]: ...


@overload
def task(
    *, takes_context: Literal[False] = False, **options: Unpack[TaskOptions]
) -> Callable[[Callable[P, R]], TaskDefinition[P, R]]: ...


@overload
def task(
    *, takes_context: Literal[True], **options: Unpack[TaskOptions]
) -> Callable[[Callable[Concatenate[TaskContext, P], R]], ContextTaskDefinition[P, R]]: ...


@overload
def task(
    *, takes_context: bool, **options: Unpack[TaskOptions]
) -> Callable[[Callable[..., R]], TaskDefinition[..., R]]: ...


def task(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    backoff: Any = None,
    timeout: float | None = TASK_DEFAULT,
    version: int = 1,
    takes_context: bool = False,
    concurrency_key: Callable[..., str | None] | None = None,
    key_concurrency: int | None = None,
    key_rate: str | None = None,
    fair_key: Callable[..., str | None] | None = None,
    sequence_key: Callable[..., str | None] | None = None,
    on_failure: Literal["hold", "continue"] = "hold",
    batch_size: int | None = None,
    batch_wait: float = 0.0,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
    discard_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    expires: float | timedelta | None = None,
    unique_for: float | timedelta | None = None,
    unique_states: Iterable[UniqueState] | None = None,
    on_conflict: Literal["keep", "replace"] | None = None,
    atomic: bool = False,
    encrypt: bool | None = None,
) -> Any:
    """Register a function as a task: ``@task`` or ``@task(queue="emails", ...)``.

    ``name`` defaults to the function's dotted path. ``timeout`` defaults to
    PGQUEUE["DEFAULT_TIMEOUT"]; ``timeout=None`` means no ceiling. ``version`` is the
    handler version: a worker only claims the (name, version) pairs it has registered.
    With ``takes_context=True`` the function receives a TaskContext as its first argument.
    ``concurrency_key`` (a function of the task's arguments returning a string or None)
    and ``key_concurrency`` (default 1, unless ``key_rate`` is given) limit how many
    tasks of one key run at once across the fleet; ``key_rate`` (``"100/m"``) how many
    of one key start per period (docs/limits.md). ``fair_key`` (a function of the task's
    arguments returning a string or None) makes the task fair: the keys it returns
    share the task's slots by their weights (docs/tenants.md). ``sequence_key`` (the
    same kind of function) orders the task: the calls of one key run one at a time, in
    enqueue order; ``on_failure`` says what one that fails for good does to the rest,
    "hold" them until released or "continue" (docs/tenants.md). With ``batch_size`` the
    function takes a list of calls (``BatchCall``), at most that many, or those due
    within ``batch_wait`` seconds of the first (docs/tenants.md). ``discard_on`` (exception classes)
    fails the task at once when its handler raises one of them; with ``retry_on``, only those retry
    and any other exception fails at once (docs/tasks.md, "Retrying by exception").
    ``expires`` (seconds) is the default expiry: a task not started that long after
    its enqueue never starts (docs/tasks.md, "Expiry"). ``unique_for``,
    ``unique_states`` and ``on_conflict`` are the defaults of the calls given a
    ``unique_key`` (docs/tasks.md, "unique_key"). ``atomic=True`` runs the handler in a
    transaction on the task's database that commits with the attempt's success, and only
    while the attempt holds its lease: its writes there happen exactly once
    (docs/guarantees.md, "Exactly-once effects in the task's database").
    ``encrypt=True`` encrypts the task's arguments, result, checkpoint, progress and
    signal payloads in its rows with PGQUEUE["ENCRYPTION_KEYS"]; left out (None), as
    PGQUEUE["ENCRYPT_ALL"] says (docs/security.md, "Encrypted payloads").
    """

    def decorate(fn: Callable[..., Any]) -> TaskDefinition[..., Any]:
        conf = get_settings()
        if isinstance(version, bool) or not isinstance(version, int):
            raise ImproperlyConfigured(f"task version must be an int, not {version!r}")
        if not 0 <= version <= VERSION_MAX:
            raise ImproperlyConfigured(
                f"task version {short_repr(version)} is out of range: use 0..{VERSION_MAX}"
            )
        if concurrency_key is not None and not callable(concurrency_key):
            raise ImproperlyConfigured(
                f"@task on {_origin(fn)}: concurrency_key must be a function of the task's "
                f"arguments returning a string, not {short_repr(concurrency_key)}; pass a "
                "fixed key per call with .using(concurrency_key=...)"
            )
        if fair_key is not None and not callable(fair_key):
            raise ImproperlyConfigured(
                f"@task on {_origin(fn)}: fair_key must be a function of the task's "
                f"arguments returning a string, not {short_repr(fair_key)}; pass a "
                "fixed key per call with .using(fair_key=...)"
            )
        if sequence_key is not None and not callable(sequence_key):
            raise ImproperlyConfigured(
                f"@task on {_origin(fn)}: sequence_key must be a function of the task's "
                f"arguments returning a string, not {short_repr(sequence_key)}; pass a "
                "fixed key per call with .using(sequence_key=...)"
            )
        if on_failure not in ON_FAILURE:
            raise ImproperlyConfigured(
                f"@task on {_origin(fn)}: on_failure must be one of "
                f"{', '.join(map(repr, ON_FAILURE))}, not {short_repr(on_failure)}"
            )
        if on_failure != "hold" and sequence_key is None:
            raise ImproperlyConfigured(
                f"@task on {_origin(fn)}: on_failure is what a failed task does to its "
                "sequence: give the task a sequence_key too"
            )
        if sequence_key is not None and on_conflict == "replace":
            raise ImproperlyConfigured(
                f"@task on {_origin(fn)}: a sequenced task cannot replace a queued call "
                "(on_conflict='replace' would move it within its sequence)"
            )
        _check_batch(fn, batch_size, batch_wait, takes_context, fair_key, sequence_key, atomic)
        rate = None
        if key_rate is not None:
            try:
                rate = parse_rate(key_rate)
            except ValueError as exc:
                raise ImproperlyConfigured(f"@task on {_origin(fn)}: key_rate: {exc}") from None
        limit = key_concurrency
        if limit is None and concurrency_key is not None and rate is None:
            limit = 1
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 32767
        ):
            raise ImproperlyConfigured(
                f"@task on {_origin(fn)}: key_concurrency must be an int from 1 to 32767, "
                f"not {short_repr(limit)}"
            )
        try:
            kind = ContextTaskDefinition if takes_context else TaskDefinition
            definition: TaskDefinition[..., Any] = kind(
                func=fn,
                name=validate_task_name(_origin(fn) if name is None else name),
                queue=validate_queue(conf.DEFAULT_QUEUE if queue is None else queue),
                priority=validate_priority(conf.DEFAULT_PRIORITY if priority is None else priority),
                max_attempts=validate_max_attempts(
                    conf.DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts
                ),
                backoff=validate_backoff(conf.DEFAULT_BACKOFF if backoff is None else backoff),
                timeout=validate_timeout(
                    conf.DEFAULT_TIMEOUT if timeout is TASK_DEFAULT else timeout
                ),
                version=version,
                takes_context=takes_context,
                concurrency_key=concurrency_key,
                key_concurrency=limit,
                key_rate=rate,
                fair_key=fair_key,
                sequence_key=sequence_key,
                on_failure=on_failure,
                batch_size=batch_size,
                batch_wait=float(batch_wait),
                retry_on=None if retry_on is None else validate_exceptions(retry_on, "retry_on"),
                discard_on=validate_exceptions(discard_on, "discard_on"),
                expires=(
                    None if expires is None else validate_expires(expires, datetime_allowed=False)
                ),
                unique_for=None if unique_for is None else validate_unique_for(unique_for),
                unique_states=(
                    None if unique_states is None else validate_unique_states(unique_states)
                ),
                on_conflict=None if on_conflict is None else validate_on_conflict(on_conflict),
                atomic=validate_atomic(atomic, fn),
                encrypt=validate_encrypt(encrypt),
            )
        except InvalidTaskError as exc:
            raise InvalidTaskError(f"@task on {_origin(fn)}: {exc}") from exc
        registry.register(definition)
        return definition

    if func is not None:
        return decorate(func)
    return decorate


# The largest batch a batch handler may take, and the longest wait for one (seconds).
BATCH_SIZE_MAX = 10_000
BATCH_WAIT_MAX = 3600.0


def _check_batch(
    fn: Callable[..., Any],
    batch_size: Any,
    batch_wait: Any,
    takes_context: bool,
    fair_key: Any,
    sequence_key: Any,
    atomic: Any = False,
) -> None:
    """A batch handler's options (docs/tenants.md), or ImproperlyConfigured."""
    where = f"@task on {_origin(fn)}"
    if batch_size is None:
        if batch_wait != 0.0:
            raise ImproperlyConfigured(
                f"{where}: batch_wait is how long a batch waits to fill: give batch_size too"
            )
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not (
        1 <= batch_size <= BATCH_SIZE_MAX
    ):
        raise ImproperlyConfigured(
            f"{where}: batch_size must be an int from 1 to {BATCH_SIZE_MAX:,}, "
            f"not {short_repr(batch_size)}"
        )
    if not is_number(batch_wait) or not 0 <= batch_wait <= BATCH_WAIT_MAX:
        raise ImproperlyConfigured(
            f"{where}: batch_wait must be a number of seconds from 0 to {BATCH_WAIT_MAX:g}, "
            f"not {short_repr(batch_wait)}"
        )
    refused = [
        ("takes_context=True", takes_context),
        ("async def", inspect.iscoroutinefunction(fn)),
        ("fair_key", fair_key is not None),
        ("sequence_key", sequence_key is not None),
        ("atomic=True", atomic is True),
    ]
    for name, given in refused:
        if given:
            raise ImproperlyConfigured(
                f"{where}: a batch handler (batch_size) cannot have {name}: it takes a list "
                "of calls (BatchCall), each with its task's id, attempt and arguments"
            )


def autodiscover() -> None:
    """Import every installed app's ``tasks`` module and PGQUEUE['TASK_MODULES'].

    A module of TASK_MODULES that does not exist (a typo) is left out rather than
    stopping Django: ``manage.py check`` reports it (django_pgqueue.W006, from
    ``missing_task_modules``), ``runtaskworker`` refuses to start, and commands that do
    not run tasks (``migrate``, ``shell``) keep working. A module that exists but fails
    to import raises, as any other code of the project would."""
    from importlib import import_module

    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")
    for module in _task_modules():
        try:
            import_module(module)
        except ModuleNotFoundError as exc:
            if not _is_or_contains(exc.name, module):
                raise  # the module exists; something it imports does not


def missing_task_modules() -> dict[str, str]:
    """The modules of PGQUEUE['TASK_MODULES'] that cannot be imported because they do
    not exist, each with the reason (``No module named 'orders.taks'``)."""
    missing = {}
    for module in _task_modules():
        if module in sys.modules:
            continue
        try:
            found = find_spec(module)
        except ModuleNotFoundError as exc:  # a parent package is missing
            if not _is_or_contains(exc.name, module):
                raise
            missing[module] = str(exc)
            continue
        if found is None:
            missing[module] = f"No module named {module!r}"
    return missing


def _task_modules() -> list[str]:
    """PGQUEUE['TASK_MODULES'], or nothing while it is not a list of strings (which
    manage.py check reports, django_pgqueue.E010)."""
    modules = get_settings().TASK_MODULES
    if SETTINGS_BY_NAME["TASK_MODULES"].problem(modules, "TASK_MODULES") is not None:
        return []
    return list(modules)


def _is_or_contains(missing: str | None, module: str) -> bool:
    """Whether the module Python could not find is ``module`` or one of its packages."""
    return missing is not None and (missing == module or module.startswith(missing + "."))
