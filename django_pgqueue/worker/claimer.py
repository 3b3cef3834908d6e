"""The claimer: takes as many due rows as there are free slots, in one statement.

It loops while claims come back full; otherwise it parks until a wake-up (a
notification on its own connection, see listener.py), the next due time of a scheduled
task, or the jittered poll interval, whichever is first. Polling is the correctness
floor; wake-ups and next-due only make it fast.
"""

from __future__ import annotations

import logging
import random
import threading

import psycopg

from django_pgqueue.worker.connection import Session
from django_pgqueue.worker.execution import ClaimedTask
from django_pgqueue.worker.inflight import InFlight
from django_pgqueue.worker.listener import Listener
from django_pgqueue.worker.slots import SlotPool
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")


class Claimer:
    name = "claimer"

    def __init__(
        self,
        alias: str,
        worker_id: str,
        queues: list[str],
        routes: list[str],
        slots: SlotPool,
        inflight: InFlight,
        stats: WorkerStats,
        *,
        lease_seconds: float,
        poll_interval: float,
        starvation_timeout: float,
    ) -> None:
        self.worker_id = worker_id
        self.queues = queues
        self.routes = routes
        self.slots = slots
        self.inflight = inflight
        self.stats = stats
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self.starvation_timeout = starvation_timeout
        self._stop = threading.Event()
        self.listener = Listener(queues)
        # Claims commit asynchronously: see connection.connect().
        self.session = Session(
            alias, self.name, self._stop, durable=False, on_connect=self.listener.attach
        )
        self._thread = threading.Thread(target=self._run, name="pgqueue-claimer", daemon=True)
        self._rotation = 0
        # Set while parked with nothing claimable (burst mode exits on it).
        self.idle = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self.listener.wake()

    def stop(self) -> None:
        self._stop.set()
        self.listener.wake()
        self._thread.join(10)
        self.session.close()
        self.listener.close()

    def _run(self) -> None:
        linger_for = max(1, self.slots.size // 2)
        while not self._stop.is_set():
            free = self.slots.wait_for_free(linger_for, 0.001, self._stop)
            if self._stop.is_set():
                break
            # Clear before claiming: a wake-up that arrives during the claim is kept.
            self.listener.clear()
            settled_before = not self.inflight
            try:
                claimed, saturated = self._claim_round(free)
            except Exception:
                if self._stop.is_set():
                    break
                logger.exception("claimer: claim failed")
                self._stop.wait(1.0)
                continue
            if saturated or claimed == free:
                self.idle.clear()
                continue
            if claimed:
                self.idle.clear()
            try:
                timeout = self._park_timeout()
            except Exception:
                if self._stop.is_set():
                    break
                logger.exception("claimer: next-due lookup failed")
                timeout = self.poll_interval
            # Idle means: a claim that started after every outcome was written (so it
            # saw every task those outcomes made due again) found nothing.
            if not claimed and settled_before and not self.inflight:
                self.idle.set()
            else:
                self.idle.clear()
            try:
                self.listener.wait(self.session._conn, timeout)
            except psycopg.Error:
                self.session.close()  # the next claim reconnects (and LISTENs again)

    def _claim_round(self, free: int) -> tuple[int, bool]:
        """One claim per queue (rotating which goes first) until the slots are full."""
        n = len(self.queues)
        order = [self.queues[(self._rotation + i) % n] for i in range(n)]
        self._rotation = (self._rotation + 1) % n
        claimed, saturated = 0, False
        for queue_name in order:
            want = free - claimed
            if want <= 0:
                break
            rows = self.session.fetchall(
                "claim",
                {
                    "queue": queue_name,
                    "limit": want,
                    "routes": self.routes,
                    "lease_seconds": self.lease_seconds,
                    "starvation_seconds": self.starvation_timeout,
                    "worker_id": self.worker_id,
                },
            )
            if not rows:
                continue
            tasks = [ClaimedTask.from_row(row) for row in rows]
            tasks.sort(key=lambda t: (-t.priority, t.run_at, t.id))
            self.inflight.add(tasks)
            self.slots.submit(tasks)
            self.stats.incr("claimed", len(tasks))
            claimed += len(tasks)
            saturated = saturated or len(tasks) == want
        return claimed, saturated

    def _park_timeout(self) -> float:
        timeout = self.poll_interval * random.uniform(0.9, 1.1)
        for queue_name in self.queues:
            rows = self.session.fetchall("next_due", {"queue": queue_name, "routes": self.routes})
            if rows:
                timeout = min(timeout, max(0.0, rows[0][1]))
        return timeout
