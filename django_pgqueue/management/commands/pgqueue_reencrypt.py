"""``manage.py pgqueue_reencrypt``: encrypt every encrypted task's payloads again with
the newest key of ``PGQUEUE["ENCRYPTION_KEYS"]`` (``operations.reencrypt``)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.core.conf import queue_databases
from django_pgqueue.core.exceptions import EncryptionError
from django_pgqueue.management.commands._database import add_database_argument, database_option
from django_pgqueue.ops import operations

BATCH_MAX = 100_000
LISTED = 20


class Command(BaseCommand):
    help = (
        "Encrypt the payloads of every encrypted task again with the newest key of "
        "PGQUEUE['ENCRYPTION_KEYS'] (its first), in batches, one transaction each. "
        "Running tasks are left for a later run: run it again until it leaves none. "
        "Exits with status 1 if a task cannot be decrypted by any key."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--batch",
            type=int,
            default=operations.REENCRYPT_BATCH,
            help=f"rows per transaction, at most {BATCH_MAX:,} "
            f"(default: {operations.REENCRYPT_BATCH})",
        )
        add_database_argument(parser, "task table to re-encrypt (default: every one)")

    def handle(self, *args, **opts):
        if not 1 <= opts["batch"] <= BATCH_MAX:
            raise CommandError(f"--batch must be from 1 to {BATCH_MAX:,}, not {opts['batch']}")
        only = database_option(opts["database"])
        failed = 0
        for database in [only] if only else queue_databases():
            try:
                done = operations.reencrypt(opts["batch"], database=database)
            except EncryptionError as exc:
                raise CommandError(str(exc)) from None
            failed += len(done.failed)
            self._report(done, database)
        if failed:
            raise CommandError(
                f"{failed} task(s) could not be decrypted by any key of ENCRYPTION_KEYS "
                "and were left as they are (listed above)"
            )

    def _report(self, done: operations.Reencrypted, database: str) -> None:
        where = f" on {database}" if len(queue_databases()) > 1 else ""
        self.stdout.write(
            f"re-encrypted {done.rewritten} task(s){where} with the newest key; "
            f"{done.current} already were"
        )
        if done.left:
            self.stdout.write(
                f"left {len(done.left)} task(s) running or busy, for a later run: {_ids(done.left)}"
            )
        for reason in list(done.failed.values())[:LISTED]:
            self.stderr.write(reason)
        if len(done.failed) > LISTED:
            self.stderr.write(f"and {len(done.failed) - LISTED} more")


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:LISTED]))
    return shown + (f" and {len(ids) - LISTED} more" if len(ids) > LISTED else "")
