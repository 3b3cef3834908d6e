"""The queue overview: the numbers of the admin page, grouped, and its chart.

Four reads (the index-backed ``operations.queue_overview``, ``queue_capacity`` and
``queue_history``, and the queues' pauses and rate budgets, ``operations.pauses``),
then plain Python. They go to the read database (``READ_DATABASE``, a replica, when
set; then the page also reads how far behind it is, ``operations.replica_lag``). What
is throttled (held back by a pause or a limit) is decided here, once, for the admin
page, ``pgqueue_status`` and the metrics. The chart is an inline SVG whose geometry is
computed here: no JavaScript, no build step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Sum
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from django_pgqueue.core.conf import get_settings, queue_databases, read_database
from django_pgqueue.core.limits import QueueLimit, queue_limits
from django_pgqueue.models import Worker
from django_pgqueue.ops import operations


def humanize_seconds(seconds: float | None) -> str:
    """``3h 05m``, ``4m 10s``, ``12.3s``: short and sortable by eye."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


# What a waiting task waits for (its wait_reason), in words: its parents (enqueued
# with after=, or a step of a chain, group or chord), a signal (it raised Suspend), a
# task it suspended on (context.wait_for) (docs/workflows.md), or its turn in its
# sequence (docs/tenants.md).
WAIT_REASONS = {
    "parents": "its parents",
    "signal": "a signal",
    "child": "a task it waits for",
    "sequence": "its turn in its sequence",
}

COUNTS = (
    "pending_routable",
    "pending_unroutable",
    "scheduled",
    "running",
    "waiting",
    *(f"waiting_{reason}" for reason in WAIT_REASONS),
    "failed",
    "completed_5m",
    "completed_1h",
    "failed_5m",
    "failed_1h",
)


# Why due tasks are held back, as the claim decides it (sql: claim): the queue is
# paused, it runs as many tasks as its concurrency limit allows, or its rate budget is
# spent (QUEUE_LIMITS); or the task name is paused within the queue.
HOLDS = {
    "paused": "paused",
    "concurrency": "at its concurrency limit",
    "rate": "out of rate budget",
    "task_paused": "task paused",
}


@dataclass
class QueueGroup:
    """One queue: its task rows, their totals, the live workers serving it, its pause
    and limits, and what holds its due tasks back now (``held_by``, keys of HOLDS).

    Each row gains ``paused`` (its task name is paused), ``held_by`` and ``throttled``:
    its routable due tasks that no claim takes while a hold lasts. Unroutable tasks are
    counted as unroutable, never as throttled.
    """

    name: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=dict)
    workers: int = 0
    slots: int = 0
    in_flight: int = 0
    paused: bool = False
    paused_tasks: list[str] = field(default_factory=list)
    paused_at: datetime | None = None
    limit: QueueLimit | None = None
    held_by: list[str] = field(default_factory=list)
    # The alias whose task table the numbers come from (PGQUEUE['DATABASES']).
    database: str | None = None

    @property
    def waiting(self) -> dict[str, int]:
        """Its waiting tasks by what they wait for: ``{"parents": N, "signal": N,
        "child": N}`` (keys of WAIT_REASONS). Waiting tasks are not due: they are in no
        due count, no age and nothing throttled."""
        return {reason: self.totals[f"waiting_{reason}"] for reason in WAIT_REASONS}

    @property
    def limits(self) -> dict[str, Any]:
        """``{"concurrency": N | None, "rate": "100/m" | None, "latency_objective":
        seconds | None}``."""
        limit = self.limit or QueueLimit(self.name)
        return {
            "concurrency": limit.concurrency,
            "rate": limit.rate.label if limit.rate else None,
            "latency_objective": limit.latency_objective,
        }


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {key: sum(r[key] for r in rows) for key in COUNTS}
    ages = [r["oldest_due_seconds"] for r in rows if r["oldest_due_seconds"] is not None]
    totals["oldest_due_seconds"] = max(ages) if ages else None
    return totals


def _queue_holds(group: QueueGroup, rate_tat_in: float | None) -> list[str]:
    """What holds every due task of the queue back now (the claim's room is 0)."""
    held = ["paused"] if group.paused else []
    limit = group.limit
    if limit and limit.concurrency is not None and group.totals["running"] >= limit.concurrency:
        held.append("concurrency")
    # Out of budget while rate_tat - (burst - 1) * interval > now() (limits.py, GCRA).
    rate = limit.rate if limit else None
    if rate and rate_tat_in is not None and rate_tat_in > (rate.burst - 1) * rate.interval:
        held.append("rate")
    return held


def row_key(database: str | None, queue: str, task_name: str = "", version: int = 0) -> str:
    """The admin overview's key of a queue's row (no task) or a task's row."""
    return "|".join((database or "", queue, task_name, str(version) if task_name else ""))


def why_it_waits(row: dict[str, Any]) -> str:
    """Why a row's due tasks are not running, in words ("" when nothing holds them):
    what holds them back (HOLDS), or no live worker registered for them."""
    reasons = [HOLDS[key] for key in row["held_by"]] if row["pending_routable"] else []
    if row["pending_unroutable"]:
        reasons.append("no live worker has this task and version")
    return "; ".join(reasons)


def group_by_queue(
    overview: list[dict[str, Any]],
    capacity: list[dict[str, Any]],
    pauses: dict[str, dict[str, Any]],
    limits: dict[str, QueueLimit],
) -> list[QueueGroup]:
    """One group per queue with tasks, live workers, or a pause (of the queue or of a
    task name in it), from ``operations.queue_overview``, ``queue_capacity`` and
    ``pauses``, and the limits of ``QUEUE_LIMITS``."""
    groups: dict[str, QueueGroup] = {}
    for row in overview:
        groups.setdefault(row["queue"], QueueGroup(row["queue"])).rows.append(row)
    for row in capacity:
        group = groups.setdefault(row["queue"], QueueGroup(row["queue"]))
        # Summed: the capacity of several databases' workers can be merged (metrics).
        group.workers += row["workers"]
        group.slots += row["slots"]
        group.in_flight += row["in_flight"]
    for queue, pause in pauses.items():
        if pause["paused"] or pause["paused_tasks"] or queue in groups:
            group = groups.setdefault(queue, QueueGroup(queue))
            group.paused, group.paused_tasks = pause["paused"], pause["paused_tasks"]
            group.paused_at = pause["paused_at"]
    for group in groups.values():
        for row in group.rows:
            if (group.paused or row["task_name"] in group.paused_tasks) and not group.workers:
                # Paused, and no live worker serves the queue (often so while it is
                # paused): nothing says a worker would lack the task, and no claim would
                # take it anyway. Its due tasks are held by the pause, not "unroutable".
                # (With live workers that lack the task, they stay unroutable.)
                row["pending_routable"] += row["pending_unroutable"]
                row["pending_unroutable"] = 0
        group.limit = limits.get(group.name)
        group.totals = _totals(group.rows)
        group.held_by = _queue_holds(group, pauses.get(group.name, {}).get("rate_tat_in"))
        unthrottled_ages = []
        for row in group.rows:
            row["paused"] = row["task_name"] in group.paused_tasks
            row["held_by"] = [*group.held_by, *(["task_paused"] if row["paused"] else [])]
            row["throttled"] = row["pending_routable"] if row["held_by"] else 0
            row["why"] = why_it_waits(row)
            if not row["held_by"] and row["oldest_due_seconds"] is not None:
                unthrottled_ages.append(row["oldest_due_seconds"])
        group.totals["throttled"] = sum(row["throttled"] for row in group.rows)
        # What the starvation alerts watch: a paused or throttled task is never stuck.
        group.totals["oldest_unthrottled_seconds"] = max(unthrottled_ages, default=None)
    return [groups[name] for name in sorted(groups)]


@dataclass
class Chart:
    """Geometry of the throughput bars and the depth line, in SVG user units."""

    width: int
    height: int
    plot_left: int
    plot_right: int
    plot_top: int
    plot_bottom: int
    bars: list[dict[str, Any]]
    depth_points: str
    max_throughput: int
    max_depth: int
    ticks: list[dict[str, Any]]


def build_chart(history: list[dict[str, Any]], width: int = 760, height: int = 200) -> Chart:
    """Bars: tasks completed (and dead-lettered, stacked on top) per minute, on the
    left scale. Line: queue depth at the end of each minute, on the right scale."""
    left, right, top, bottom = 48, width - 56, 12, height - 28
    plot_w, plot_h = right - left, bottom - top
    count = max(1, len(history))
    step = plot_w / count
    max_throughput = max((m["completed"] + m["failed"] for m in history), default=0) or 1
    max_depth = max((m["depth"] for m in history), default=0) or 1
    bars, points = [], []
    for index, minute in enumerate(history):
        x = left + index * step
        completed_h = plot_h * minute["completed"] / max_throughput
        failed_h = plot_h * minute["failed"] / max_throughput
        label = timezone.localtime(minute["minute"]).strftime("%H:%M")
        bars.append(
            {
                "x": round(x + step * 0.1, 1),
                "w": round(step * 0.8, 1),
                "completed_y": round(bottom - completed_h, 1),
                "completed_h": round(completed_h, 1),
                "failed_y": round(bottom - completed_h - failed_h, 1),
                "failed_h": round(failed_h, 1),
                "title": (
                    f"{label}: {minute['completed']} completed, {minute['failed']} failed, "
                    f"depth {minute['depth']}"
                ),
            }
        )
        depth_y = bottom - plot_h * minute["depth"] / max_depth
        points.append(f"{x + step / 2:.1f},{depth_y:.1f}")
    ticks = []
    for index in range(0, len(history), 15):
        minutes_ago = len(history) - 1 - index
        ticks.append(
            {
                "x": round(left + index * step + step / 2, 1),
                "label": f"-{minutes_ago}m" if minutes_ago else "now",
            }
        )
    if history and (len(history) - 1) % 15:
        ticks.append({"x": round(left + (len(history) - 0.5) * step, 1), "label": "now"})
    return Chart(
        width=width,
        height=height,
        plot_left=left,
        plot_right=right,
        plot_top=top,
        plot_bottom=bottom,
        bars=bars,
        depth_points=" ".join(points),
        max_throughput=max_throughput,
        max_depth=max_depth,
        ticks=ticks,
    )


def database_groups(alias: str, limits: dict[str, QueueLimit] | None = None) -> list[QueueGroup]:
    """The groups of the queues whose tasks are on ``alias`` (read from its read
    database), each group and row tagged with ``database``."""
    using = read_database(alias)
    groups = group_by_queue(
        operations.queue_overview(using=using),
        operations.queue_capacity(using=using),
        operations.pauses(using=using),
        queue_limits() if limits is None else limits,
    )
    for group in groups:
        group.database = alias
        for row in group.rows:
            row["database"] = alias
    return groups


def all_groups() -> list[QueueGroup]:
    """``database_groups`` of every alias with a task table (queue_databases())."""
    limits = queue_limits()
    return [group for alias in queue_databases() for group in database_groups(alias, limits)]


def merged_history(minutes: int) -> list[dict[str, Any]]:
    """``queue_history`` of every alias, summed minute by minute."""
    aliases = queue_databases()
    history = operations.queue_history(minutes, using=read_database(aliases[0]))
    for alias in aliases[1:]:
        by_minute = {m["minute"]: m for m in history}
        for minute in operations.queue_history(minutes, using=read_database(alias)):
            into = by_minute.get(minute["minute"])
            if into is None:
                continue  # the other server's clock is a minute apart: its edge minute
            for key, value in minute.items():
                if key != "minute" and isinstance(value, int | float):
                    into[key] += value
    return history


def build_overview(minutes: int = 60, chart: bool = True) -> dict[str, Any]:
    """Everything the overview page shows, with how long the reads took: the queues of
    every database (PGQUEUE['DATABASES']), each group naming its ``database``.
    ``chart=False`` leaves the last ``minutes``' history out (no ``queue_history``)."""
    started = time.perf_counter()
    replica_lag = operations.replica_lag()
    queues = all_groups()
    history = merged_history(minutes) if chart else []
    elapsed_ms = (time.perf_counter() - started) * 1000
    totals = _totals([row for queue in queues for row in queue.rows])
    totals["throttled"] = sum(queue.totals["throttled"] for queue in queues)
    # A worker serving several queues is in several groups: count each one once.
    stale = Now() - timedelta(seconds=get_settings().WORKER_STALE_AFTER)
    totals.update(workers=0, slots=0, in_flight=0)
    for alias in queue_databases():
        live = (
            Worker.objects.using(read_database(alias))
            .filter(last_heartbeat_at__gt=stale)
            .aggregate(
                workers=Count("pk"),
                slots=Coalesce(Sum("concurrency"), 0),
                in_flight=Coalesce(Sum("in_flight"), 0),
            )
        )
        for key, value in live.items():
            totals[key] += value
    return {
        "queues": queues,
        "databases": queue_databases(),
        "totals": totals,
        "chart": build_chart(history),
        "history_minutes": minutes,
        "completed_hour": sum(m["completed"] for m in history),
        "failed_hour": sum(m["failed"] for m in history),
        "read_ms": round(elapsed_ms, 1),
        "read_database": read_database(),
        "replica_lag": replica_lag,  # None without READ_DATABASE
        "generated_at": timezone.now(),
    }
