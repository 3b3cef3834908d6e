"""The vacuumer: keeps the claim fast while a busy queue drains.

Every claim leaves a dead index entry at the head of the claim index; the next claims
walk over those entries until a VACUUM removes them. Autovacuum looks at a database at
most once a minute (``autovacuum_naptime``), and on a busy queue that is long enough
for the claim to slow down several times over (measured: 11,000 -> 4,000 tasks/s within
36 s of draining a 300,000-task backlog; with this component it stays at 11,000).

So each worker checks, every VACUUM_INTERVAL seconds, PostgreSQL's count of dead tuples
in the task table, and past VACUUM_THRESHOLD runs ``VACUUM (SKIP_LOCKED)`` on it.
A fleet-wide advisory lock lets one worker vacuum at a time; SKIP_LOCKED makes it step
aside when autovacuum is already at it. VACUUM needs the table's owner: a worker that
is not disables this component and says so once.
"""

from __future__ import annotations

import logging
import time

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.worker.connection import Session, connect
from django_pgqueue.worker.periodic import Fleet, Periodic
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")


class Vacuumer(Periodic):
    name = "vacuumer"

    def __init__(
        self,
        alias: str,
        interval: float,
        threshold: int,
        stats: WorkerStats,
        fleet: Fleet | None = None,
        session: Session | None = None,
    ) -> None:
        super().__init__(alias, interval, fleet, session)
        self.alias = alias
        self.threshold = threshold
        self.stats = stats
        self._allowed: bool | None = None

    def tick(self) -> None:
        if self._allowed is None:
            self._allowed = bool(self.session.fetchall("owns_task_table")[0][0])
            if not self._allowed:
                logger.info(
                    "vacuumer: this role does not own pgqueue_task, so it cannot VACUUM it; "
                    "leaving the table to autovacuum (see docs/performance.md)"
                )
        if not self._allowed:
            return
        locked, dead = self.session.fetchall("vacuum_due", {"threshold": self.threshold})[0]
        if not locked:
            return
        try:
            started = time.monotonic()
            # On a connection of its own, opened for it: a VACUUM may take seconds, and
            # the session it checks on is shared with short duties (worker.py).
            with connect(self.alias) as conn:
                conn.execute(QUERIES["vacuum_task_table"])
            self.stats.incr("vacuums")
            logger.debug(
                "vacuumer: vacuumed pgqueue_task (%d dead tuples) in %.2fs",
                dead,
                time.monotonic() - started,
            )
        finally:
            self.session.fetchall("vacuum_done")
