"""``manage.py pgqueue_queue``: pause, resume and list queues (and task names in them)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from django_pgqueue.core.conf import database_for, get_settings, queue_databases
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.limits import queue_limits
from django_pgqueue.ops import operations
from django_pgqueue.tasking.registry import registry


class Command(BaseCommand):
    help = (
        "Pause or resume a queue, or one task name in it (every worker's next claim "
        "honours it; running tasks finish), or list the queues with their pauses and "
        "limits."
    )

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", metavar="{pause,resume,list}")
        actions.required = True
        for action, text in (
            ("pause", "no worker claims from the queue (or the task name) until resumed"),
            ("resume", "workers claim from the queue (or the task name) again"),
        ):
            sub = actions.add_parser(action, help=text)
            sub.add_argument("queue", metavar="NAME", help="the queue")
            sub.add_argument(
                "--task", metavar="TASK_NAME", help=f"{action} only this task name in the queue"
            )
        listing = actions.add_parser("list", help="each queue: its pause and its limits")
        listing.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def handle(self, *args, **opts):
        if opts["action"] == "list":
            self._list(opts["json"])
            return
        queue, task_name = opts["queue"], opts["task"]
        # Read on the queue's database, where the pause is written: a replica may not
        # have it yet.
        database = database_for(queue)
        before = operations.pauses(using=database).get(queue)
        try:
            if opts["action"] == "pause":
                operations.pause(queue, task_name)
            else:
                operations.resume(queue, task_name)
        except InvalidTaskError as exc:
            raise CommandError(str(exc)) from None
        after = operations.pauses(using=database).get(queue)
        what = f"task {task_name} in queue {queue}" if task_name else f"queue {queue}"
        if opts["action"] == "pause":
            self.stdout.write(
                f"paused {what}: every worker's next claim skips it; running tasks finish"
            )
            self._warn_if_unknown(queue, task_name, known_row=before is not None)
        elif not _is_paused(before, task_name):
            self.stdout.write(f"{what} was not paused")
        else:
            self.stdout.write(f"resumed {what}")
        if after and not task_name and after["paused_tasks"]:
            names = ", ".join(after["paused_tasks"])
            self.stdout.write(f"task names still paused in queue {queue}: {names}")

    def _warn_if_unknown(self, queue: str, task_name: str | None, known_row: bool) -> None:
        """A typo pauses a queue nobody serves: say so (the pause stands)."""
        known = known_row or queue in _declared_queues()
        if not known:
            self.stderr.write(
                f"note: no worker has served queue {queue!r} and no setting or task names it "
                f"(known: {', '.join(sorted(_declared_queues())) or 'none'}); paused anyway"
            )
        if task_name is not None and task_name not in registry:
            self.stderr.write(
                f"note: task {task_name!r} is not registered in this process; paused anyway"
            )

    def _list(self, as_json: bool) -> None:
        # Each queue's pause from its own database (PGQUEUE['DATABASES']).
        pauses = {}
        for alias in queue_databases():
            pauses.update(operations.own_pauses(alias, using=alias))
        limits = queue_limits()
        queues = sorted({*pauses, *limits, *_declared_queues()})
        rows = []
        for queue in queues:
            pause = pauses.get(queue) or {"paused": False, "paused_tasks": [], "paused_at": None}
            limit = limits.get(queue)
            rows.append(
                {
                    "queue": queue,
                    "paused": pause["paused"],
                    "paused_tasks": pause["paused_tasks"],
                    "paused_at": pause["paused_at"],
                    "limits": {
                        "concurrency": limit.concurrency if limit else None,
                        "rate": limit.rate.label if limit and limit.rate else None,
                    },
                }
            )
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2, default=str))
            return
        header = ["queue", "paused", "paused tasks", "since", "concurrency", "rate"]
        lines = [header] + [_list_line(row) for row in rows]
        widths = [max(len(cell) for cell in column) for column in zip(*lines, strict=True)]
        lines.insert(1, ["-" * w for w in widths])
        for line in lines:
            cells = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
            self.stdout.write("  ".join(cells).rstrip())


def _declared_queues() -> set[str]:
    """Queues named by the settings (QUEUES, QUEUE_LIMITS) or by a registered task."""
    return {*get_settings().QUEUES, *queue_limits(), *(d.queue for d in registry.all())}


def _is_paused(pause: dict[str, Any] | None, task_name: str | None) -> bool:
    if pause is None:
        return False
    return task_name in pause["paused_tasks"] if task_name else pause["paused"]


def _list_line(row: dict[str, Any]) -> list[str]:
    since = row["paused_at"]
    return [
        row["queue"],
        "yes" if row["paused"] else "no",
        ", ".join(row["paused_tasks"]) or "-",
        timezone.localtime(since).strftime("%Y-%m-%d %H:%M:%S") if since else "-",
        str(row["limits"]["concurrency"] or "-"),
        row["limits"]["rate"] or "-",
    ]
