"""Celery's schedules (``celery.schedules``) for beat entries: ``crontab``, a number
of seconds, a ``timedelta`` or ``schedule(run_every)``. ``solar`` is refused.

They only describe when; beat.py turns each entry into a periodic schedule of this
queue (``periodic(...)``), fired by the workers: there is no beat process.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django_pgqueue.celery.exceptions import Unsupported
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.reprs import short_repr


class crontab:
    """``crontab(minute=0, hour=7, day_of_week="mon")``: Celery's fields, as one cron
    expression (minute hour day-of-month month day-of-week) in the app's timezone
    (``CELERY_TIMEZONE``, default UTC)."""

    def __init__(
        self,
        minute: Any = "*",
        hour: Any = "*",
        day_of_week: Any = "*",
        day_of_month: Any = "*",
        month_of_year: Any = "*",
        **kwargs: Any,
    ) -> None:
        unknown = set(kwargs) - {"nowfun", "app"}
        if unknown:
            raise TypeError(f"crontab() got unexpected keyword(s) {', '.join(sorted(unknown))}")
        self.minute = _field(minute, "minute")
        self.hour = _field(hour, "hour")
        self.day_of_week = _field(day_of_week, "day_of_week")
        self.day_of_month = _field(day_of_month, "day_of_month")
        self.month_of_year = _field(month_of_year, "month_of_year")

    @classmethod
    def from_string(cls, crontab: str) -> crontab:
        fields = crontab.split()
        if len(fields) != 5:
            raise InvalidTaskError(f"crontab {crontab!r} must have five fields")
        minute, hour, day_of_month, month_of_year, day_of_week = fields
        return cls(minute, hour, day_of_week, day_of_month, month_of_year)

    @property
    def expression(self) -> str:
        """The cron expression, in cron's order."""
        return " ".join(
            (self.minute, self.hour, self.day_of_month, self.month_of_year, self.day_of_week)
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, crontab) and other.expression == self.expression

    def __hash__(self) -> int:
        return hash(self.expression)

    def __repr__(self) -> str:
        return f"<crontab: {self.expression} (m/h/dM/MY/d)>"


def _field(value: Any, name: str) -> str:
    if isinstance(value, bool):
        raise InvalidTaskError(f"crontab {name}={value!r} is not a cron field")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if not value.strip() or len(value.split()) != 1:
            raise InvalidTaskError(f"crontab {name}={value!r} is not one cron field")
        return value.strip()
    if isinstance(value, Iterable):
        items = sorted(value, key=lambda v: (isinstance(v, str), v))
        if not items:
            raise InvalidTaskError(f"crontab {name}: an empty set never fires")
        return ",".join(_field(item, name) for item in items)
    raise InvalidTaskError(f"crontab {name}={short_repr(value)} is not a cron field")


class schedule:
    """``schedule(run_every=timedelta(seconds=30))``: an interval."""

    def __init__(self, run_every: Any = None, relative: bool = False, **kwargs: Any) -> None:
        if relative:
            raise Unsupported(
                "schedule(relative=True) has no counterpart: intervals tick at whole "
                "multiples of their length since the Unix epoch (every worker computes "
                "the same ticks)"
            )
        self.run_every = run_every

    @property
    def seconds(self) -> float:
        return seconds(self.run_every)

    def __repr__(self) -> str:
        return f"<freq: {self.run_every}>"


def seconds(value: Any) -> float:
    """A beat entry's interval: a number of seconds or a timedelta."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTaskError(
            f"{short_repr(value)} is not a schedule: use crontab(...), a number of seconds, "
            "a timedelta or schedule(run_every=...)"
        )
    return float(value)


class solar:
    """Refused: there are no sunrise and sunset schedules here."""

    def __init__(self, event: str, lat: float, lon: float, **kwargs: Any) -> None:
        raise Unsupported(
            f"solar({event!r}, {lat}, {lon}) has no counterpart: schedules are cron "
            "expressions or intervals. Approximate it with a crontab for the season, or "
            "run a task every few minutes that checks the sun's position itself"
        )
