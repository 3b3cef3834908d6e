"""``manage.py pgqueue_status``: the queue overview in a terminal (or as JSON)."""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from django_pgqueue import operations
from django_pgqueue.overview import group_by_queue, humanize_seconds
from django_pgqueue.periodic import schedules

COLUMNS = (
    ("due", "pending_routable"),
    ("unroutable", "pending_unroutable"),
    ("scheduled", "scheduled"),
    ("running", "running"),
    ("waiting", "waiting"),
    ("dead", "failed"),
    ("oldest due", "oldest_due_seconds"),
    ("oldest running", "oldest_running_seconds"),
    ("done 5m", "completed_5m"),
    ("done 1h", "completed_1h"),
    ("failed 5m", "failed_5m"),
    ("failed 1h", "failed_1h"),
)
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: --watch redraws in place


class Command(BaseCommand):
    help = (
        "Show per queue and task name: due (routable / unroutable), scheduled, running, "
        "dead letters, oldest due age, and what finished in the last 5 minutes and hour."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        parser.add_argument(
            "--watch",
            type=float,
            nargs="?",
            const=2.0,
            metavar="SECONDS",
            help="refresh in place every SECONDS (default 2) until Ctrl-C; with --json, "
            "print one JSON document per line",
        )

    def handle(self, *args, **opts):
        interval = opts["watch"]
        if interval is not None and interval <= 0:
            raise CommandError("--watch needs a positive number of seconds")
        try:
            while True:
                snapshot = read_status()
                if opts["json"]:
                    indent = None if interval is not None else 2
                    self.stdout.write(json.dumps(snapshot, indent=indent, default=str))
                else:
                    if interval is not None:
                        self.stdout.write(CLEAR, ending="")
                    self.stdout.write(render_table(snapshot))
                    if interval is not None:
                        self.stdout.write(f"\nrefreshing every {interval:g}s; Ctrl-C to stop")
                self.stdout.flush()
                if interval is None:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            self.stdout.write("")


def read_status() -> dict[str, Any]:
    return {
        "generated_at": timezone.now().isoformat(timespec="seconds"),
        "tasks": operations.queue_overview(),
        "queues": operations.queue_capacity(),
        "schedules": schedules(),
    }


def render_table(snapshot: dict[str, Any]) -> str:
    header = ["queue", "task", *(title for title, _ in COLUMNS)]
    lines: list[list[str]] = []
    groups = group_by_queue(snapshot["tasks"], snapshot["queues"])
    for group in groups:
        for row in group.rows:
            task = f"{row['task_name']}@{row['handler_version']}"
            lines.append([group.name, task, *(_cell(row, key) for _, key in COLUMNS)])
    widths = [
        max(len(str(cell)) for cell in column) for column in zip(header, *lines, strict=False)
    ]
    out = [_format(header, widths), _format(["-" * w for w in widths], widths)]
    out += [_format(line, widths) for line in lines]
    if not lines:
        out.append("(no pending, running or dead tasks, and none finished in the last hour)")
    out.append("")
    if groups:
        out.append(
            "workers: "
            + "; ".join(
                f"{g.name}: {g.workers} live, {g.slots} slots, {g.in_flight} in flight"
                for g in groups
            )
        )
    out += _schedule_lines(snapshot.get("schedules") or [])
    out.append(f"at {snapshot['generated_at']}")
    return "\n".join(out)


def _schedule_lines(schedules: list[dict[str, Any]]) -> list[str]:
    """The periodic schedules: a table after the tasks' (docs/periodic.md)."""
    if not schedules:
        return []
    header = ["schedule", "task", "when", "last tick", "next tick"]
    lines = [
        [
            s["name"],
            s["task"],
            s["schedule"] + ("" if s["timezone"] == "UTC" else f" ({s['timezone']})"),
            _moment(s["last_tick"]),
            _moment(s["next_tick"]) if s["declared"] else "removed from the code",
        ]
        for s in schedules
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines, strict=False)]
    table = [header, ["-" * w for w in widths], *lines]
    return ["", *(_left_aligned(row, widths) for row in table), ""]


def _left_aligned(cells: list[str], widths: list[int]) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()


def _moment(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def _cell(row: dict[str, Any], key: str) -> str:
    if key in ("oldest_due_seconds", "oldest_running_seconds"):
        return humanize_seconds(row[key])
    return str(row[key])


def _format(cells: list[str], widths: list[int]) -> str:
    # Names left-aligned, numbers right-aligned.
    parts = [
        cell.ljust(width) if index < 2 else cell.rjust(width)
        for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
    ]
    return "  ".join(parts).rstrip()
