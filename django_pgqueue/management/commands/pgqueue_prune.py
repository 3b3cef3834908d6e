"""``manage.py pgqueue_prune``: run retention now (what the worker's pruner does)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.core.conf import get_settings, queue_databases
from django_pgqueue.core.retry import MAX_SECONDS
from django_pgqueue.management.commands._database import add_database_argument, database_option
from django_pgqueue.ops import operations
from django_pgqueue.ops.archive import ArchiveError

BATCH_MAX = 1_000_000


class Command(BaseCommand):
    help = (
        "Delete succeeded and cancelled tasks older than RESULT_TTL and dead letters older "
        "than DEAD_TTL, in batches (never a row under a lease); with --archive, write "
        "them to an archive first."
    )

    def add_arguments(self, parser):
        conf = get_settings()
        parser.add_argument(
            "--dry-run", action="store_true", help="only count what would be deleted"
        )
        parser.add_argument(
            "--result-ttl",
            type=float,
            metavar="SECONDS",
            help=f"keep succeeded/cancelled tasks this long (default: {conf.RESULT_TTL:g})",
        )
        parser.add_argument(
            "--dead-ttl",
            type=float,
            metavar="SECONDS",
            help=f"keep dead letters this long (default: {conf.DEAD_TTL:g})",
        )
        parser.add_argument(
            "--archive",
            metavar="DIR",
            help="write the rows to gzip JSON Lines files in DIR (one per day and "
            "database) before deleting them; a batch whose write fails is not deleted "
            f"(default: PRUNE_ARCHIVE_DIR, {conf.PRUNE_ARCHIVE_DIR or 'none'})",
        )
        parser.add_argument(
            "--batch",
            type=int,
            help=f"rows per DELETE statement, at most {BATCH_MAX:,} (default: {conf.PRUNE_BATCH})",
        )

        add_database_argument(parser, "task table to prune (default: every one)")

    def handle(self, *args, **opts):
        only = database_option(opts["database"])
        for database in [only] if only else queue_databases():
            self._prune(database, opts)

    def _prune(self, database: str, opts) -> None:
        where = f" on {database}" if len(queue_databases()) > 1 else ""
        conf = get_settings()
        result_ttl = conf.RESULT_TTL if opts["result_ttl"] is None else opts["result_ttl"]
        dead_ttl = conf.DEAD_TTL if opts["dead_ttl"] is None else opts["dead_ttl"]
        batch = conf.PRUNE_BATCH if opts["batch"] is None else opts["batch"]
        # Ranges, so NaN (never in range) and infinities fail too.
        if not (0 <= result_ttl <= MAX_SECONDS and 0 <= dead_ttl <= MAX_SECONDS):
            raise CommandError(
                f"--result-ttl and --dead-ttl must be seconds from 0 to {MAX_SECONDS:.0f} "
                f"(10 years), not {result_ttl:g} and {dead_ttl:g}"
            )
        if not 1 <= batch <= BATCH_MAX:
            raise CommandError(f"--batch must be from 1 to {BATCH_MAX:,}, not {batch}")
        if opts["dry_run"]:
            counts = operations.prunable_counts(result_ttl, dead_ttl, database=database)
            total = sum(counts.values())
            details = ", ".join(f"{state} {count}" for state, count in sorted(counts.items()))
            self.stdout.write(
                f"would delete {total} task(s){where}: {details} "
                f"(result_ttl={result_ttl:g}s, dead_ttl={dead_ttl:g}s)"
            )
            return
        archive = opts["archive"] or conf.PRUNE_ARCHIVE_DIR
        try:
            deleted = operations.prune_expired(
                result_ttl, dead_ttl, batch, database=database, archive_dir=archive
            )
        except ArchiveError as exc:
            raise CommandError(str(exc)) from None
        archived = f", archived in {archive}" if archive else ""
        self.stdout.write(
            f"deleted {deleted} task(s){where}{archived} "
            f"(result_ttl={result_ttl:g}s, dead_ttl={dead_ttl:g}s)"
        )
