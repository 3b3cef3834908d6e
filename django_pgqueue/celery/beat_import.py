"""django-celery-beat's database schedules as runtime schedules (``manage.py
pgqueue_import_celery_beat``; docs/celery.md, "Beat").

Read from its tables (``django_celery_beat_periodictask`` and the interval and crontab
tables) with SQL: django-celery-beat need not be installed, only its tables present.
Each periodic task with an interval or a crontab becomes ``add_schedule(name, task,
every=... or cron=..., args, kwargs, queue, priority, paused=not enabled)``; what has
no counterpart (solar and clocked schedules, one-off tasks, expiry, start times,
headers, exchanges) is reported and skipped or left out, never silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from django_pgqueue.celery import options as celery_options
from django_pgqueue.celery.state import get_current_app
from django_pgqueue.core.exceptions import InvalidTaskError, TaskNotRegistered
from django_pgqueue.tasking.registry import registry
from django_pgqueue.tasking.runtime_schedules import add_schedule, check_schedule

TASKS_TABLE = "django_celery_beat_periodictask"
_PERIODS = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1, "microseconds": 1e-6}
# Where django-celery-beat's tables are, and the columns read (present in every release
# since 2.0).
_QUERY = f"""
SELECT t.name, t.task, t.args, t.kwargs, t.queue, t.exchange, t.routing_key, t.headers,
       t.priority, t.expires, t.expire_seconds, t.one_off, t.start_time, t.enabled,
       t.solar_id, t.clocked_id,
       i.every, i.period,
       c.minute, c.hour, c.day_of_week, c.day_of_month, c.month_of_year, c.timezone
  FROM {TASKS_TABLE} AS t
  LEFT JOIN django_celery_beat_intervalschedule AS i ON i.id = t.interval_id
  LEFT JOIN django_celery_beat_crontabschedule AS c ON c.id = t.crontab_id
 ORDER BY t.name
"""
# Celery beat's own bookkeeping entry, not a schedule of the project's.
_BEAT_OWN = "celery.backend_cleanup"


@dataclass
class Imported:
    """One periodic task: what it becomes (``schedule``: the spec) or why it is
    skipped, and what of it is not carried over."""

    name: str
    task: str
    schedule: str | None = None
    queue: str | None = None
    paused: bool = False
    skipped: str | None = None
    left_out: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict, repr=False)


class NoTables(LookupError):
    """django-celery-beat's tables are not in this database."""


def read(using: str = "default") -> list[Imported]:
    """Every periodic task of django-celery-beat's tables on ``using``, checked as
    add_schedule would take it (nothing is written)."""
    connection = connections[using]
    if TASKS_TABLE not in connection.introspection.table_names():
        raise NoTables(
            f"there is no {TASKS_TABLE} table on database {using!r}: nothing to import "
            "(pass --database for another alias)"
        )
    with connection.cursor() as cursor:
        cursor.execute(_QUERY)
        columns = [c[0] for c in cursor.description]
        rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    return [_entry(row) for row in rows]


def apply(entries: list[Imported], using: str | None = None) -> list[Imported]:
    """Add the entries not skipped, in one transaction; returns those added."""
    added = [e for e in entries if e.skipped is None]
    with transaction.atomic(using=using):
        for entry in added:
            add_schedule(entry.name, entry.task, using=using, **entry.fields)
    return added


def _entry(row: dict[str, Any]) -> Imported:
    entry = Imported(name=row["name"], task=row["task"], paused=not row["enabled"])
    if row["task"] == _BEAT_OWN:
        entry.skipped = "Celery beat's own result cleanup: retention prunes rows here"
        return entry
    if row["solar_id"] is not None:
        entry.skipped = "a solar schedule has no counterpart (use a crontab)"
        return entry
    if row["clocked_id"] is not None or row["one_off"]:
        entry.skipped = (
            "a one-off (clocked) task is not a schedule: enqueue it with "
            "apply_async(eta=...) instead"
        )
        return entry
    fields: dict[str, Any] = {"paused": entry.paused}
    if row["every"] is not None:
        seconds = row["every"] * _PERIODS.get(row["period"], 0)
        fields["every"] = seconds
        entry.schedule = f"every {seconds:g}s"
    elif row["minute"] is not None:
        fields_in_order = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
        cron = " ".join(str(row[k] or "*").replace(" ", "") for k in fields_in_order)
        fields["cron"], fields["timezone"] = cron, str(row["timezone"] or "UTC")
        entry.schedule = f"{cron} ({fields['timezone']})"
    else:
        entry.skipped = "it has no interval nor crontab"
        return entry
    try:
        fields["args"] = json.loads(row["args"] or "[]")
        fields["kwargs"] = json.loads(row["kwargs"] or "{}")
    except ValueError as exc:
        entry.skipped = f"its args or kwargs are not JSON ({exc})"
        return entry
    conf = get_current_app().conf
    queue = row["queue"] or row["routing_key"]
    if not queue:
        queue = celery_options.route(
            conf.task_routes, row["task"], fields["args"], fields["kwargs"], {}, None
        ).get("queue")
    if queue:
        fields["queue"] = entry.queue = queue
    try:
        if row["priority"] is not None:
            style = celery_options.priority_style(conf)
            fields["priority"] = celery_options.priority(row["priority"], style)
        registry.get(row["task"])
        check_schedule(entry.name, {"task": row["task"], "cron": None, "every": None,
                                    "args": (), "kwargs": None, "timezone": "UTC",
                                    "missed": "once", "catch_up_limit": 10,
                                    **fields})  # fmt: skip
    except (InvalidTaskError, TaskNotRegistered) as exc:
        entry.skipped = str(exc)
        return entry
    entry.fields = {k: v for k, v in fields.items() if k != "paused" or v}
    entry.left_out = _left_out(row)
    return entry


def _left_out(row: dict[str, Any]) -> list[str]:
    """What of the periodic task is not carried over."""
    left = []
    if row["expires"] is not None or row["expire_seconds"] is not None:
        left.append("its expiry (expires / expire_seconds)")
    if row["start_time"] is not None:
        left.append(f"its start_time {row['start_time']:%Y-%m-%d %H:%M} (add it paused and "
                    "resume it then)")  # fmt: skip
    if (row["headers"] or "{}").strip() not in ("{}", "null", ""):
        left.append("its headers")
    if row["exchange"]:
        left.append("its exchange")
    return left
