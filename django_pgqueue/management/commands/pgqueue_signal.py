"""``manage.py pgqueue_signal``: send a signal to a task (``django_pgqueue.signal``)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.core.exceptions import EncryptionError, InvalidTaskError, TaskDoesNotExist
from django_pgqueue.core.payload import parse_json
from django_pgqueue.management.commands._database import add_database_argument, database_option
from django_pgqueue.ops import operations


class Command(BaseCommand):
    help = (
        "Send the signal NAME, with a JSON payload, to task TASK_ID. A task waiting for "
        "that signal resumes (pending, due now); a live task not waiting for it keeps it, "
        "and resumes at once when it suspends on it. A finished task takes no signal."
    )

    def add_arguments(self, parser):
        parser.add_argument("task_id", type=int, metavar="TASK_ID", help="the task's id")
        parser.add_argument("name", metavar="NAME", help="the signal's name")
        parser.add_argument(
            "--payload",
            default="",
            metavar="JSON",
            help="a JSON value, read by the task in context.signals[NAME] (quote it for "
            'the shell: --payload \'{"by": "ops"}\'); default null',
        )

        add_database_argument(parser, "task this id names")

    def handle(self, *args, **opts):
        database = database_option(opts["database"])
        task_id, name = opts["task_id"], opts["name"]
        try:
            payload = parse_json(opts["payload"], "--payload")
            outcome = operations.signal(task_id, name, payload, database=database)
        except (InvalidTaskError, EncryptionError) as exc:
            raise CommandError(str(exc)) from None
        if outcome == "resumed":
            self.stdout.write(
                f"task {task_id}: resumed by signal {name!r} (pending now; its next attempt "
                "reads the payload in context.signals)"
            )
        elif outcome == "stored":
            self.stdout.write(
                f"task {task_id}: signal {name!r} stored (the task is not waiting for it; "
                "when it suspends on it, it resumes at once)"
            )
        else:
            try:
                state = operations.get_task(task_id, database=database).state
            except TaskDoesNotExist:
                raise CommandError(f"no task with id {task_id}; nothing was sent") from None
            raise CommandError(
                f"task {task_id} has finished ({state}): a finished task takes no signal; "
                "nothing was sent"
            )
