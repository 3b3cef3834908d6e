"""``manage.py pgqueue_import_celery_beat``: django-celery-beat's database schedules as
runtime schedules (docs/celery.md, "Beat"). A dry run unless ``--apply``."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from django_pgqueue.celery import beat_import
from django_pgqueue.tasking.runtime_schedules import InvalidScheduleError


class Command(BaseCommand):
    help = (
        "Import django-celery-beat's periodic tasks (read from its tables; the package "
        "need not be installed) as runtime schedules. Lists what it would do unless "
        "--apply is given."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--apply", action="store_true", help="add the schedules (default: a dry run)"
        )
        parser.add_argument(
            "--database", default="default",
            help="the alias whose database holds django-celery-beat's tables",
        )  # fmt: skip

    def handle(self, *args, **options):
        if options["database"] not in connections.settings:
            raise CommandError(
                f"--database {options['database']!r} is not an alias of DATABASES: use one "
                f"of {', '.join(connections.settings)}"
            )
        try:
            entries = beat_import.read(options["database"])
        except beat_import.NoTables as exc:
            raise CommandError(str(exc)) from None
        verb = "added" if options["apply"] else "would add"
        for entry in entries:
            if entry.skipped:
                self.stdout.write(f"skipped {entry.name!r} ({entry.task}): {entry.skipped}")
                continue
            paused = ", paused (disabled in beat)" if entry.paused else ""
            queue = f", queue {entry.queue}" if entry.queue else ""
            self.stdout.write(
                f"{verb} {entry.name!r}: {entry.task} {entry.schedule}{queue}{paused}"
            )
            for what in entry.left_out:
                self.stdout.write(f"    not carried over: {what}")
        if options["apply"]:
            try:
                added = beat_import.apply(entries)
            except InvalidScheduleError as exc:
                raise CommandError(f"{exc}; nothing was added") from None
            self.stdout.write(f"{len(added)} schedule(s) added.")
        else:
            count = sum(1 for e in entries if not e.skipped)
            self.stdout.write(f"Dry run: {count} schedule(s) would be added; pass --apply.")
