"""The pruner: retention of terminal rows, in small batches (retention.py).

Succeeded and cancelled rows go after RESULT_TTL, dead letters (failed) after
DEAD_TTL. Rows under a lease are never touched (terminal rows have none). With
PRUNE_ARCHIVE_DIR, each batch is written to the archive (archive.py) before it is
deleted, and a batch whose write fails is not deleted: the pruner logs why and tries
again on its next tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg

from django_pgqueue.ops.archive import Archive, ArchiveError
from django_pgqueue.ops.retention import Cursor, prune, prune_to_archive
from django_pgqueue.worker.connection import Session
from django_pgqueue.worker.periodic import Fleet, Periodic
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")


class Pruner(Periodic):
    name = "pruner"

    def __init__(
        self,
        alias: str,
        interval: float,
        result_ttl: float,
        dead_ttl: float,
        batch: int,
        stats: WorkerStats,
        fleet: Fleet | None = None,
        session: Session | None = None,
        archive_dir: str | None = None,
    ) -> None:
        super().__init__(alias, interval, fleet, session)
        self.result_ttl = result_ttl
        self.dead_ttl = dead_ttl
        self.batch = batch
        self.stats = stats
        self.archive = Archive(archive_dir, alias) if archive_dir else None

    def tick(self) -> None:
        if self.archive is None:
            deleted = prune(self.session.fetchall, self.result_ttl, self.dead_ttl, self.batch)
        else:
            try:
                deleted = prune_to_archive(
                    self._in_transaction, self.archive, self.result_ttl, self.dead_ttl, self.batch
                )
            except ArchiveError as exc:
                logger.error("pruner: %s; retrying in %.0fs", exc, self.period)
                return
        if deleted:
            logger.info(
                "pruner: deleted %d finished task(s) kept past their retention "
                "(RESULT_TTL, DEAD_TTL)",
                deleted,
            )
        self.stats.incr("pruned", deleted)

    def _in_transaction(self, function: Callable[[Cursor], Any]) -> Any:
        def run(conn: psycopg.Connection) -> Any:
            with conn.transaction(), conn.cursor() as cursor:
                return function(cursor)

        return self.session.call(run)
