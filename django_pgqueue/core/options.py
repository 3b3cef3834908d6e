"""The options of a task and of one call, and their checks: what ``@task(...)``,
``using(...)`` and enqueue accept, in words an error can quote.

Pure code: no database is touched (commit_alias is checked against DATABASES, expires
against USE_TZ). The registry (``@task``, ``using``), the runtime schedules, the Tasks
framework backend and the operations check their input with these functions, so one
value is refused for the same reason, in the same words, everywhere.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, TypedDict

from django.conf import settings
from django.db import connections
from django.utils import timezone

from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.payload import check_text
from django_pgqueue.core.reprs import short_repr
from django_pgqueue.core.retry import MAX_SECONDS, RetryPolicy, exception_names

QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
TASK_NAME_MAX_LENGTH = 255  # the task_name column
UNIQUE_KEY_MAX_LENGTH = 255  # the unique_key column (and the other keys')
PRIORITY_MIN, PRIORITY_MAX = -100, 100
# max_attempts is an int column; a million claims is already far past any real need.
MAX_ATTEMPTS_LIMIT = 1_000_000
VERSION_MAX = 2**31 - 1  # handler_version is an int column
TASK_ID_MAX = 2**63 - 1  # the id column is a bigint


class _TaskDefault:
    """The value of an option left out, told apart from one passed as ``None``."""

    def __repr__(self) -> str:
        return "<the task's default>"


# timeout=None means "no ceiling"; leaving timeout out means "the default ceiling".
TASK_DEFAULT: Any = _TaskDefault()

# using() accepts exactly these; anything else is a clear TypeError.
OPTION_NAMES = (
    "queue",
    "priority",
    "run_at",
    "delay",
    "unique_key",
    "max_attempts",
    "timeout",
    "backoff",
    "metadata",
    "commit_alias",
    "concurrency_key",
    "fair_key",
    "sequence_key",
    "after",
    "after_failure",
    "retry_on",
    "discard_on",
    "expires",
    "unique_for",
    "unique_states",
    "on_conflict",
    "atomic",
)


# Unique jobs (docs/tasks.md, "unique_key"). The live states always count: the partial
# unique index pgqueue_task_unique_live holds at most one live row per key.
UniqueState = Literal[
    "scheduled", "pending", "running", "waiting", "succeeded", "failed", "cancelled"
]
TASK_STATES = ("scheduled", "pending", "running", "waiting", "succeeded", "failed", "cancelled")
LIVE_STATES = TASK_STATES[:4]
ON_CONFLICT = ("keep", "replace")


class _HasId(Protocol):
    """A task result, or anything else naming a task by its ``id``."""

    @property
    def id(self) -> int: ...


class UsingOptions(TypedDict, total=False):
    """The options of ``using(...)``, for type checkers: one key per name in
    OPTION_NAMES (tests/test_typing.py keeps the two in step)."""

    queue: str
    priority: int
    run_at: datetime | None
    delay: float
    unique_key: str | None
    max_attempts: int
    timeout: float | None
    backoff: RetryPolicy | dict[str, float] | float
    metadata: dict[str, Any]
    commit_alias: str | None
    concurrency_key: str | None
    fair_key: str | None
    sequence_key: str | None
    after: int | _HasId | Iterable[int | _HasId]
    after_failure: Literal["cancel", "run"]
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | None
    discard_on: type[BaseException] | tuple[type[BaseException], ...] | None
    expires: float | timedelta | datetime | None
    unique_for: float | timedelta | None
    unique_states: Iterable[UniqueState] | None
    on_conflict: Literal["keep", "replace"] | None
    atomic: bool


def validate_queue(queue: Any) -> str:
    if not isinstance(queue, str) or not QUEUE_NAME.fullmatch(queue):
        raise InvalidTaskError(
            f"queue {short_repr(queue)} is not a valid queue name: use 1-100 letters, digits, "
            "'_', '.', ':' or '-'"
        )
    return queue


def validate_priority(priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidTaskError(f"priority must be an int, not {short_repr(priority)}")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise InvalidTaskError(
            f"priority {short_repr(priority)} is out of range: use {PRIORITY_MIN}..{PRIORITY_MAX} "
            "(higher runs first)"
        )
    return priority


def validate_task_name(name: Any) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= TASK_NAME_MAX_LENGTH:
        raise InvalidTaskError(
            f"task name must be a non-empty string of at most {TASK_NAME_MAX_LENGTH} "
            f"characters, not {short_repr(name)}; leave name out to use the function's dotted path"
        )
    return check_text(name, "task name")


def validate_max_attempts(value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_ATTEMPTS_LIMIT
    ):
        raise InvalidTaskError(
            f"max_attempts must be an int >= 1 and at most {MAX_ATTEMPTS_LIMIT:,}, "
            f"not {short_repr(value)}"
        )
    return value


def validate_timeout(value: Any) -> float | None:
    if value is None:
        return None
    # A range, not "> 0": NaN is never in range, and huge ints fail before float().
    if not is_number(value) or not 0 < value <= MAX_SECONDS:
        raise InvalidTaskError(
            f"timeout must be a number of seconds > 0 and at most {MAX_SECONDS:.0f} "
            f"(10 years), or None for no ceiling; not {short_repr(value)}"
        )
    return float(value)


def validate_delay(value: Any) -> float:
    if not is_number(value) or not 0 <= value <= MAX_SECONDS:
        raise InvalidTaskError(
            f"delay must be a number of seconds >= 0 and at most {MAX_SECONDS:.0f} "
            f"(10 years), not {short_repr(value)}"
        )
    return float(value)


def validate_backoff(value: Any) -> RetryPolicy:
    try:
        return RetryPolicy.from_value(value)
    except (TypeError, ValueError) as exc:
        raise InvalidTaskError(f"invalid backoff: {exc}") from exc


def validate_expires(value: Any, *, datetime_allowed: bool = True) -> float | datetime:
    """expires=: seconds after the enqueue (a number or a timedelta, > 0), or an aware
    datetime (per call only)."""
    if isinstance(value, datetime):
        if not datetime_allowed:
            raise InvalidTaskError(
                f"expires must be a number of seconds here, not the datetime {value.isoformat()}: "
                "a fixed time belongs to one call, .using(expires=...)"
            )
        if settings.USE_TZ and timezone.is_naive(value):
            raise InvalidTaskError(
                f"expires {value.isoformat()} is a naive datetime while USE_TZ = True; "
                "pass an aware datetime (e.g. django.utils.timezone.now() + timedelta(...))"
            )
        return in_utc(value, "expires")
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not is_number(seconds) or not 0 < seconds <= MAX_SECONDS:
        raise InvalidTaskError(
            f"expires must be a number of seconds (or a timedelta) > 0 and at most "
            f"{MAX_SECONDS:.0f} (10 years), or an aware datetime; not {short_repr(value)}"
        )
    return float(seconds)


def validate_unique_for(value: Any) -> float:
    """unique_for=: seconds (a number or a timedelta), > 0."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not is_number(seconds) or not 0 < seconds <= MAX_SECONDS:
        raise InvalidTaskError(
            f"unique_for must be a number of seconds (or a timedelta) > 0 and at most "
            f"{MAX_SECONDS:.0f} (10 years), not {short_repr(value)}"
        )
    return float(seconds)


def validate_unique_states(value: Any) -> tuple[str, ...]:
    """unique_states=: task states, which must include every live state; returned in
    the states' order, without repeats."""
    if isinstance(value, str | bytes | bytearray | dict):
        raise InvalidTaskError(
            f"unique_states must be a list of task states, not {short_repr(value)}"
        )
    try:
        states = list(value)
    except TypeError:
        raise InvalidTaskError(
            f"unique_states must be a list of task states, not {short_repr(value)}"
        ) from None
    unknown = [state for state in states if state not in TASK_STATES]
    if unknown:
        raise InvalidTaskError(
            f"unique_states: {short_repr(unknown[0])} is not a task state; use some of "
            f"{', '.join(TASK_STATES)}"
        )
    missing = [state for state in LIVE_STATES if state not in states]
    if missing:
        raise InvalidTaskError(
            f"unique_states must include every live state ({', '.join(LIVE_STATES)}): "
            f"a live task always holds its key; missing {', '.join(missing)}"
        )
    return tuple(state for state in TASK_STATES if state in states)


def validate_on_conflict(value: Any) -> str:
    if value not in ON_CONFLICT:
        raise InvalidTaskError(
            f"on_conflict must be one of {', '.join(map(repr, ON_CONFLICT))}, "
            f"not {short_repr(value)}"
        )
    return value  # type: ignore[no-any-return]


def in_utc(moment: datetime, what: str) -> datetime:
    """An aware datetime as UTC (a naive one as it is): PostgreSQL refuses a UTC offset
    past 15:59, which Python allows (up to 23:59)."""
    if timezone.is_naive(moment):
        return moment
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise InvalidTaskError(
            f"{what} {moment.isoformat()} is out of range: in UTC it falls outside years "
            "1 to 9999"
        ) from None


def check_run_at(run_at: Any) -> datetime | None:
    if run_at is None:
        return None
    if not isinstance(run_at, datetime):
        raise InvalidTaskError(f"run_at must be a datetime, not {type(run_at).__name__}")
    if settings.USE_TZ and timezone.is_naive(run_at):
        raise InvalidTaskError(
            f"run_at {run_at.isoformat()} is a naive datetime while USE_TZ = True; "
            "pass an aware datetime (e.g. django.utils.timezone.now() + timedelta(...))"
        )
    return in_utc(run_at, "run_at")


def check_unique_key(unique_key: Any) -> str | None:
    return check_key(unique_key, "unique_key")


def check_key(key: Any, what: str) -> str | None:
    """A unique_key or concurrency_key: None, or a string that fits its column."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidTaskError(f"{what} must be a non-empty string, not a {type(key).__name__}")
    if not 1 <= len(key) <= UNIQUE_KEY_MAX_LENGTH:
        raise InvalidTaskError(
            f"{what} must be a non-empty string of at most {UNIQUE_KEY_MAX_LENGTH} "
            f"characters, not one of {len(key)}"
        )
    return check_text(key, what)


def validate_exceptions(value: Any, option: str) -> tuple[str, ...]:
    """retry_on= / discard_on=: exception classes, kept as their names (retry.py)."""
    try:
        return exception_names(value, option)
    except ValueError as exc:
        raise InvalidTaskError(str(exc)) from exc


# What a dependent does when a parent ends failed or cancelled.
AFTER_FAILURE = ("cancel", "run")


def validate_after(value: Any) -> tuple[int, ...]:
    """after=: task ids (ints, or their decimal text), or objects with an ``id`` (a task
    result); deduplicated."""
    if isinstance(value, int | str) and not isinstance(value, bool):
        value = [value]
    try:
        # Bytes and mappings iterate, but as ints of characters and as keys: not ids.
        if isinstance(value, bytes | bytearray | dict):
            raise TypeError
        items = list(value)
    except TypeError:
        raise InvalidTaskError(
            f"after must be a list of task ids, not {short_repr(value)}"
        ) from None
    ids = []
    for item in items:
        task_id = getattr(item, "id", item)
        # ASCII digits only: "²" is a digit to isdigit(), and no int.
        if isinstance(task_id, str) and task_id.isascii() and task_id.isdigit():
            task_id = int(task_id)
        if (
            isinstance(task_id, bool)
            or not isinstance(task_id, int)
            or not 1 <= task_id <= TASK_ID_MAX
        ):
            raise InvalidTaskError(f"after: {short_repr(item)} is not a task id")
        ids.append(task_id)
    return tuple(sorted(set(ids)))


def validate_commit_alias(alias: Any) -> str:
    """commit_alias=: an alias of DATABASES (the transaction to wait for)."""
    if not isinstance(alias, str) or alias not in connections.settings:
        raise InvalidTaskError(
            f"commit_alias {short_repr(alias)} is not a database alias of DATABASES: use "
            f"one of {', '.join(connections.settings)}"
        )
    return alias


def validate_atomic(value: Any, func: Callable[..., Any]) -> bool:
    """atomic=: a bool; True only for a sync handler (an ``async def`` one interleaves
    its awaits with other handlers on one loop, while a transaction belongs to one
    connection of one thread)."""
    if not isinstance(value, bool):
        raise InvalidTaskError(f"atomic must be True or False, not {short_repr(value)}")
    if value and inspect.iscoroutinefunction(func):
        raise InvalidTaskError(
            f"atomic=True needs a plain def handler, and {func.__qualname__} is an async "
            "def: its awaits share the worker's event loop (and asgiref's one thread for "
            "the ORM) with other handlers, so its writes cannot be kept in a transaction "
            "of its own. Make the handler a plain def, or leave atomic out"
        )
    return value


def validate_encrypt(value: Any) -> bool | None:
    """encrypt=: True, False, or None (PGQUEUE["ENCRYPT_ALL"] decides)."""
    if value is not None and not isinstance(value, bool):
        raise InvalidTaskError(f"encrypt must be True, False or None, not {short_repr(value)}")
    return value


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-call options; ``None`` means "the task's default", except for ``timeout``,
    where ``None`` means "no ceiling" and only an omitted timeout means the task's."""

    queue: str | None = None
    priority: int | None = None
    run_at: datetime | None = None
    delay: float | None = None
    unique_key: str | None = None
    max_attempts: int | None = None
    timeout: float | None = TASK_DEFAULT
    backoff: RetryPolicy | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    commit_alias: str | None = None
    concurrency_key: str | None = None
    # Fair share (docs/tenants.md): this call's key, instead of the task's function's.
    fair_key: str | None = None
    # Ordered work (docs/tenants.md): this call's sequence, instead of the function's.
    sequence_key: str | None = None
    # Dependencies (docs/workflows.md): the ids of the tasks this one waits for, and
    # what a parent that failed or was cancelled does to it ("cancel" or "run").
    after: tuple[int, ...] = ()
    after_failure: str = "cancel"
    # Exception rules (docs/tasks.md, "Retrying by exception"), as exception names.
    retry_on: tuple[str, ...] | None = None
    discard_on: tuple[str, ...] | None = None
    # Expiry (docs/tasks.md): seconds after the enqueue, or a datetime.
    expires: float | datetime | None = None
    # Unique jobs (docs/tasks.md, "unique_key"); None: the task's.
    unique_for: float | None = None
    unique_states: tuple[str, ...] | None = None
    on_conflict: str | None = None
    # Exactly-once effects (docs/guarantees.md): this call's own choice, frozen on its
    # row; None: the task's (``@task(atomic=...)``, read by the worker when it runs).
    atomic: bool | None = None


# What a task of a sequence that fails for good does to the rest of it (docs/tenants.md).
ON_FAILURE = ("hold", "continue")


def check_sequenced(name: str, options: EnqueueOptions) -> None:
    """A sequenced task's call waits for its turn in its sequence only: not for other
    tasks (after=), and it never takes another queued task's place (replace)."""
    if options.after:
        raise InvalidTaskError(
            f"task {name!r} is a sequenced task: it waits for its turn in its sequence, "
            "and cannot also wait for other tasks (after=)"
        )
    if options.on_conflict == "replace":
        raise InvalidTaskError(
            f"task {name!r} is a sequenced task: on_conflict='replace' would move a call "
            "within its sequence; use on_conflict='keep'"
        )


def check_expires_after_start(options: EnqueueOptions, default: float | None) -> None:
    """Refuse an expiry that surely comes before the task is due (compared only in like
    terms: a datetime with run_at, seconds with delay): it could never start."""
    expires, run_at = default if options.expires is None else options.expires, options.run_at
    if (
        isinstance(expires, datetime)
        and isinstance(run_at, datetime)
        and timezone.is_aware(expires) == timezone.is_aware(run_at)
        and expires <= run_at
    ):
        raise InvalidTaskError(
            f"expires {expires.isoformat()} is not after run_at {run_at.isoformat()}: "
            "the task could never start"
        )
    if is_number(expires) and options.delay is not None and expires <= options.delay:
        raise InvalidTaskError(
            f"expires {expires:g}s is not longer than delay {options.delay:g}s: the task "
            "could never start"
        )


@dataclass(frozen=True)
class Call:
    """One call for ``enqueue_many``: ``call(order.id, notify=True)``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def call(*args: Any, **kwargs: Any) -> Call:
    return Call(args, kwargs)
