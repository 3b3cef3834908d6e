"""A schedule: its definition (a task, its arguments, and when), the checks of its
fields, and the registry of the schedules declared in code.

periodic.py declares schedules in code; runtime_schedules.py adds them at runtime from
rows. Both build their ScheduleDefinition with the checks here, so a schedule from a
row is refused for the same reasons, in the same words, as one from code.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.exceptions import ImproperlyConfigured

from django_pgqueue.core.exceptions import PgQueueError
from django_pgqueue.core.reprs import short_repr
from django_pgqueue.core.ticks import MISSED_POLICIES, Cron, Every, InvalidSchedule, Ticks, due
from django_pgqueue.tasking.enqueue import build_row
from django_pgqueue.tasking.registry import TaskDefinition

NAME_MAX_LENGTH = 255  # pgqueue_schedule.name
CATCH_UP_LIMIT_MAX = 1000


class ScheduleNotDeclared(PgQueueError, LookupError):
    """No schedule of this name is declared in this process."""


@dataclass(frozen=True, eq=False)
class ScheduleDefinition:
    """One schedule: a task (with its ``using(...)`` options), its arguments, and when."""

    name: str
    task: TaskDefinition
    ticks: Ticks
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    timezone: str
    missed: str
    catch_up_limit: int
    # A runtime schedule's definition as its row stores it (runtime_schedules.py); None
    # for a schedule from code.
    stored: dict[str, Any] | None = None

    @property
    def queue(self) -> str:
        return self.task.options.queue or self.task.queue

    @property
    def spec(self) -> str:
        """The schedule as people write it: ``0 7 * * mon`` or ``every 10s``."""
        return str(self.ticks)

    def due(
        self, last_tick: datetime | None, first_seen: datetime, now: datetime
    ) -> list[datetime]:
        """The ticks to enqueue at ``now`` (the database's clock), oldest first."""
        return due(
            self.ticks,
            last_tick=last_tick,
            first_seen=first_seen,
            now=now,
            missed=self.missed,
            catch_up_limit=self.catch_up_limit,
        )

    def next_tick(self, after: datetime) -> datetime | None:
        return self.ticks.after(after)

    def task_row(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """The task's INSERT parameters, validated exactly as an enqueue's (build_row),
        with ``metadata`` added to the task's own."""
        definition = self.task.using(metadata={**self.task.options.metadata, **metadata})
        return build_row(definition, self.args, self.kwargs)

    def _identity(self) -> tuple:
        task = self.task
        return (task.name, task.version, task.options, self.ticks, self.args, self.kwargs,
                self.timezone, self.missed, self.catch_up_limit)  # fmt: skip


class ScheduleRegistry:
    """Schedule name -> ScheduleDefinition, filled by importing modules that call
    ``periodic``. A name declared twice with different schedules is an error."""

    def __init__(self) -> None:
        self._schedules: dict[str, ScheduleDefinition] = {}
        self._lock = threading.Lock()

    def register(self, schedule: ScheduleDefinition, *, named: bool) -> None:
        with self._lock:
            existing = self._schedules.get(schedule.name)
            if existing is not None and existing._identity() != schedule._identity():
                if named:
                    raise ImproperlyConfigured(
                        f"schedule {schedule.name!r} is declared twice, with different "
                        "schedules; give one of them another name=..."
                    )
                raise ImproperlyConfigured(
                    f"task {schedule.task.name!r} has several schedules: give each "
                    f"periodic(...) of it its own name=..., e.g. "
                    f"name={schedule.task.name + ':morning'!r}"
                )
            self._schedules[schedule.name] = schedule

    def unregister(self, name: str) -> None:
        with self._lock:
            self._schedules.pop(name, None)

    def get(self, name: str) -> ScheduleDefinition:
        try:
            return self._schedules[name]
        except KeyError:
            known = ", ".join(sorted(self._schedules)) or "(none)"
            raise ScheduleNotDeclared(
                f"schedule {name!r} is not declared in this process; declared schedules: "
                f"{known}. Is the module that calls periodic(...) imported (an installed "
                "app's tasks.py, or PGQUEUE['TASK_MODULES'])?"
            ) from None

    def find(self, name: str) -> ScheduleDefinition | None:
        """The schedule of this name, or None if it is not declared."""
        return self._schedules.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._schedules

    def all(self) -> list[ScheduleDefinition]:
        return [self._schedules[name] for name in sorted(self._schedules)]


schedule_registry = ScheduleRegistry()


def schedule_ticks(where: str, cron: str | None, every: float | None, timezone: str) -> Ticks:
    if (cron is None) == (every is None):
        raise ImproperlyConfigured(f"{where}: pass either cron=... or every=..., not both")
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ImproperlyConfigured(
            f"{where}: timezone {short_repr(timezone)} is not a known IANA time zone "
            "(e.g. 'Europe/Paris', 'UTC')"
        ) from None
    try:
        if cron is not None:
            return Cron(cron, zone)
        if timezone != "UTC":
            raise InvalidSchedule(
                "timezone applies to cron schedules only: every= ticks are counted from the "
                "Unix epoch; leave timezone out"
            )
        return Every(every)
    except InvalidSchedule as exc:
        raise ImproperlyConfigured(f"{where}: {exc}") from exc


def check_args(where: str, args: Any) -> tuple[Any, ...]:
    if isinstance(args, str | bytes | dict) or not isinstance(args, Sequence):
        raise ImproperlyConfigured(
            f"{where}: args must be a list or tuple of the task's positional arguments, "
            f"not {short_repr(args)}"
        )
    return tuple(args)


def check_missed(where: str, missed: Any) -> str:
    if missed not in MISSED_POLICIES:
        raise ImproperlyConfigured(
            f"{where}: missed={short_repr(missed)}: use one of "
            + ", ".join(repr(p) for p in MISSED_POLICIES)
        )
    return missed


def check_catch_up_limit(where: str, limit: Any) -> int:
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= CATCH_UP_LIMIT_MAX
    ):
        raise ImproperlyConfigured(
            f"{where}: catch_up_limit must be an int from 1 to {CATCH_UP_LIMIT_MAX}, "
            f"not {short_repr(limit)}"
        )
    return limit
