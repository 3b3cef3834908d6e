"""The heartbeat: one fenced UPDATE renews every in-flight lease of this process.

It also refreshes the worker's registry row, hands cancel requests to the running
handlers' contexts, and flags contexts whose lease was lost (so a cooperative handler
can stop early; the settlement is fenced either way).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from django_pgqueue.sql import QUERIES
from django_pgqueue.worker.inflight import InFlight
from django_pgqueue.worker.periodic import Periodic
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")


class Heartbeat(Periodic):
    name = "heartbeat"

    def __init__(
        self,
        alias: str,
        interval: float,
        lease_seconds: float,
        worker_id: str,
        inflight: InFlight,
        stats: WorkerStats,
        register: Callable[[], None],
    ) -> None:
        super().__init__(alias, interval)
        self.lease_seconds = lease_seconds
        self.worker_id = worker_id
        self.inflight = inflight
        self.stats = stats
        self.register = register

    def wait_first(self) -> float:
        return self.interval

    def tick(self) -> None:
        self.renew_leases()
        params = {"in_flight": len(self.inflight), "id": self.worker_id}
        touched = self.session.call(
            lambda conn: conn.execute(QUERIES["touch_worker"], params).rowcount
        )
        if not touched:
            logger.info("heartbeat: worker row was cleaned up (outage?); registering again")
            self.register()

    def renew_leases(self) -> None:
        tasks = self.inflight.snapshot()
        if not tasks:
            return
        leases = json.dumps(
            [{"id": t.id, "attempt": t.attempt, "token": t.lease_token} for t in tasks]
        )
        rows = self.session.fetchall(
            "heartbeat",
            {
                "leases": leases,
                "lease_seconds": self.lease_seconds,
            },
        )
        renewed = dict(rows)
        self.stats.incr("lease_renewals", len(renewed))
        missing = [t for t in tasks if t.id not in renewed]
        held: set[int] = set()
        if missing:
            check = json.dumps(
                [{"id": t.id, "attempt": t.attempt, "token": t.lease_token} for t in missing]
            )
            held = {row[0] for row in self.session.fetchall("still_leased", {"leases": check})}
        for task in tasks:
            if task.id in held:
                continue
            if task.id in renewed:
                if renewed[task.id]:
                    task.cancel_requested = True
                    if task.context is not None:
                        task.context._cancel_requested = True
            elif not self.inflight.is_settling(task.id):
                self.stats.incr("lease_lost")
                if task.context is not None:
                    task.context._lease_lost = True
                logger.warning(
                    "task %s (%s) attempt %s: lease lost while the handler is running "
                    "(recovered after expiry); its outcome will not be written",
                    task.id,
                    task.task_name,
                    task.attempt,
                )
