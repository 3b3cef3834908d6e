"""The heartbeat: one fenced UPDATE renews every in-flight lease of this process.

It also refreshes the worker's registry row, hands cancel requests to the running
handlers (a hard cancel also to the execution pool, which kills the handler's
process), and flags handlers whose lease was lost (so a cooperative handler can stop
early; the settlement is fenced either way). Every lease is named by (id, attempt,
token): an old run of a task and a new attempt of it are renewed, or lost, separately.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.worker.claimed import ClaimedTask, Lease
from django_pgqueue.worker.inflight import InFlight
from django_pgqueue.worker.logging import task_fields
from django_pgqueue.worker.periodic import Fleet, Periodic
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
        on_hard_cancel: Callable[[ClaimedTask], None] | None = None,
        fleet: Fleet | None = None,
        stale_after: float = 60.0,
    ) -> None:
        super().__init__(alias, interval)
        # Counted by each beat, read by the fleet-wide duties (periodic.py).
        self.live = fleet or Fleet()
        self.stale_after = stale_after
        self.lease_seconds = lease_seconds
        self.worker_id = worker_id
        self.inflight = inflight
        self.stats = stats
        self.register = register
        self.on_hard_cancel = on_hard_cancel
        self._lost_logged: set[Lease] = set()

    def wait_first(self) -> float:
        return self.interval

    def tick(self) -> None:
        self.renew_leases()
        params = {
            "in_flight": len(self.inflight),
            "id": self.worker_id,
            "stale_seconds": self.stale_after,
        }
        touched = self.session.call(
            lambda conn: conn.execute(QUERIES["touch_worker"], params).fetchall()
        )
        if not touched:
            logger.info("heartbeat: worker row was cleaned up (outage?); registering again")
            self.register()
            return
        self.live.size = max(1, touched[0][0])

    def renew_leases(self) -> None:
        tasks = self.inflight.snapshot()
        if not tasks:
            self._lost_logged.clear()
            return
        leases = json.dumps([t.lease.as_json() for t in tasks])
        sent = time.monotonic()
        rows = self.session.fetchall(
            "heartbeat", {"leases": leases, "lease_seconds": self.lease_seconds}
        )
        renewed = {Lease(r[0], r[1], r[2]): (r[3], r[4]) for r in rows}
        self.stats.incr("lease_renewals", len(renewed))
        missing = [t for t in tasks if t.lease not in renewed]
        held: set[Lease] = set()
        if missing:
            # Not renewed: still ours (its row was locked), settled by this very lease
            # (an atomic attempt's own commit, on its way to the settler), or lost.
            check = json.dumps([t.lease.as_json() for t in missing])
            held = {
                Lease(r[0], r[1], r[2])
                for r in self.session.fetchall("settle_check", {"leases": check})
                if r[3] != "lost"
            }
        for task in tasks:
            lease = task.lease
            if lease in held:
                continue
            if lease in renewed:
                task.renewed_monotonic = sent
                cancel, hard = renewed[lease]
                if cancel and not (task.cancel_requested and task.cancel_hard >= hard):
                    task.request_cancel(hard)
                    if hard and self.on_hard_cancel is not None:
                        self.on_hard_cancel(task)
            elif not self.inflight.is_settling(lease) and lease not in self._lost_logged:
                self._lost_logged.add(lease)
                self.stats.incr("lease_lost")
                task.mark_lease_lost()
                logger.warning(
                    "%s: lease lost while the handler is running (recovered after "
                    "expiry); its outcome will not be written",
                    task.log_prefix(),
                    extra=task_fields(task, outcome="lost", worker=self.worker_id),
                )
        self._lost_logged &= {t.lease for t in tasks}
