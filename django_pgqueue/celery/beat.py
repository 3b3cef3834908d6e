"""Celery beat's schedule as this queue's periodic schedules: there is no beat process.

Every entry of ``CELERY_BEAT_SCHEDULE`` (``app.conf.beat_schedule``) and every
``app.add_periodic_task(...)`` becomes ``periodic(task, cron=... or every=...,
name=<the entry's name>)`` when the app is finalized (docs/periodic.md): every worker
serving the task's queue fires it, and the database enqueues each tick once across
the fleet. Run no ``celery beat``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_pgqueue.celery import options as celery_options
from django_pgqueue.celery import registry as celery_registry
from django_pgqueue.celery.encoding import encode
from django_pgqueue.celery.exceptions import Unsupported
from django_pgqueue.celery.schedules import crontab, schedule, seconds
from django_pgqueue.core.exceptions import InvalidTaskError, TaskNotRegistered
from django_pgqueue.tasking.periodic import ScheduleDefinition, periodic
from django_pgqueue.tasking.registry import TaskDefinition, registry

ENTRY_KEYS = frozenset({"task", "schedule", "args", "kwargs", "options", "relative"})
ENTRY_OPTIONS = frozenset({"queue", "priority", "expires", "routing_key", "exchange"})


def declare(app: Any, entries: dict[str, Any]) -> list[ScheduleDefinition]:
    """Each entry as a periodic schedule (ImproperlyConfigured naming the entry at
    fault)."""
    return [_declare(app, name, entry) for name, entry in entries.items()]


def _declare(app: Any, name: str, entry: Any) -> ScheduleDefinition:
    where = f"beat schedule entry {name!r}"
    try:
        if not isinstance(entry, dict) or "task" not in entry or "schedule" not in entry:
            raise InvalidTaskError("an entry is a dict with 'task' and 'schedule'")
        unknown = sorted(set(entry) - ENTRY_KEYS)
        if unknown:
            raise InvalidTaskError(f"unknown key(s) {', '.join(unknown)}")
        if entry.get("relative"):
            raise Unsupported("relative=True has no counterpart: intervals tick from the epoch")
        definition = _definition(entry["task"])
        when = _when(entry["schedule"], app)
        options = dict(entry.get("options") or {})
        unknown = sorted(set(options) - ENTRY_OPTIONS)
        if unknown:
            raise InvalidTaskError(
                f"option(s) {', '.join(unknown)} cannot apply to a schedule's ticks; "
                f"use {', '.join(sorted(ENTRY_OPTIONS - {'exchange', 'routing_key'}))}"
            )
        if options.get("exchange"):
            raise Unsupported("exchange has no counterpart: use queue")
        using: dict[str, Any] = {}
        queue = options.get("queue") or options.get("routing_key") or celery_options.route(
            app.conf.task_routes, entry["task"], (), {}, options, None
        ).get("queue")
        if queue:
            using["queue"] = queue
        if options.get("priority") is not None:
            style = celery_options.priority_style(app.conf)
            using["priority"] = celery_options.priority(options["priority"], style)
        if options.get("expires") is not None:
            using["expires"] = celery_options.expires(options["expires"])
        return periodic(
            definition.using(**using) if using else definition,
            **when,
            args=encode(list(entry.get("args") or ())),
            kwargs=encode(dict(entry.get("kwargs") or {})),
            name=name,
        )
    except (InvalidTaskError, Unsupported, ImproperlyConfigured, TaskNotRegistered) as exc:
        raise ImproperlyConfigured(f"{where}: {exc}") from exc


def _definition(task: Any) -> TaskDefinition:
    """The task an entry names: a Celery-style task, or a django_pgqueue one."""
    name = getattr(task, "name", task)
    found = celery_registry.find(name)
    if found is not None:
        return found.definition()
    if not isinstance(name, str):
        raise InvalidTaskError(f"'task' is a task's name, not {task!r}")
    return registry.get(name)


def _when(value: Any, app: Any) -> dict[str, Any]:
    if isinstance(value, crontab):
        return {"cron": value.expression, "timezone": _timezone(app)}
    if isinstance(value, schedule):
        return {"every": value.seconds}
    return {"every": seconds(value)}


def _timezone(app: Any) -> str:
    zone = app.conf.timezone
    return str(zone) if zone else "UTC"
