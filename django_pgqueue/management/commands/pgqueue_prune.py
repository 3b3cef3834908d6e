"""``manage.py pgqueue_prune``: run retention now (what the worker's pruner does)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue import operations
from django_pgqueue.conf import get_settings, queue_databases
from django_pgqueue.management.commands._database import add_database_argument, database_option


class Command(BaseCommand):
    help = (
        "Delete succeeded and cancelled tasks older than RESULT_TTL and dead letters older "
        "than DEAD_TTL, in batches (never a row under a lease)."
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
            "--batch",
            type=int,
            help=f"rows per DELETE statement (default: {conf.PRUNE_BATCH})",
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
        if result_ttl < 0 or dead_ttl < 0:
            raise CommandError("--result-ttl and --dead-ttl must be >= 0")
        if batch < 1:
            raise CommandError("--batch must be at least 1")
        if opts["dry_run"]:
            counts = operations.prunable_counts(result_ttl, dead_ttl, database=database)
            total = sum(counts.values())
            details = ", ".join(f"{state} {count}" for state, count in sorted(counts.items()))
            self.stdout.write(
                f"would delete {total} task(s){where}: {details} "
                f"(result_ttl={result_ttl:g}s, dead_ttl={dead_ttl:g}s)"
            )
            return
        deleted = operations.prune_expired(result_ttl, dead_ttl, batch, database=database)
        self.stdout.write(
            f"deleted {deleted} task(s){where} (result_ttl={result_ttl:g}s, dead_ttl={dead_ttl:g}s)"
        )
