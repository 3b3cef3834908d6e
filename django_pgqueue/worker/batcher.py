"""The batcher: claims the tasks of batch handlers into batches (docs/tenants.md).

A task declared with ``batch_size`` is claimed here, not by the claimer: per (queue,
task, version), up to ``batch_size`` due rows, each with its own lease (the claim
statement of a plain lane, restricted to that route). Once the batch is full, or
``batch_wait`` seconds after its first row was claimed, it goes to a slot as one task
(its first row, the carrier, holds the others in ``batch``): the handler takes the
batch in one call, and each row's outcome is settled on its own lease
(execution.execute_batch). While a batch fills, its rows are in flight: the heartbeat
renews their leases, and claims every BATCH_POLL top it up. A batch occupies one slot,
whatever its size.

The batcher has its own connection (a worker without batch tasks has no batcher). It
claims when the claimer wakes up for a notification of its queues (``wake``), while a
batch fills, and every POLL_INTERVAL; a worker stopping releases the rows of the
batches still filling (they never started).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from django_pgqueue.tasking.registry import TaskDefinition
from django_pgqueue.worker.claimed import ClaimedTask
from django_pgqueue.worker.claimer import _fetch, claim_statement, route_params
from django_pgqueue.worker.connection import CONNECTION_ERRORS, Backoff, Session
from django_pgqueue.worker.inflight import InFlight
from django_pgqueue.worker.outcomes import Outcome, released
from django_pgqueue.worker.slots import SlotPool
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")

# While a batch fills, it is topped up this often (seconds), until batch_wait.
BATCH_POLL = 0.05
# A full batch waits for a free slot, looking again this often (seconds).
SLOT_POLL = 0.005


@dataclass(eq=False)
class _Batch:
    """The rows of one route claimed so far, and when the first of them was."""

    queue: str
    definition: TaskDefinition
    tasks: list[ClaimedTask] = field(default_factory=list)
    since: float = 0.0

    def ready(self, now: float) -> bool:
        size = self.definition.batch_size or 1
        return len(self.tasks) >= size or (
            bool(self.tasks) and now - self.since >= self.definition.batch_wait
        )


class Batcher:
    name = "batcher"

    def __init__(
        self,
        alias: str,
        worker_id: str,
        queues: list[str],
        definitions: list[TaskDefinition],
        slots: SlotPool,
        inflight: InFlight,
        stats: WorkerStats,
        *,
        lease_seconds: float,
        poll_interval: float,
        release: Callable[[Outcome], None],
        durable: bool = True,
        claim_batch_bytes: int | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.slots = slots
        self.inflight = inflight
        self.stats = stats
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self._release = release
        self._batches = [_Batch(queue, d) for queue in queues for d in definitions]
        # One claim's parameters per route: a plain lane of that route alone.
        self._params = {
            id(batch): route_params(
                [batch.queue], [(batch.definition.name, batch.definition.version)], 0.0,
                claim_batch_bytes=claim_batch_bytes,
            )
            | {"look_for_starving": False}
            for batch in self._batches
        }  # fmt: skip
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._backoff = Backoff()
        self.session = Session(alias, self.name, self._stop, durable=durable)
        self._thread = threading.Thread(target=self._run, name="pgqueue-batcher", daemon=True)
        # Set while its last round claimed nothing and no batch is filling (--burst).
        self.idle = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Claim now (a notification said a task of the worker's queues is due)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop claiming, and release the rows of the batches still filling."""
        self._stop.set()
        self._wake.set()
        self._thread.join(10)
        for batch in self._batches:
            for task in batch.tasks:
                self._release(released(task))
            batch.tasks = []
        self.session.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                timeout = self._round()
                self._backoff.reset()
            except CONNECTION_ERRORS:
                self.session.close()
                timeout = self._backoff.next_delay()
            except Exception:
                logger.exception("batcher: claim failed")
                timeout = 1.0
            if self._wake.wait(timeout):
                self._wake.clear()

    def _round(self) -> float:
        """Top up each route's batch and hand over those that are ready; how long to
        wait before the next round."""
        wait = self.poll_interval
        found = False
        for batch in self._batches:
            if self._stop.is_set():
                break
            size = batch.definition.batch_size or 1
            if len(batch.tasks) < size:
                claimed = self._claim(batch, size - len(batch.tasks))
                found = found or bool(claimed)
                if claimed and not batch.tasks:
                    batch.since = time.monotonic()
                batch.tasks.extend(claimed)
            if not batch.tasks:
                continue
            now = time.monotonic()
            if not batch.ready(now):
                wait = min(wait, BATCH_POLL, batch.since + batch.definition.batch_wait - now)
            elif self.slots.free() > 0:
                self._hand_over(batch)
                wait = 0.0  # there may be more to claim at once
            else:
                wait = min(wait, SLOT_POLL)
        if found or any(batch.tasks for batch in self._batches):
            self.idle.clear()
        else:
            self.idle.set()
        return max(0.0, wait)

    def _claim(self, batch: _Batch, want: int) -> list[ClaimedTask]:
        params = {
            **self._params[id(batch)],
            "limit": want,
            "token": str(uuid.uuid4()),
            "lease_seconds": self.lease_seconds,
            "worker_id": self.worker_id,
        }
        statement = claim_statement(params)
        self.stats.incr("batch_claim_statements")
        tasks = self.session.call(lambda conn: _fetch(conn, statement, params), retry=False)
        expired = [task for task in tasks if task.expired]
        if expired:
            self.stats.incr("expired", len(expired))
        tasks = [task for task in tasks if not task.expired]
        self.inflight.add(tasks)  # leased from now on: the heartbeat renews them
        return tasks

    def _hand_over(self, batch: _Batch) -> None:
        tasks, batch.tasks = batch.tasks, []
        carrier = tasks[0]
        carrier.batch = tasks
        # overflow: the claimer may have taken the free slot since it was counted; the
        # batch then waits for the next one in the slots' queue (it is in flight).
        self.slots.submit([carrier], overflow=True)
        self.stats.incr("batches")
        self.stats.incr("claimed", len(tasks))


def settle_each(put: Callable[[Outcome], None]) -> Callable[[Outcome | list[Outcome]], None]:
    """An outcome sink for the slots that also takes a batch's list of outcomes."""

    def settle(outcome: Outcome | list[Outcome]) -> None:
        for each in outcome if isinstance(outcome, list) else [outcome]:
            put(each)

    return settle
