"""When a schedule's ticks fall: cron and interval tick sequences, and which of them are
due under a missed-tick policy (docs/periodic.md).

Pure functions of aware datetimes: the worker feeds them the database's clock, so every
worker of a fleet computes the same ticks whatever its own clock says. A tick is an
instant (an aware UTC datetime, whole seconds for cron, whole microseconds for
intervals); the schedule's row stores the last one enqueued, and the database enqueues
a tick only if it is later (sql: enqueue_tick).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

MISSED_POLICIES = ("skip", "once", "all")

# Under missed="skip", a tick is still run while less than this has passed since it (a
# worker wakes up within milliseconds of a tick; this covers a slow statement, a
# reconnect, a restart); a tick found later than that was missed and is not run.
ON_TIME = timedelta(seconds=10)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# The first look back for the latest ticks before a moment; widened 16 times over until
# enough ticks are found or the lower bound is reached.
_FIRST_WINDOW = timedelta(days=1)


class InvalidSchedule(ValueError):
    """A cron expression or an interval that cannot make ticks."""


@dataclass(frozen=True)
class Cron:
    """Ticks of a five-field cron expression in a time zone, by cronsim.

    Daylight saving time follows cronsim (and Debian cron): a job at a fixed time (its
    minute and hour fields do not start with ``*``) whose time is skipped by the
    spring-forward jump runs once, right after the jump, and runs once when its time is
    repeated by the fall-back; a job with a wildcard minute or hour follows the clock
    (skipped times do not run, repeated times run again).
    """

    expression: str
    timezone: ZoneInfo

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str) or len(self.expression.split()) != 5:
            raise InvalidSchedule(
                f"cron expression {self.expression!r} must have five fields (minute hour "
                "day-of-month month day-of-week), e.g. '0 7 * * mon'; use every=seconds "
                "for intervals under a minute"
            )
        try:
            CronSim(self.expression, datetime.now(self.timezone))
        except CronSimError as exc:
            raise InvalidSchedule(f"cron expression {self.expression!r}: {exc}") from exc
        if self.after(datetime.now(UTC)) is None:
            raise InvalidSchedule(
                f"cron expression {self.expression!r} never fires in the next 50 years"
            )

    def __str__(self) -> str:
        return self.expression

    def _iter(self, start: datetime) -> Iterator[datetime]:
        """Ticks after ``start``, as strictly increasing UTC instants.

        cronsim works on wall-clock times: started inside a repeated (fall-back) hour it
        may yield a tick before ``start``, and a skipped time and the time it moves to
        can coincide; both are dropped here.
        """
        previous = start
        try:
            for local in CronSim(self.expression, start.astimezone(self.timezone)):
                tick = local.astimezone(UTC)
                if tick > previous:
                    previous = tick
                    yield tick
        except StopIteration:  # cronsim gives up after 50 years without a match
            return

    def after(self, moment: datetime) -> datetime | None:
        """The first tick strictly after ``moment``; None if there is none."""
        return next(self._iter(moment), None)

    def latest(self, lower: datetime, upper: datetime, limit: int) -> list[datetime]:
        """The last ``limit`` ticks in (lower, upper], oldest first."""
        window = _FIRST_WINDOW
        while True:
            start = max(lower, upper - window)
            found: deque[datetime] = deque(maxlen=limit)
            seen = 0
            for tick in self._iter(start):
                if tick > upper:
                    break
                found.append(tick)
                seen += 1
            if seen >= limit or start == lower:
                return list(found)
            window *= 16


@dataclass(frozen=True)
class Every:
    """A tick every ``seconds``, at whole multiples of it since the Unix epoch (UTC), so
    that every worker computes the same ticks: ``every=3600`` ticks on the hour."""

    seconds: float

    def __post_init__(self) -> None:
        value = self.seconds
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 1:
            raise InvalidSchedule(f"every must be a number of seconds >= 1, not {value!r}")
        if value > 366 * 24 * 3600:
            raise InvalidSchedule(
                f"every={value!r} is more than a year: use a cron expression instead"
            )

    def __str__(self) -> str:
        return f"every {self.seconds:g}s"

    @property
    def _step(self) -> int:
        return round(self.seconds * 1_000_000)

    def _index(self, moment: datetime) -> int:
        """The number of the last tick at or before ``moment``."""
        return ((moment - _EPOCH) // _MICROSECOND) // self._step

    def _tick(self, index: int) -> datetime:
        return _EPOCH + index * self._step * _MICROSECOND

    def after(self, moment: datetime) -> datetime:
        return self._tick(self._index(moment) + 1)

    def latest(self, lower: datetime, upper: datetime, limit: int) -> list[datetime]:
        last = self._index(upper)
        first = max(self._index(lower) + 1, last - limit + 1)
        return [self._tick(i) for i in range(first, last + 1)]


Ticks = Cron | Every


def due(
    ticks: Ticks,
    *,
    last_tick: datetime | None,
    first_seen: datetime,
    now: datetime,
    missed: str,
    catch_up_limit: int,
) -> list[datetime]:
    """The ticks to enqueue now, oldest first, under a missed-tick policy.

    The candidates are the ticks after the last one enqueued (``last_tick``) and at or
    before ``now``; a schedule never enqueued has none before ``first_seen`` (when its
    row was created: the first time a worker saw it). Of those:

    - ``"all"``: the latest ``catch_up_limit`` (older ones are skipped);
    - ``"once"``: the latest one;
    - ``"skip"``: the latest one, if it is on time (less than ON_TIME ago).
    """
    lower = first_seen - _MICROSECOND
    if last_tick is not None:
        lower = max(lower, last_tick)
    if now <= lower:
        return []
    candidates = ticks.latest(lower, now, catch_up_limit if missed == "all" else 1)
    if missed == "skip":
        return [t for t in candidates if now - t < ON_TIME]
    return candidates
