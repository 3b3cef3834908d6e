"""The pruner: retention of terminal rows, in small batches.

Succeeded and cancelled rows go after RESULT_TTL, dead letters (failed) after
DEAD_TTL. Rows under a lease are never touched (terminal rows have none).
"""

from __future__ import annotations

import logging

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
    ) -> None:
        super().__init__(alias, interval, fleet, session)
        self.result_ttl = result_ttl
        self.dead_ttl = dead_ttl
        self.batch = batch
        self.stats = stats

    def tick(self) -> None:
        deleted = prune(self.session.fetchall, self.result_ttl, self.dead_ttl, self.batch)
        if deleted:
            logger.info(
                "pruner: deleted %d finished task(s) kept past their retention "
                "(RESULT_TTL, DEAD_TTL)",
                deleted,
            )
        self.stats.incr("pruned", deleted)


def prune(fetchall, result_ttl: float, dead_ttl: float, batch: int, max_batches: int = 1000) -> int:
    """Delete expired terminal rows batch by batch; returns how many were deleted."""
    total = 0
    for _ in range(max_batches):
        rows = fetchall("prune", {"result_ttl": result_ttl, "dead_ttl": dead_ttl, "batch": batch})
        total += len(rows)
        if len(rows) < batch:
            break
    return total
