"""``manage.py pgqueue_requeue``: put dead letters back to pending, with fresh attempts."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.payload import check_text
from django_pgqueue.management.commands._database import add_database_argument, database_option
from django_pgqueue.ops import archive, operations

RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(value: str) -> datetime:
    """``30m``, ``2h``, ``1d`` (that long ago) or an ISO 8601 date-time."""
    usage = (
        f"--since {value!r}: use a duration such as 30m, 2h, 1d, or an ISO date-time "
        "such as 2026-05-01T12:00"
    )
    match = RELATIVE.match(value.strip())
    try:
        if match:
            amount, unit = match.groups()
            return timezone.now() - timedelta(**{UNITS[unit]: float(amount)})
        # ValueError: shaped like a date-time but not one (month 13, say).
        parsed = parse_datetime(value.strip())
        if parsed is None:
            raise CommandError(usage)
        return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed)
    except (OverflowError, ValueError) as exc:  # also: a duration reaching before year 1
        raise CommandError(f"{usage} ({exc})") from None


class Command(BaseCommand):
    help = (
        "Requeue dead letters (failed tasks): back to pending, due now, with a fresh "
        "attempt budget. Filters combine; pass --all to requeue every dead letter."
    )

    def add_arguments(self, parser):
        parser.add_argument("--task", dest="task_name", help="only this task name")
        parser.add_argument("--queue", help="only this queue")
        parser.add_argument(
            "--since", help="only tasks that died since: 30m, 2h, 1d, or an ISO date-time"
        )
        parser.add_argument(
            "--id", dest="ids", type=int, action="append", help="only this task id (repeatable)"
        )
        parser.add_argument("--all", action="store_true", help="every dead letter")
        parser.add_argument(
            "--dry-run", action="store_true", help="list what would be requeued, change nothing"
        )
        parser.add_argument(
            "--from-archive",
            metavar="FILE",
            help="bring the tasks --id names back from an archive file of pgqueue_prune "
            "--archive (PRUNE_ARCHIVE_DIR), under their own ids, pending and due now",
        )

        add_database_argument(parser, "dead letters to requeue (default: --queue's database)")

    def handle(self, *args, **opts):
        database = database_option(opts["database"])
        if opts["from_archive"]:
            self._from_archive(opts["from_archive"], opts, database)
            return
        filters = [opts["task_name"], opts["queue"], opts["since"], opts["ids"]]
        if not opts["all"] and not any(f is not None for f in filters):
            raise CommandError(
                "say which dead letters to requeue: --task, --queue, --since, --id, or --all"
            )
        since = parse_since(opts["since"]) if opts["since"] else None
        for flag, value in (("--task", opts["task_name"]), ("--queue", opts["queue"])):
            try:
                check_text(value or "", flag)
            except InvalidTaskError as exc:
                raise CommandError(str(exc)) from None
        ids = operations.requeue_dead(
            opts["ids"],
            task_name=opts["task_name"],
            queue=opts["queue"],
            since=since,
            dry_run=opts["dry_run"],
            database=database,
        )
        shown = ", ".join(str(i) for i in ids[:20]) + (" ..." if len(ids) > 20 else "")
        verb = "would requeue" if opts["dry_run"] else "requeued"
        self.stdout.write(f"{verb} {len(ids)} dead letter(s)" + (f": {shown}" if ids else ""))
        if ids.skipped:
            verb = "would leave" if opts["dry_run"] else "left"
            self.stdout.write(f"{verb} {len(ids.skipped)} dead for their unique key:")
            for task_id, why in sorted(ids.skipped.items())[:20]:
                self.stdout.write(f"  task {task_id}: {why}")
            if len(ids.skipped) > 20:
                self.stdout.write(f"  and {len(ids.skipped) - 20} more")


    def _from_archive(self, path: str, opts, database: str | None) -> None:
        """Archived tasks back in the table, each under its own id (restore_archived)."""
        if not opts["ids"]:
            raise CommandError("--from-archive needs the tasks to bring back: --id ID (repeatable)")
        filters = {"--task": "task_name", "--queue": "queue", "--since": "since", "--all": "all"}
        others = [flag for flag, key in filters.items() if opts[key]]
        if others:
            raise CommandError(f"--from-archive takes --id only, not {', '.join(others)}")
        try:
            found = archive.find(path, opts["ids"])
        except (OSError, EOFError) as exc:
            raise CommandError(f"could not read the archive {path}: {exc}") from None
        missing = [task_id for task_id in opts["ids"] if task_id not in found]
        for task_id in missing:
            self.stdout.write(f"task {task_id}: not in {path}")
        if opts["dry_run"]:
            for task_id, row in found.items():
                self.stdout.write(
                    f"task {task_id}: would bring back {row['task_name']} ({row['state']} "
                    f"at {row['finished_at']}) to queue {row['queue']}"
                )
            return
        outcomes = operations.restore_archived(found.values(), database=database)
        words = {
            "restored": "brought back, pending",
            "present": "not brought back: a task with this id is in the table (it was "
            "never pruned, or was brought back already)",
            "unique_key": "not brought back: a live task holds its unique_key",
        }
        for task_id, outcome in outcomes.items():
            self.stdout.write(f"task {task_id}: {words[outcome]}")
        failed = len(missing) + sum(1 for o in outcomes.values() if o != "restored")
        if failed:
            raise CommandError(f"{failed} of {len(set(opts['ids']))} task(s) not brought back")
