"""The settler: writes outcomes back in fenced, batched statements.

Slots hand over outcomes; the settler takes whatever has accumulated and writes it in
one ``settle`` statement (so under load, many outcomes share one commit, and at idle
an outcome is written at once, with no waiting). Only when the statement has committed
does the worker count, log or acknowledge an outcome: an outcome whose fence matched no
row is counted as ``lost`` and never reported as a success.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import Counter

from django_pgqueue.exceptions import TaskNotRegistered
from django_pgqueue.registry import registry
from django_pgqueue.signals import task_settled
from django_pgqueue.sql import QUERIES
from django_pgqueue.worker.connection import CONNECTION_ERRORS, Session
from django_pgqueue.worker.execution import LOST, SUCCESS, Outcome
from django_pgqueue.worker.inflight import InFlight
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")

_STOP = object()
MAX_BATCH = 1000


class Settler:
    name = "settler"

    def __init__(self, alias: str, inflight: InFlight, stats: WorkerStats) -> None:
        self._inflight = inflight
        self._stats = stats
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._abort = threading.Event()
        self.session = Session(alias, self.name, self._abort)
        self._thread = threading.Thread(target=self._run, name="pgqueue-settler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, outcome: Outcome) -> None:
        self._inflight.mark_settling(outcome.task.id)
        self._queue.put(outcome)

    def stop(self, timeout: float) -> None:
        """Flush everything handed over so far, then stop (abandon after ``timeout``)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.error("settler: could not flush within %.1fs; giving up", timeout)
            self._abort.set()
            self._thread.join(1.0)
        self.session.close()

    def _announce(self, outcome: Outcome, state: str | None) -> None:
        task = outcome.task
        if not task_settled.receivers:
            return
        try:
            definition = registry.get(task.task_name)
        except TaskNotRegistered:
            return
        results = task_settled.send_robust(
            definition,
            task_id=task.id,
            attempt=task.attempt,
            outcome=outcome.label,
            state=state,
            written=state is not None,
            queue=task.queue,
            runtime=(
                outcome.runtime
                if outcome.runtime is not None
                else time.monotonic() - task.received_monotonic
            ),
            queue_wait=max(0.0, (task.claimed_at - task.run_at).total_seconds()),
        )
        for receiver, result in results:
            if isinstance(result, Exception):
                logger.error("task_settled receiver %r raised %r (ignored)", receiver, result)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                break
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
            try:
                self._flush(batch)
            except CONNECTION_ERRORS:
                logger.error(
                    "settler: aborted with %d outcome(s) unwritten; their leases "
                    "will expire and the tasks run again",
                    len(batch),
                )
                return
            except Exception:
                logger.exception("settler: could not write %d outcome(s)", len(batch))
                self._inflight.remove([o.task.id for o in batch])

    def _flush(self, batch: list[Outcome]) -> None:
        payload = json.dumps([o.as_row() for o in batch], separators=(",", ":"))
        rows = self.session.call(
            lambda conn: conn.execute(QUERIES["settle"], {"outcomes": payload}).fetchall()
        )
        written = {row[0]: row[1] for row in rows}
        counts: Counter[str] = Counter()
        for outcome in batch:
            task = outcome.task
            if task.id in written:
                counts[outcome.label] += 1
                if outcome.label != SUCCESS:
                    logger.info(
                        "task %s (%s) attempt %s: %s -> %s",
                        task.id,
                        task.task_name,
                        task.attempt,
                        outcome.label,
                        written[task.id],
                    )
            else:
                counts[LOST] += 1
                logger.warning(
                    "task %s (%s) attempt %s: lease lost before settlement; the %s outcome "
                    "was not written (another worker or the lease sweep owns the task now)",
                    task.id,
                    task.task_name,
                    task.attempt,
                    outcome.label,
                )
            self._announce(outcome, written.get(task.id))
        self._inflight.remove([o.task.id for o in batch])
        for label, count in counts.items():
            self._stats.incr(label, count)
