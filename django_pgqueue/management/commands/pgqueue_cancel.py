"""``manage.py pgqueue_cancel``: cancel tasks by id (``--hard`` kills running handlers)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.management.commands._database import add_database_argument, database_option
from django_pgqueue.ops import operations


class Command(BaseCommand):
    help = (
        "Cancel tasks: a pending or waiting task ends cancelled at once; a running one is "
        "asked to stop (context.cancel_requested). With --hard, a worker running handlers "
        "in processes (--execution process) kills the handler's process."
    )

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="+", type=int, metavar="ID", help="task ids")
        parser.add_argument(
            "--hard",
            action="store_true",
            help="kill running handlers (process execution mode; a soft cancel in thread mode)",
        )

        add_database_argument(parser, "tasks these ids name")

    def handle(self, *args, **opts):
        database = database_option(opts["database"])
        missed = []
        for task_id in opts["ids"]:
            result = operations.cancel(task_id, hard=opts["hard"], database=database)
            if result == "cancelled":
                self.stdout.write(f"task {task_id}: cancelled")
            elif result == "cancel_requested":
                if opts["hard"]:
                    action = "the worker kills its handler"
                else:
                    action = "its handler is asked to stop"
                self.stdout.write(f"task {task_id}: running; cancel requested ({action})")
            else:
                missed.append(task_id)
        if missed:
            raise CommandError(
                f"not cancelled (no such task, or already finished): "
                f"{', '.join(str(i) for i in missed)}"
            )
