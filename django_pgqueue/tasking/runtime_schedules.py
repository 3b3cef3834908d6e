"""Schedules at runtime: added, changed, paused and removed while the fleet runs, beside
those declared in code (docs/periodic.md, "Schedules at runtime").

A runtime schedule is a row of ``pgqueue_schedule`` whose ``definition`` holds the
schedule: a registered task's name, cron or interval, arguments and options, as JSON.
Workers read the rows of their queues every POLL_INTERVAL (sql: schedule_state) and fire
them as they fire schedules from code: the database enqueues each tick once
(sql: enqueue_tick). A schedule from code can be paused and resumed here, not changed
or removed (its definition is the code's).

Each function writes in the caller's transaction, on the database of the schedule's
queue (``using=`` names another alias). Bad input raises InvalidScheduleError (an
InvalidTaskError) and writes nothing; an unknown name raises ScheduleDoesNotExist.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_pgqueue.core.exceptions import InvalidTaskError, PgQueueError, TaskNotRegistered
from django_pgqueue.core.options import (
    validate_max_attempts,
    validate_priority,
    validate_queue,
    validate_timeout,
)
from django_pgqueue.core.payload import check_json, check_text
from django_pgqueue.core.reprs import short_repr
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.tasking.registry import registry
from django_pgqueue.tasking.schedule import (
    NAME_MAX_LENGTH,
    ScheduleDefinition,
    check_args,
    check_catch_up_limit,
    check_missed,
    schedule_registry,
    schedule_ticks,
)

logger = logging.getLogger("django_pgqueue")

# The shape of a stored definition; a worker fires only the shapes it knows.
FORMAT = 1
# The per-schedule options of the tick's task (the rest come from the task).
TASK_OPTIONS = ("queue", "priority", "max_attempts", "timeout", "metadata")
_UNSET: Any = object()


class InvalidScheduleError(InvalidTaskError):
    """A runtime schedule was refused: bad input, a name taken, or a schedule from code
    that only its code may change. Nothing was written."""


class ScheduleDoesNotExist(PgQueueError, LookupError):
    """No schedule of this name: neither declared in code nor added at runtime."""


@dataclass(frozen=True)
class Stored:
    """A runtime schedule's definition as stored in its row (``definition``)."""

    data: dict[str, Any]

    def build(self, name: str) -> ScheduleDefinition:
        """The schedule, with its task from this process's registry (the newest version
        of the name). InvalidScheduleError if this process cannot fire it: an unknown
        format, or a task that is not registered here."""
        data = self.data
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InvalidScheduleError(
                f"schedule {name!r}: its stored definition is of a format this release does "
                f"not know ({short_repr(data)[:80]}); a newer release wrote it"
            )
        try:
            task = registry.get(data["task"])
        except TaskNotRegistered as exc:
            raise InvalidScheduleError(f"schedule {name!r}: {exc}") from None
        options = {k: data[k] for k in TASK_OPTIONS if data.get(k) is not None}
        options["metadata"] = {**task.options.metadata, **(data.get("metadata") or {})}
        return _definition(
            name,
            task.using(**options),
            cron=data.get("cron"),
            every=data.get("every"),
            args=data.get("args", []),
            kwargs=data.get("kwargs", {}),
            timezone=data.get("timezone", "UTC"),
            missed=data.get("missed", "once"),
            catch_up_limit=data.get("catch_up_limit", 10),
            stored=data,
        )


def _definition(
    name: str, task: Any, *, stored: dict[str, Any], **fields: Any
) -> ScheduleDefinition:
    """A ScheduleDefinition, validated as periodic(...) validates one, or
    InvalidScheduleError."""
    where = f"schedule {name!r}"
    try:
        schedule = ScheduleDefinition(
            name=name,
            task=task,
            ticks=schedule_ticks(where, fields["cron"], fields["every"], fields["timezone"]),
            args=check_args(where, fields["args"]),
            kwargs=fields["kwargs"],
            timezone=fields["timezone"],
            missed=check_missed(where, fields["missed"]),
            catch_up_limit=check_catch_up_limit(where, fields["catch_up_limit"]),
            stored=stored,
        )
        if not isinstance(schedule.kwargs, dict):
            raise InvalidTaskError(f"kwargs must be a dict, not {short_repr(schedule.kwargs)}")
        schedule.task_row({})  # the arguments and options, as an enqueue checks them
    except (ImproperlyConfigured, InvalidTaskError) as exc:
        message = str(exc)
        raise InvalidScheduleError(
            message if message.startswith(where) else f"{where}: {message}"
        ) from None
    return schedule


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX_LENGTH:
        raise InvalidScheduleError(
            f"a schedule's name must be a non-empty string of at most {NAME_MAX_LENGTH} "
            f"characters, not {short_repr(name)}"
        )
    try:
        return check_text(name, "schedule name")
    except InvalidTaskError as exc:
        raise InvalidScheduleError(str(exc)) from None


def _task_name(task: Any) -> str:
    """A registered task's name: a name, or a task function. Never imported by path."""
    name = getattr(task, "name", task)
    if not isinstance(name, str):
        raise InvalidScheduleError(
            f"task must be a registered task's name or a @task function, not {short_repr(task)}"
        )
    try:
        registry.get(name)
    except TaskNotRegistered as exc:
        raise InvalidScheduleError(str(exc)) from None
    return name


def _options(options: dict[str, Any]) -> dict[str, Any]:
    """The tick's task options, checked as using(...) checks them."""
    checked: dict[str, Any] = {}
    try:
        for key, value in options.items():
            if value is None:
                checked[key] = None
            elif key == "queue":
                checked[key] = validate_queue(value)
            elif key == "priority":
                checked[key] = validate_priority(value)
            elif key == "max_attempts":
                checked[key] = validate_max_attempts(value)
            elif key == "timeout":
                checked[key] = validate_timeout(value)
            elif key == "metadata":
                if not isinstance(value, dict):
                    raise InvalidTaskError(f"metadata must be a dict, not {short_repr(value)}")
                checked[key] = check_json(value, "metadata")
    except InvalidTaskError as exc:
        raise InvalidScheduleError(str(exc)) from None
    return checked


def _stored(name: str, fields: dict[str, Any]) -> tuple[dict[str, Any], ScheduleDefinition]:
    """The row's definition for these fields, and the schedule it makes, validated."""
    task_name = _task_name(fields["task"])
    options = _options({k: fields.get(k) for k in TASK_OPTIONS})
    task = registry.get(task_name)
    if options.get("queue") is None:
        options["queue"] = task.queue  # stored: the workers of that queue fire it
    data = {
        "format": FORMAT,
        "task": task_name,
        "cron": fields["cron"],
        "every": fields["every"],
        "timezone": fields["timezone"],
        "args": list(fields["args"])
        if isinstance(fields["args"], list | tuple)
        else fields["args"],
        "kwargs": {} if fields["kwargs"] is None else fields["kwargs"],
        "missed": fields["missed"],
        "catch_up_limit": fields["catch_up_limit"],
        **options,
    }
    schedule = Stored(data).build(name)
    # JSON as stored: what a worker reads back is what it compares (sql: enqueue_tick).
    return json.loads(json.dumps(data)), schedule


def check_schedule(name: str, fields: dict[str, Any]) -> ScheduleDefinition:
    """Validate add_schedule's arguments (``fields``: ``task`` and the keyword
    arguments) without writing anything: the schedule, or InvalidScheduleError."""
    return _stored(_check_name(name), fields)[1]


def _row_params(name: str, data: dict[str, Any], schedule: ScheduleDefinition) -> dict[str, Any]:
    return {
        "name": name,
        "task_name": schedule.task.name,
        "spec": schedule.spec,
        "timezone": schedule.timezone,
        "definition": json.dumps(data),
    }


def _fetch(alias: str, query: str, params: dict[str, Any]) -> dict[str, Any] | None:
    with connections[alias].cursor() as cursor:
        cursor.execute(QUERIES[query], params)
        row = cursor.fetchone()
        if row is None:
            return None
        return dict(zip([c[0] for c in cursor.description], row, strict=True))


def _write(alias: str, query: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """A write to the schedule rows, then the notification that makes every worker
    read them at once (delivered when the caller's transaction commits)."""
    row = _fetch(alias, query, params)
    _fetch(alias, "schedules_changed", {})
    return row


def _database(name: str, queue: str | None, using: str | None) -> str:
    """Where a schedule's row is: ``using``, its queue's database, or (a name only)
    the first database with a task table that has the row."""
    from django_pgqueue.core.conf import database_for, queue_databases

    if using is not None:
        return using
    if queue is not None:
        return database_for(queue)
    declared = schedule_registry.find(name)
    if declared is not None:
        return database_for(declared.queue)
    aliases = queue_databases()
    for alias in aliases:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT 1 FROM pgqueue_schedule WHERE name = %s", [name])
            if cursor.fetchone() is not None:
                return alias
    return aliases[0]


def _in_code(name: str) -> str:
    return (
        f"schedule {name!r} is declared in the code (periodic(...)): change or remove it "
        "there and deploy; it can only be paused and resumed at runtime"
    )


def add_schedule(
    name: str,
    task: Any,
    *,
    cron: str | None = None,
    every: float | None = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    timezone: str = "UTC",
    missed: str = "once",
    catch_up_limit: int = 10,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    metadata: dict[str, Any] | None = None,
    paused: bool = False,
    using: str | None = None,
) -> ScheduleDefinition:
    """Add a schedule at runtime: ``add_schedule("nightly-report", "reports.tasks.build",
    cron="0 2 * * *", kwargs={"kind": "daily"})``. Every worker serving its queue, with
    the task registered, fires it within POLL_INTERVAL; its first tick is its first
    after now.

    ``task`` is a registered task's name (or the @task function); it is looked up in the
    task registry, never imported. ``cron``, ``every``, ``args``, ``kwargs``,
    ``timezone``, ``missed`` and ``catch_up_limit`` are periodic(...)'s; ``queue``,
    ``priority``, ``max_attempts``, ``timeout`` and ``metadata`` are the tick's task
    options (default: the task's). ``paused=True`` adds it paused. Written in the
    caller's transaction on the queue's database. InvalidScheduleError (nothing
    written) for bad input or a name taken by another schedule.
    """
    name = _check_name(name)
    if name in schedule_registry:
        raise InvalidScheduleError(f"{_in_code(name)}; choose another name")
    data, schedule = _stored(
        name,
        {
            "task": task, "cron": cron, "every": every, "args": args, "kwargs": kwargs,
            "timezone": timezone, "missed": missed, "catch_up_limit": catch_up_limit,
            "queue": queue, "priority": priority, "max_attempts": max_attempts,
            "timeout": timeout, "metadata": metadata,
        },
    )  # fmt: skip
    alias = _database(name, schedule.queue, using)
    if _write(alias, "schedule_add", _row_params(name, data, schedule)) is None:
        existing = _fetch(alias, "schedule_get", {"name": name})
        if existing is not None and existing["definition"] is None:
            raise InvalidScheduleError(
                f"schedule {name!r}: the name is taken by the row of a schedule from code "
                "that is no longer declared; delete that row (admin: Delete the rows of "
                "removed schedules) or choose another name"
            )
        raise InvalidScheduleError(
            f"schedule {name!r} exists already; change it with update_schedule({name!r}, ...)"
        )
    if paused:
        pause_schedule(name, using=alias)
    return schedule


def update_schedule(name: str, *, using: str | None = None, **changes: Any) -> ScheduleDefinition:
    """Change a runtime schedule: the arguments of add_schedule given here replace the
    stored ones, the others stay (``cron=`` replaces an ``every=`` and the reverse).
    The last tick stays: the changed schedule's ticks after it count as missed, under
    its ``missed`` policy. Every worker fires the new version within POLL_INTERVAL,
    and none fires the old one once the change commits. InvalidScheduleError for a
    schedule from code or bad input; ScheduleDoesNotExist for an unknown name."""
    allowed = {
        "task", "cron", "every", "args", "kwargs", "timezone", "missed", "catch_up_limit",
        *TASK_OPTIONS,
    }  # fmt: skip
    unknown = sorted(set(changes) - allowed)
    if unknown:
        raise InvalidScheduleError(
            f"update_schedule({name!r}): unknown argument(s) {unknown}; "
            f"valid: {', '.join(sorted(allowed))}"
        )
    name = _check_name(name)
    if name in schedule_registry:
        raise InvalidScheduleError(_in_code(name))
    alias = _database(name, None, using)
    row = _fetch(alias, "schedule_get", {"name": name})
    if row is None:
        raise ScheduleDoesNotExist(f"no schedule named {name!r}")
    if row["definition"] is None:
        raise InvalidScheduleError(_in_code(name))
    current = row["definition"]
    if isinstance(current, str):
        current = json.loads(current)
    fields = {**current, **changes}
    if "cron" in changes and "every" not in changes:
        fields["every"] = None
    if "every" in changes and "cron" not in changes:
        fields["cron"] = None
    data, schedule = _stored(name, fields)
    from django_pgqueue.core.conf import database_for

    if database_for(schedule.queue) != alias and using is None:
        raise InvalidScheduleError(
            f"schedule {name!r}: queue {schedule.queue!r} is on database "
            f"{database_for(schedule.queue)!r}, the schedule on {alias!r}; remove it and "
            "add it again there"
        )
    _write(alias, "schedule_update", _row_params(name, data, schedule))
    return schedule


def pause_schedule(name: str, *, using: str | None = None) -> None:
    """Pause a schedule, from code or runtime: no tick is enqueued until
    resume_schedule (its ticks meanwhile are skipped). Persisted; honoured by every
    worker's next tick. ScheduleDoesNotExist for an unknown name."""
    name = _check_name(name)
    declared = schedule_registry.find(name)
    alias = _database(name, None, using)
    if declared is None:
        row = _fetch(alias, "schedule_get", {"name": name})
        if row is None:
            raise ScheduleDoesNotExist(f"no schedule named {name!r}")
        if row["definition"] is None:
            raise InvalidScheduleError(
                f"schedule {name!r} is the row of a schedule from code that is no longer "
                "declared: it does not fire, there is nothing to pause"
            )
        params = {"name": name, "task_name": row["task_name"], "spec": row["spec"],
                  "timezone": row["timezone"]}  # fmt: skip
    else:
        params = {"name": name, "task_name": declared.task.name, "spec": declared.spec,
                  "timezone": declared.timezone}  # fmt: skip
    _write(alias, "schedule_pause", params)


def resume_schedule(name: str, *, using: str | None = None) -> bool:
    """Resume a paused schedule: its first tick is the first after now (the ticks of
    the pause are not run, whatever its missed policy). False if it was not paused;
    ScheduleDoesNotExist for an unknown name."""
    name = _check_name(name)
    alias = _database(name, None, using)
    if _write(alias, "schedule_resume", {"name": name}) is not None:
        return True
    if name not in schedule_registry and _fetch(alias, "schedule_get", {"name": name}) is None:
        raise ScheduleDoesNotExist(f"no schedule named {name!r}")
    return False


def remove_schedule(name: str, *, using: str | None = None) -> None:
    """Remove a runtime schedule: no tick after the removal commits, and workers forget
    it within POLL_INTERVAL. A schedule from code cannot be removed here
    (InvalidScheduleError; pause it). ScheduleDoesNotExist for an unknown name."""
    name = _check_name(name)
    if name in schedule_registry:
        raise InvalidScheduleError(_in_code(name))
    alias = _database(name, None, using)
    if _write(alias, "schedule_remove", {"name": name}) is None:
        row = _fetch(alias, "schedule_get", {"name": name})
        if row is None:
            raise ScheduleDoesNotExist(f"no schedule named {name!r}")
        raise InvalidScheduleError(
            f"schedule {name!r} is the row of a schedule from code that is no longer "
            "declared: delete it in the admin (Delete the rows of removed schedules)"
        )


def runtime_definition(name: str, data: Any) -> ScheduleDefinition | None:
    """A runtime row's schedule, as this process would fire it; None (logged) when it
    cannot (task not registered here, unknown format)."""
    try:
        return Stored(json.loads(data) if isinstance(data, str) else data).build(name)
    except InvalidScheduleError as exc:
        logger.debug("%s", exc)
        return None


def describe(data: dict[str, Any]) -> str:
    """A runtime definition's cron or interval, as people write it."""
    if data.get("cron"):
        return str(data["cron"])
    every = data.get("every")
    return f"every {every:g}s" if isinstance(every, int | float) else "?"


__all__ = [
    "InvalidScheduleError",
    "ScheduleDoesNotExist",
    "add_schedule",
    "pause_schedule",
    "remove_schedule",
    "resume_schedule",
    "update_schedule",
]
