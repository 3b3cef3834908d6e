"""``manage.py pgqueue_sequence``: the sequences a failed task holds, and releasing one."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.ops import operations


class Command(BaseCommand):
    help = (
        "List the sequences held by a task that failed for good, or release one: its "
        "next waiting task starts (docs/tenants.md)."
    )

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", metavar="{held,release}")
        actions.required = True
        held = actions.add_parser("held", help="the held sequences, most recent first")
        held.add_argument("--queue", help="only this queue")
        held.add_argument("--search", help="only keys that contain this text")
        held.add_argument("--limit", type=int, default=50, help="rows shown (default 50)")
        held.add_argument("--json", action="store_true", help="print JSON")
        release = actions.add_parser(
            "release", help="release a held sequence: its next waiting task starts"
        )
        release.add_argument("queue", metavar="QUEUE")
        release.add_argument("key", metavar="KEY", help="the sequence key")

    def handle(self, *args, **opts):
        try:
            if opts["action"] == "release":
                self._release(opts["queue"], opts["key"])
            else:
                self._held(opts)
        except (InvalidTaskError, ValueError) as exc:
            raise CommandError(str(exc)) from None

    def _release(self, queue: str, key: str) -> None:
        started = operations.release_sequence(queue, key)
        if started is None:
            self.stdout.write(f"{key} in queue {queue} is not held, or has no task waiting")
        else:
            self.stdout.write(f"released {key} in queue {queue}: task {started} starts")

    def _held(self, opts: dict) -> None:
        rows = operations.held_sequences(
            queue=opts["queue"], search=opts["search"], limit=opts["limit"]
        )
        if opts["json"]:
            self.stdout.write(json.dumps(rows, indent=2, default=str))
            return
        if not rows:
            self.stdout.write("no sequence is held")
        for row in rows:
            self.stdout.write(
                f"{row['queue']}  {row['key']}  held by task {row['task_id']} "
                f"({row['task_name']}, failed {row['finished_at']:%Y-%m-%d %H:%M:%S})  "
                f"{row['waiting']} waiting"
            )
