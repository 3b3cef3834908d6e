"""The queue overview: the numbers of the admin page, grouped, and its chart.

Three index-backed reads (``operations.queue_overview``, ``queue_capacity`` and
``queue_history``), then plain Python. The chart is an inline SVG whose geometry is
computed here: no JavaScript, no build step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db.models import Count, Sum
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from django_pgqueue import operations
from django_pgqueue.conf import get_settings
from django_pgqueue.models import Worker


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


COUNTS = (
    "pending_routable",
    "pending_unroutable",
    "scheduled",
    "running",
    "waiting",
    "failed",
    "completed_5m",
    "completed_1h",
    "failed_5m",
    "failed_1h",
)


@dataclass
class QueueGroup:
    """One queue: its task rows, their totals, and the live workers serving it."""

    name: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=dict)
    workers: int = 0
    slots: int = 0
    in_flight: int = 0


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {key: sum(r[key] for r in rows) for key in COUNTS}
    ages = [r["oldest_due_seconds"] for r in rows if r["oldest_due_seconds"] is not None]
    totals["oldest_due_seconds"] = max(ages) if ages else None
    return totals


def group_by_queue(
    overview: list[dict[str, Any]], capacity: list[dict[str, Any]]
) -> list[QueueGroup]:
    groups: dict[str, QueueGroup] = {}
    for row in overview:
        groups.setdefault(row["queue"], QueueGroup(row["queue"])).rows.append(row)
    for row in capacity:
        group = groups.setdefault(row["queue"], QueueGroup(row["queue"]))
        group.workers, group.slots, group.in_flight = (
            row["workers"],
            row["slots"],
            row["in_flight"],
        )
    for group in groups.values():
        group.totals = _totals(group.rows)
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


def build_overview(minutes: int = 60) -> dict[str, Any]:
    """Everything the overview page shows, with how long the reads took."""
    started = time.perf_counter()
    overview = operations.queue_overview()
    capacity = operations.queue_capacity()
    history = operations.queue_history(minutes)
    elapsed_ms = (time.perf_counter() - started) * 1000
    queues = group_by_queue(overview, capacity)
    totals = _totals(overview)
    # A worker serving several queues is in several groups: count each one once.
    totals.update(
        Worker.objects.filter(
            last_heartbeat_at__gt=Now() - timedelta(seconds=get_settings().WORKER_STALE_AFTER)
        ).aggregate(
            workers=Count("pk"),
            slots=Coalesce(Sum("concurrency"), 0),
            in_flight=Coalesce(Sum("in_flight"), 0),
        )
    )
    return {
        "queues": queues,
        "totals": totals,
        "chart": build_chart(history),
        "history_minutes": minutes,
        "completed_hour": sum(m["completed"] for m in history),
        "failed_hour": sum(m["failed"] for m in history),
        "read_ms": round(elapsed_ms, 1),
        "generated_at": timezone.now(),
    }
