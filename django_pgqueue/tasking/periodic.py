"""Periodic tasks: schedules declared next to their task.

A schedule comes from code, like a task: ``periodic(send_digest, cron="0 7 * * mon")``
in an app's tasks.py registers it when the module is imported. A deploy that adds,
changes or removes a schedule takes effect without a migration. Workers fire the
schedules of their queues (worker/scheduler.py); the database decides, one statement
per tick, that each tick is enqueued once across the fleet (sql: enqueue_tick). See
docs/periodic.md.

``from django_pgqueue import periodic`` declares; ``from django_pgqueue.periodic import
run_now, schedules`` for the rest (the package's ``periodic`` is the function). Schedules
added, changed, paused and removed at runtime: runtime_schedules.py; what both build (a
ScheduleDefinition, checked) and the registry of those from code: schedule.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar, overload

from django.core.exceptions import ImproperlyConfigured

from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.payload import check_text
from django_pgqueue.core.reprs import short_repr
from django_pgqueue.tasking.registry import TaskDefinition
from django_pgqueue.tasking.runtime_schedules import runtime_definition
from django_pgqueue.tasking.schedule import CATCH_UP_LIMIT_MAX as CATCH_UP_LIMIT_MAX
from django_pgqueue.tasking.schedule import NAME_MAX_LENGTH as NAME_MAX_LENGTH
from django_pgqueue.tasking.schedule import ScheduleDefinition as ScheduleDefinition
from django_pgqueue.tasking.schedule import ScheduleNotDeclared as ScheduleNotDeclared
from django_pgqueue.tasking.schedule import ScheduleRegistry as ScheduleRegistry
from django_pgqueue.tasking.schedule import (
    check_args,
    check_catch_up_limit,
    check_missed,
    schedule_registry,
    schedule_ticks,
)

# Per-call options that a tick cannot honour: its task is due at its tick, enqueued by
# a worker, once per tick already.
_REFUSED_OPTIONS = (
    "run_at", "delay", "unique_key", "commit_alias", "unique_for", "unique_states", "on_conflict",
)

# @periodic(...) above @task returns the task as it was, parameters and all.
T = TypeVar("T", bound=TaskDefinition[..., Any])


@overload
def periodic(
    task: TaskDefinition[..., Any],
    /,
    *,
    cron: str | None = None,
    every: float | None = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    timezone: str = "UTC",
    name: str | None = None,
    missed: str = "once",
    catch_up_limit: int = 10,
) -> ScheduleDefinition: ...


@overload
def periodic(
    *,
    cron: str | None = None,
    every: float | None = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    timezone: str = "UTC",
    name: str | None = None,
    missed: str = "once",
    catch_up_limit: int = 10,
) -> Callable[[T], T]: ...


def periodic(
    task: TaskDefinition[..., Any] | None = None,
    /,
    *,
    cron: str | None = None,
    every: float | None = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    timezone: str = "UTC",
    name: str | None = None,
    missed: str = "once",
    catch_up_limit: int = 10,
) -> Any:
    """Declare a schedule for a task: ``periodic(send_digest, cron="0 7 * * mon",
    timezone="Europe/Paris")`` or ``periodic(poll, every=10)``; or, as a decorator over
    ``@task``, ``@periodic(every=60)``.

    ``cron`` is a five-field cron expression in ``timezone``; ``every`` a number of
    seconds (>= 1), counted from the Unix epoch. ``args`` and ``kwargs`` are the task's
    arguments, checked like an enqueue's. ``name`` defaults to the task's name, and is
    required when a task has several schedules. ``missed`` says what happens to ticks
    no worker was running for: ``"skip"`` (never run them), ``"once"`` (run the latest
    one) or ``"all"`` (run each, at most the latest ``catch_up_limit``). Queue,
    priority and other options come from the task, or ``task.using(...)``.
    """
    options = {
        "cron": cron,
        "every": every,
        "args": args,
        "kwargs": kwargs,
        "timezone": timezone,
        "name": name,
        "missed": missed,
        "catch_up_limit": catch_up_limit,
    }
    if task is None:

        def decorate(definition: TaskDefinition) -> TaskDefinition:
            _declare(definition, **options)
            return definition

        return decorate
    return _declare(task, **options)


def _declare(
    task: Any,
    *,
    cron: str | None,
    every: float | None,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None,
    timezone: str,
    name: str | None,
    missed: str,
    catch_up_limit: int,
) -> ScheduleDefinition:
    if not isinstance(task, TaskDefinition):
        raise ImproperlyConfigured(
            f"periodic() takes a task (a function decorated with @task), not "
            f"{short_repr(task)}; as a decorator, put @periodic(...) above @task"
        )
    where = f"periodic({task.name})"
    schedule_name = task.name if name is None else name
    if not isinstance(schedule_name, str) or not 1 <= len(schedule_name) <= NAME_MAX_LENGTH:
        raise ImproperlyConfigured(
            f"{where}: name must be a non-empty string of at most {NAME_MAX_LENGTH} "
            f"characters, not {short_repr(schedule_name)}"
        )
    try:
        check_text(schedule_name, "name")
    except InvalidTaskError as exc:
        raise ImproperlyConfigured(f"{where}: {exc}") from exc
    schedule = ScheduleDefinition(
        name=schedule_name,
        task=task,
        ticks=schedule_ticks(where, cron, every, timezone),
        args=check_args(where, args),
        kwargs={} if kwargs is None else kwargs,
        timezone=timezone,
        missed=check_missed(where, missed),
        catch_up_limit=check_catch_up_limit(where, catch_up_limit),
    )
    refused = [o for o in _REFUSED_OPTIONS if getattr(task.options, o) is not None]
    if refused:
        raise ImproperlyConfigured(
            f"{where}: the task's using({', '.join(refused)}=...) cannot apply to a "
            "schedule's ticks: a tick's task is due at its tick and enqueued once per tick"
        )
    try:
        schedule.task_row({})
    except InvalidTaskError as exc:
        raise InvalidTaskError(f"{where}: {exc}") from exc
    schedule_registry.register(schedule, named=name is not None)
    return schedule


def run_now(name: str) -> int:
    """Enqueue a schedule's task now, in the caller's transaction, outside its ticks:
    the schedule's last tick does not move. Returns the task id. The task's metadata
    says ``{"schedule": name, "run_now": true}``. A schedule from code, or (not
    declared in this process) a runtime schedule whose task is registered here."""
    schedule = schedule_registry.find(name) or _runtime(name)
    if schedule is None:
        schedule_registry.get(name)  # raises ScheduleNotDeclared, naming the declared ones
    row_metadata = {**schedule.task.options.metadata, "schedule": name, "run_now": True}
    return schedule.task.using(metadata=row_metadata).enqueue(*schedule.args, **schedule.kwargs)


def _runtime(name: str) -> ScheduleDefinition | None:
    """The runtime schedule of this name, from its row on a database with a task table."""
    from django_pgqueue.core.conf import queue_databases
    from django_pgqueue.models import Schedule

    for alias in queue_databases():
        row = Schedule.objects.using(alias).filter(name=name, definition__isnull=False).first()
        if row is not None:
            return runtime_definition(name, row.definition)
    return None


def schedules(using: str | None = None) -> list[dict[str, Any]]:
    """Every schedule declared in this process or recorded in the database, by name.

    Each: ``name``, ``task``, ``schedule`` (``0 7 * * mon`` or ``every 10s``),
    ``timezone``, ``missed``, ``queue``, ``origin`` (``"code"``: declared in this
    process; ``"runtime"``: added with add_schedule or the admin; ``"removed"``: a row
    left by a schedule removed from the code, which no longer fires), ``declared``
    (origin is code), ``paused`` and ``paused_at``, ``first_seen`` (when a worker first
    saw it, or it was added), ``last_tick``, ``last_enqueued_at``, ``last_task_id``,
    ``last_worker_id`` and ``next_tick`` (the first tick after now, or after it was
    resumed; None when paused, removed, or a runtime schedule whose task is not
    registered in this process). A declared schedule no worker has seen yet has no
    times. The rows are read from the read database of each alias with a task table (a
    schedule's row is on its queue's database; ``READ_DATABASE`` for DATABASE) unless
    ``using`` names one alias. Each entry names its ``database``.
    """
    from django.utils import timezone

    from django_pgqueue.core.conf import database_for, queue_databases, read_database
    from django_pgqueue.models import Schedule

    declared = {s.name: s for s in schedule_registry.all()}
    aliases = [using] if using else queue_databases()
    rows, found_on = {}, {}
    for alias in aliases:
        for row in Schedule.objects.using(read_database(alias) if not using else alias):
            schedule = declared.get(row.name)
            own = schedule is not None and database_for(schedule.queue) == alias
            if row.name not in rows or own:  # a declared schedule's row: its queue's
                rows[row.name], found_on[row.name] = row, alias
    now = timezone.now()
    listing = []
    for name in sorted(set(rows) | set(declared)):
        row, schedule = rows.get(name), declared.get(name)
        data = (row.definition if row is not None else None) or {}
        origin = "code" if schedule else "runtime" if data else "removed"
        if origin == "runtime":
            schedule = runtime_definition(name, data)
        paused = row is not None and row.paused_at is not None
        listing.append(
            {
                "name": name,
                "task": schedule.task.name if schedule else row.task_name,
                "schedule": schedule.spec if schedule else row.spec,
                "timezone": schedule.timezone if schedule else row.timezone,
                "missed": schedule.missed if schedule else data.get("missed"),
                "queue": schedule.queue if schedule else data.get("queue"),
                "database": found_on.get(name)
                or (database_for(schedule.queue) if schedule else None),
                "origin": origin,
                "declared": origin == "code",
                "paused": paused,
                "paused_at": row.paused_at if row else None,
                "first_seen": row.created_at if row else None,
                "last_tick": row.last_tick if row else None,
                "last_enqueued_at": row.last_enqueued_at if row else None,
                "last_task_id": row.last_task_id if row else None,
                "last_worker_id": row.last_worker_id if row else None,
                "next_tick": next_tick(schedule, row, now) if schedule and not paused else None,
            }
        )
    return listing


def next_tick(schedule: ScheduleDefinition, row: Any, now: datetime) -> datetime | None:
    """The schedule's first tick after ``now`` (and after its last tick, if a clock put
    that in the future)."""
    after = now if row is None or row.last_tick is None else max(now, row.last_tick)
    if row is not None and getattr(row, "resumed_at", None) is not None:
        after = max(after, row.resumed_at)
    return schedule.next_tick(after)
