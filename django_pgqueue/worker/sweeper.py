"""The sweeper: recovers tasks whose lease expired, and cleans stale worker rows.

Recovery burns the attempt the claim already counted: a task that kills its worker
every time runs out of attempts and dead-letters instead of looping.
"""

from __future__ import annotations

import logging
import time

from django_pgqueue.worker.connection import Session
from django_pgqueue.worker.periodic import Fleet, Periodic
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")

BATCH = 100


class Sweeper(Periodic):
    name = "sweeper"

    def __init__(
        self,
        alias: str,
        interval: float,
        stale_after: float,
        unroutable_ttl: float | None,
        stats: WorkerStats,
        fleet: Fleet | None = None,
        session: Session | None = None,
    ) -> None:
        super().__init__(alias, interval, fleet, session)
        self.stale_after = stale_after
        self.unroutable_ttl = unroutable_ttl
        self.stats = stats
        self._cleanup_at = time.monotonic() + stale_after / 2

    def tick(self) -> None:
        self.recover_expired_leases()
        now = time.monotonic()
        if now >= self._cleanup_at:
            # Also a fleet-wide duty: every stale_after / 2 in each of N processes'
            # turn, about every stale_after / 2 across the fleet.
            self._cleanup_at = now + self.period / self.interval * self.stale_after / 2
            removed = self.session.fetchall(
                "delete_stale_workers", {"stale_seconds": self.stale_after}
            )
            if removed:
                logger.info(
                    "sweeper: removed %d worker row(s) whose heartbeat stopped (workers that "
                    "exited without saying so)",
                    len(removed),
                )
            self.prune_key_rates()
            if self.unroutable_ttl is not None:
                self.fail_unroutable()

    def prune_key_rates(self) -> int:
        """Delete the per-key rate rows whose budget is whole again (no row is a whole
        budget): the table holds the keys active within about one period."""
        total = 0
        while True:
            (count,) = self.session.fetchall("prune_key_rates", {"limit": BATCH * 10})[0]
            total += count
            if count < BATCH * 10:
                return total

    def fail_unroutable(self) -> int:
        """Fail one batch of tasks due for UNROUTABLE_TTL that their queue's live workers
        cannot run. A queue no live worker serves is left alone, however old its backlog.
        """
        rows = self.session.fetchall(
            "fail_unroutable",
            {
                "stale_seconds": self.stale_after,
                "ttl_seconds": self.unroutable_ttl,
                "limit": BATCH,
            },
        )
        for task_id, message in rows:
            logger.error(
                "sweeper: task %s failed as unroutable: %s",
                task_id,
                message,
                extra={"task_id": task_id, "outcome": "unroutable", "state": "failed",
                       "database": self.session.alias},
            )  # fmt: skip
        self.stats.incr("unroutable_failed", len(rows))
        return len(rows)

    def recover_expired_leases(self) -> int:
        total = 0
        while True:
            rows = self.session.fetchall("recover_expired_leases", {"limit": BATCH})
            for task_id, state, _ in rows:
                # Failed: the lease lapsed on the last attempt, a dead letter.
                logger.log(
                    logging.ERROR if state == "failed" else logging.WARNING,
                    "sweeper: task %s lease expired; now %s",
                    task_id,
                    state,
                    extra={"task_id": task_id, "outcome": "lost", "state": state,
                           "database": self.session.alias},
                )  # fmt: skip
            total += len(rows)
            if len(rows) < BATCH:
                break
        self.stats.incr("leases_recovered", total)
        return total
