"""The scheduler: enqueues the ticks of the periodic schedules of this worker's queues.

Every worker serving a schedule's queue runs it; the database decides that each tick is
enqueued once across the fleet (sql: enqueue_tick), so there is no leader to elect or
lose. Ticks are computed on the database's clock, never this host's: the scheduler
keeps the now() its last statement returned and counts on from it with the monotonic
clock, so clock skew between hosts does not matter.

It sleeps until the next tick of its schedules, but never longer than MAX_SLEEP. A due
tick costs one statement (enqueue_tick); without one, it reads its schedules' rows and
the clock (schedule_state): at once when its claimer's listener passes on that a
schedule changed (runtime_schedules.py notifies every worker at the change's commit),
and otherwise every REFRESH_NOTIFIED seconds, in case a notification was lost; without
a listener (behind a transaction pooler with no LISTEN_DATABASE), every POLL_INTERVAL (at
most every REFRESH seconds). That read brings the runtime schedules of its queues:
added, changed, paused, resumed and removed ones reach it then, without a restart.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import dict_row

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.tasking.runtime_schedules import runtime_definition
from django_pgqueue.tasking.schedule import ScheduleDefinition
from django_pgqueue.worker.connection import Session
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")

MAX_SLEEP = 1.0
REFRESH = 5.0
# With a listener, a change of the schedules pokes the scheduler (listener.py): it then
# reads the rows this often only in case a notification was lost.
REFRESH_NOTIFIED = 30.0


class DatabaseClock:
    """The database's now(), between statements: the last now() a statement returned,
    plus the monotonic time since its reply arrived. The statement's now() was taken
    before the reply, so this is never ahead of the database's clock: a tick is never
    attempted early, and late by no more than a round trip."""

    def __init__(self) -> None:
        self._base: datetime | None = None
        self._at = 0.0

    def set(self, database_now: datetime, received_at: float) -> None:
        self._base, self._at = database_now, received_at

    def now(self) -> datetime:
        if self._base is None:
            raise RuntimeError("the clock has not been read from the database yet")
        return self._base + timedelta(seconds=time.monotonic() - self._at)

    def age(self) -> float:
        """Seconds since the database's clock was last read (inf before the first)."""
        return float("inf") if self._base is None else time.monotonic() - self._at


@dataclass
class _Schedule:
    """What this worker knows of one schedule's row."""

    definition: ScheduleDefinition
    # When ticks start: the row's created_at, or its resumed_at if later. None: no row
    # (not seen yet, or deleted).
    first_seen: datetime | None = None
    last_tick: datetime | None = None
    next_tick: datetime | None = None  # the next tick to look at; None: none ever
    # Not fired: paused, or (from code) a runtime schedule of the same name has the row.
    idle: bool = False

    def learn(self, first_seen: datetime, last_tick: datetime | None) -> None:
        if self.first_seen != first_seen:  # a new row: start from it
            self.first_seen, self.last_tick, self.next_tick = first_seen, None, None
        if last_tick is not None and (self.last_tick is None or last_tick > self.last_tick):
            self.last_tick = last_tick
        if self.next_tick is None:
            self.next_tick = self.definition.next_tick(
                self.last_tick or first_seen - timedelta(microseconds=1)
            )


class Scheduler:
    """Fires the schedules declared in code for this worker (``schedules``) and the
    runtime schedules of its ``queues`` whose task it runs (``routes``: (name,
    version) pairs), reading their rows every ``refresh`` seconds (POLL_INTERVAL,
    capped at REFRESH)."""

    name = "scheduler"

    def __init__(
        self,
        alias: str,
        worker_id: str,
        schedules: list[ScheduleDefinition],
        stats: WorkerStats,
        session: Session | None = None,
        *,
        queues: list[str] | tuple[str, ...] = (),
        routes: list[tuple[str, int]] | tuple[tuple[str, int], ...] = (),
        refresh: float = REFRESH,
    ) -> None:
        self.worker_id = worker_id
        self.stats = stats
        self.code = {s.name: _Schedule(s) for s in schedules}
        self.runtime: dict[str, _Schedule] = {}
        self.queues = list(queues)
        self.routes = set(routes)
        self.refresh_every = min(REFRESH, refresh)
        self.clock = DatabaseClock()
        self._stale = False  # read the rows again at the next step
        self._refused: dict[str, str] = {}  # runtime schedule -> why it is not fired here
        self._stop = threading.Event()
        self._owns_session = session is None
        self.session = session or Session(alias, self.name, self._stop)
        self._thread = threading.Thread(target=self._run, name="pgqueue-scheduler", daemon=True)

    def notified_by(self, listener: Any) -> None:
        """Read the rows when ``listener`` says a schedule changed (at once, within
        MAX_SLEEP), and otherwise every REFRESH_NOTIFIED: an idle worker then runs no
        statement for its schedules between changes."""
        listener.on_schedules.append(self.poke)
        self.refresh_every = REFRESH_NOTIFIED

    def poke(self) -> None:
        """A schedule changed: read the rows at the next step."""
        self._stale = True

    @property
    def schedules(self) -> list[_Schedule]:
        return [*self.code.values(), *self.runtime.values()]

    def start(self) -> None:
        if self.code:
            logger.info(
                "scheduler: firing the periodic schedules of the code: %s",
                ", ".join(
                    f"{s.definition.name} ({s.definition.spec}, queue {s.definition.queue})"
                    for s in self.code.values()
                ),
            )
        logger.debug(
            "scheduler: also firing the schedules added at runtime on queues %s",
            ", ".join(self.queues) or "(none)",
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._owns_session:
            self.session.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                delay = self.step()
            except Exception:
                if self._stop.is_set():
                    break
                logger.exception("scheduler: step failed; will retry in %gs", REFRESH)
                delay = REFRESH
            if self._stop.wait(delay):
                break

    def step(self) -> float:
        """Enqueue every due tick; returns the seconds until the next look."""
        if (
            self._stale
            or self.clock.age() >= self.refresh_every
            or any(s.first_seen is None for s in self.code.values())
        ):
            self.refresh()
        for schedule in self.schedules:
            self._fire_due(schedule)
        upcoming = [
            s.next_tick
            for s in self.schedules
            if s.next_tick is not None and s.first_seen is not None and not s.idle
        ]
        until_refresh = 0.0 if self._stale else self.refresh_every - self.clock.age()
        if not upcoming:
            return max(0.0, min(MAX_SLEEP, until_refresh))
        until_tick = (min(upcoming) - self.clock.now()).total_seconds()
        return max(0.0, min(MAX_SLEEP, until_refresh, until_tick))

    def refresh(self) -> None:
        """Read the clock and the schedules' rows; create the rows of new schedules from
        code; take in the runtime schedules added, changed or removed."""
        self._stale = False
        rows = self._read_rows()
        missing = [s.definition for s in self.code.values() if s.definition.name not in rows]
        if missing:
            params = {
                "names": [d.name for d in missing],
                "task_names": [d.task.name for d in missing],
                "specs": [d.spec for d in missing],
                "timezones": [d.timezone for d in missing],
            }
            self.session.call(lambda conn: conn.execute(QUERIES["schedule_seen"], params))
            rows = self._read_rows()
        for name, schedule in self.code.items():
            row = rows.get(name)
            if row is None:
                schedule.first_seen = None  # deleted again meanwhile: at the next step
                continue
            if row["definition"] is not None:
                self._refuse(
                    name,
                    "it is declared in the code and added at runtime: the runtime "
                    "schedule fires; remove one of them",
                )
            schedule.idle = row["definition"] is not None or row["paused_at"] is not None
            schedule.learn(_since(row), row["last_tick"])
        self._take_runtime({n: r for n, r in rows.items() if r["definition"] is not None})

    def _take_runtime(self, rows: dict[str, dict[str, Any]]) -> None:
        for name in list(self.runtime):
            if name not in rows:
                logger.info("scheduler: %s was removed", name)
                del self.runtime[name]
        for name, row in rows.items():
            data = row["definition"]
            if isinstance(data, str):
                data = json.loads(data)
            known = self.runtime.get(name)
            if known is None or known.definition.stored != data:
                definition = self._runnable(name, data)
                if definition is None:
                    self.runtime.pop(name, None)
                    continue
                if known is None:
                    logger.info(
                        "scheduler: firing %s (%s, queue %s), added at runtime",
                        name, definition.spec, definition.queue,
                    )  # fmt: skip
                    known = self.runtime[name] = _Schedule(definition)
                else:
                    logger.info("scheduler: %s was changed: %s", name, definition.spec)
                    known.definition, known.next_tick = definition, None
            known.idle = row["paused_at"] is not None
            known.learn(_since(row), row["last_tick"])

    def _runnable(self, name: str, data: dict[str, Any]) -> ScheduleDefinition | None:
        """The runtime schedule as this worker fires it, or None (logged once) if it
        cannot: its task (at its newest version here) is not one this worker runs."""
        definition = runtime_definition(name, data)
        if definition is None:
            self._refuse(name, f"its task {data.get('task')!r} is not registered in this worker")
            return None
        if (definition.task.name, definition.task.version) not in self.routes:
            self._refuse(name, f"this worker does not run its task {definition.task.name!r}")
            return None
        if definition.queue not in self.queues:
            return None
        self._refused.pop(name, None)
        return definition

    def _refuse(self, name: str, reason: str) -> None:
        if self._refused.get(name) != reason:
            self._refused[name] = reason
            logger.warning("scheduler: not firing schedule %s: %s", name, reason)

    def _read_rows(self) -> dict[str, dict[str, Any]]:
        """The rows of this worker's schedules from code that exist, and the runtime
        schedules of its queues, by name."""
        rows = self._fetch("schedule_state", {"names": list(self.code), "queues": self.queues})
        return {row["name"]: row for row in rows if row["name"] is not None}

    def _fire_due(self, schedule: _Schedule) -> None:
        if schedule.first_seen is None or schedule.next_tick is None or schedule.idle:
            return
        now = self.clock.now()
        if schedule.next_tick > now:
            return
        for tick in schedule.definition.due(schedule.last_tick, schedule.first_seen, now):
            if not self.fire(schedule, tick):
                return
        schedule.next_tick = schedule.definition.next_tick(max(now, schedule.last_tick or now))

    def fire(self, schedule: _Schedule, tick: datetime) -> bool:
        """Enqueue one tick, unless another worker did. False when the tick could not be
        settled now (it is not due yet by the database's clock, or the row is gone)."""
        definition = schedule.definition
        [result] = self._fetch("enqueue_tick", tick_params(definition, tick, self.worker_id))
        if result["task_id"] is not None:
            schedule.last_tick = tick
            self.stats.incr("ticks_enqueued")
            logger.debug(
                "scheduler: %s tick %s enqueued as task %s",
                definition.name,
                tick.isoformat(),
                result["task_id"],
            )
            return True
        if not result["row_exists"]:
            schedule.first_seen = None  # the row was deleted: seen anew at the next step
            self._stale = True
            return False
        if not result["row_current"]:
            # Paused, or changed since this worker read it: read the rows again now,
            # and fire the tick by the current version, if it is still due.
            self._stale = True
            return False
        if result["now"] < tick:
            schedule.next_tick = tick  # early by the database's clock: try again then
            return False
        # Another worker enqueued this tick, or a later one: the row is at least here.
        if schedule.last_tick is None or schedule.last_tick < tick:
            schedule.last_tick = tick
        return True

    def _fetch(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """A statement's rows, by column name. Each row carries the database's now(),
        which sets the clock."""

        def work(conn) -> list[dict[str, Any]]:
            with conn.cursor(row_factory=dict_row) as cursor:
                cursor.execute(QUERIES[name], params)
                return cursor.fetchall()

        rows = self.session.call(work)
        if rows:
            self.clock.set(rows[0]["now"], time.monotonic())
        return rows


def tick_params(definition: ScheduleDefinition, tick: datetime, worker_id: str) -> dict[str, Any]:
    """The parameters of enqueue_tick: the task's row as an enqueue's (build_row), with
    the schedule, the tick and the worker in its metadata, and the schedule's row."""
    row = definition.task_row(
        {"schedule": definition.name, "tick": tick.isoformat(), "worker": worker_id}
    )
    return {
        **row,
        "name": definition.name,
        "tick": tick,
        "worker_id": worker_id,
        "spec": definition.spec,
        "timezone": definition.timezone,
        # A runtime schedule's version, as read from its row: the tick is enqueued only
        # if it is still the row's (None: a schedule from code).
        "definition": None if definition.stored is None else json.dumps(definition.stored),
    }


def _since(row: dict[str, Any]) -> datetime:
    """When a schedule's ticks start: when its row was created, or last resumed."""
    resumed = row["resumed_at"]
    return row["created_at"] if resumed is None else max(row["created_at"], resumed)
