"""The settler: writes outcomes back in fenced, batched statements.

Slots hand over outcomes; the settler takes whatever has accumulated and writes it in
one ``settle`` statement (so under load, many outcomes share one commit, and at idle
an outcome is written at once, with no waiting). Only when the statement has committed
does the worker count, log or acknowledge an outcome: an outcome whose fence matched no
row is counted as ``lost`` and never reported as a success.

An atomic task's outcome arrives written already (by its handler's own transaction,
worker/atomic.py): the settler only counts, logs and acknowledges it.

With TASK_LOGS, a batch whose outcomes carry log records is written in one transaction
with them (``settle``, then ``store_task_logs``): a batch without any is the one
statement it always was.

What can go wrong, and what it costs (never another task's outcome):

* A value PostgreSQL refuses (a data error): the batch is written again row by row,
  and only the row that cannot be stored is replaced by a failure saying why.
* A row locked by someone else (a hung handler's open transaction): ``settle`` skips
  it; ``settle_check`` says the lease still holds, and the outcome is retried later
  while the rest of the batch is written now.
* A lost connection: the statement is run again on a new one. Rows the first run
  already wrote are recognised by their executions entry (``settle_check``: written),
  so a replay is not mistaken for a lost lease.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections import Counter
from datetime import timedelta

import psycopg

from django_pgqueue.core.exceptions import TaskNotRegistered
from django_pgqueue.core.signals import task_settled
from django_pgqueue.db import sql
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.tasking.registry import registry
from django_pgqueue.worker import outcomes, task_logs
from django_pgqueue.worker.claimed import Lease
from django_pgqueue.worker.connection import CONNECTION_ERRORS, Session
from django_pgqueue.worker.inflight import InFlight
from django_pgqueue.worker.logging import task_fields
from django_pgqueue.worker.outcomes import FAILURE, LOST, SUCCESS, TIMEOUT, Outcome
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")

_STOP = object()
MAX_BATCH = 1000
# An outcome whose row is locked by someone else is retried after this long (doubling).
RETRY_LOCKED_AFTER = 0.2
RETRY_LOCKED_CAP = 5.0


class Settler:
    name = "settler"

    def __init__(
        self,
        alias: str,
        inflight: InFlight,
        stats: WorkerStats,
        worker_id: str = "",
        concurrency_limits: dict[str, int] | None = None,
    ) -> None:
        self._inflight = inflight
        self._alias = alias
        # Queue -> concurrency limit: a settlement in a queue at its limit notifies.
        limits = sorted((concurrency_limits or {}).items())
        self._limit_params = {
            "limit_queues": [queue for queue, _ in limits],
            "limit_concurrency": [limit for _, limit in limits],
        }
        self._stats = stats
        self._worker_id = worker_id
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._abort = threading.Event()
        # Outcomes whose row was locked: (when to retry, delay so far, outcome).
        self._deferred: list[tuple[float, float, Outcome]] = []
        self.session = Session(alias, self.name, self._abort)
        self._thread = threading.Thread(target=self._run, name="pgqueue-settler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, outcome: Outcome) -> None:
        self._inflight.mark_settling(outcome.task.lease)
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

    # -- the loop ---------------------------------------------------------------------
    def _run(self) -> None:
        stopping = False
        while True:
            batch, stopping = self._collect(stopping)
            if batch:
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
                    self._inflight.remove([o.task.lease for o in batch])
            if stopping and not self._deferred:
                return
            if stopping and self._abort.is_set():
                return

    def _collect(self, stopping: bool) -> tuple[list[Outcome], bool]:
        """Wait for outcomes (or a deferred retry coming due); take all that are ready."""
        now = time.monotonic()
        batch = [o for due, _, o in self._deferred if due <= now]
        if batch:
            self._deferred = [d for d in self._deferred if d[0] > now]
        if not batch and not stopping:
            wait = min((d[0] for d in self._deferred), default=now + 3600) - now
            try:
                item = self._queue.get(timeout=max(0.0, wait))
            except queue.Empty:
                return [], stopping
            if item is _STOP:
                stopping = True
            else:
                batch.append(item)
        elif stopping and not batch and self._deferred:
            time.sleep(max(0.0, min(d[0] for d in self._deferred) - now))
            return [], stopping
        while len(batch) < MAX_BATCH:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                stopping = True
                break
            batch.append(item)
        return batch, stopping

    # -- writing ----------------------------------------------------------------------
    def _flush(self, batch: list[Outcome]) -> None:
        # An atomic attempt's outcome committed with its handler's writes: only counted.
        written: dict[Lease, str] = {}
        unwritten: list[Outcome] = []
        for outcome in batch:
            if outcome.written is None:
                unwritten.append(_storable(outcome))
            else:
                written[outcome.task.lease] = outcome.written
        if unwritten:
            try:
                written.update(self._settle(unwritten))
            except psycopg.DataError:
                written.update(self._settle_one_by_one(unwritten))  # replaces, in place
        if len(unwritten) < len(batch):
            unwritten += [o for o in batch if o.written is not None]
        batch = unwritten
        missing = [o for o in batch if o.task.lease not in written]
        lost: list[Outcome] = []
        if missing:
            for outcome, status, state in self._check(missing):
                if status == "held":
                    self._defer(outcome)
                elif status == "written":
                    written[outcome.task.lease] = state
                else:
                    lost.append(outcome)
        self._account(batch, written, lost)

    def _settle(self, batch: list[Outcome]) -> dict[Lease, str]:
        payload = "[" + ",".join(_row_json(o) for o in batch) + "]"
        params = {"outcomes": payload, **self._limit_params}
        logged = [o for o in batch if o.logs is not None]

        def write(conn: psycopg.Connection) -> list[tuple]:
            if not logged:
                return sql.execute(conn, "settle", params).fetchall()
            # TASK_LOGS: the records commit with their settlements, or neither does.
            # (Plain BEGIN and COMMIT: psycopg's transaction object costs more.)
            conn.execute("BEGIN")
            try:
                rows = sql.execute(conn, "settle", params).fetchall()
                task_logs.store(conn.execute, logged)
                conn.execute("COMMIT")
            except BaseException:
                if not conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise
            return rows

        rows = self.session.call(write)
        return {Lease(r[0], r[1], r[2]): r[3] for r in rows}

    def _settle_one_by_one(self, batch: list[Outcome]) -> dict[Lease, str]:
        """A data error sank the batch: write each row alone, so the others land."""
        written: dict[Lease, str] = {}
        for index, outcome in enumerate(batch):
            try:
                written.update(self._settle([outcome]))
            except psycopg.DataError as exc:
                replacement = outcomes.unrunnable(
                    outcome.task,
                    "OutcomeNotStorable",
                    f"the {outcome.label} outcome of this attempt could not be stored "
                    f"(PostgreSQL: {str(exc).strip().splitlines()[0]}); recorded as a "
                    "failure instead",
                )
                logger.error(
                    "%s: outcome %s could not be stored (%s); failing the task instead",
                    outcome.task.log_prefix(),
                    outcome.label,
                    exc,
                    extra=self._fields(outcome, None),
                )
                batch[index] = replacement
                written.update(self._settle([replacement]))
        return written

    def _check(self, missing: list[Outcome]) -> list[tuple[Outcome, str, str | None]]:
        leases = json.dumps([o.task.lease.as_json() for o in missing])
        rows = self.session.call(
            lambda conn: conn.execute(QUERIES["settle_check"], {"leases": leases}).fetchall()
        )
        status = {Lease(r[0], r[1], r[2]): (r[3], r[4]) for r in rows}
        return [(o, *status.get(o.task.lease, ("lost", None))) for o in missing]

    def _defer(self, outcome: Outcome) -> None:
        previous = getattr(outcome, "_retry_delay", 0.0)
        delay = min(RETRY_LOCKED_CAP, previous * 2 if previous else RETRY_LOCKED_AFTER)
        outcome._retry_delay = delay  # type: ignore[attr-defined]
        # A first deferral is usually this worker's own heartbeat, renewing the lease
        # at that moment (its lock lasts milliseconds): DEBUG. Still locked after
        # RETRY_LOCKED_AFTER, someone holds the row for longer: WARNING, once.
        if previous in (0.0, RETRY_LOCKED_AFTER):
            logger.log(
                logging.WARNING if previous else logging.DEBUG,
                "%s: its row is locked by another transaction%s; the %s outcome will be "
                "written once the lock is released",
                outcome.task.log_prefix(),
                f" for over {previous:g}s (a handler's own open transaction?)" if previous
                else "",
                outcome.label,
                extra=self._fields(outcome, None),
            )
        self._stats.incr("settle_deferred")
        self._deferred.append((time.monotonic() + delay, delay, outcome))

    # -- after the write --------------------------------------------------------------
    def _account(
        self, batch: list[Outcome], written: dict[Lease, str], lost: list[Outcome]
    ) -> None:
        counts: Counter[str] = Counter()
        for outcome in batch:
            task = outcome.task
            state = written.get(task.lease)
            if state is not None:
                counts[outcome.label] += 1
                self._log_settled(outcome, state)
            elif outcome in lost:
                counts[LOST] += 1
                logger.warning(
                    "%s: lease lost before settlement; the %s outcome was not written "
                    "(another worker or the lease sweep owns the task now)",
                    task.log_prefix(),
                    outcome.label,
                    extra=self._fields(outcome, None),
                )
            else:
                continue  # deferred: still in flight
            self._announce(outcome, state)
        if lost:
            self._record_late(lost)
        self._inflight.remove([o.task.lease for o in batch if o.task.lease in written or o in lost])
        for label, count in counts.items():
            self._stats.incr(label, count)

    def _log_settled(self, outcome: Outcome, state: str) -> None:
        """One record per written outcome, at the level an error reporter acts on: a dead
        letter at ERROR, a failed attempt that will be retried at WARNING, both with the
        handler's exception; other outcomes at INFO, a success at DEBUG."""
        level = _level(outcome, state)
        if not logger.isEnabledFor(level):
            return
        logger.log(
            level,
            "%s: %s -> %s",
            outcome.task.log_prefix(),
            outcome.label,
            state,
            exc_info=outcome.exc if level >= logging.WARNING else None,
            extra=self._fields(outcome, state),
        )

    def _fields(self, outcome: Outcome, state: str | None) -> dict[str, object]:
        task = outcome.task
        return task_fields(
            task,
            outcome=outcome.label,
            state=state,
            duration=round(_duration(outcome), 6),
            worker=self._worker_id,
            database=self._alias,
        )

    def _record_late(self, lost: list[Outcome]) -> None:
        """History only: the refused runs still happened (best effort)."""
        entries = []
        for outcome in lost:
            task = outcome.task
            ran_for = time.monotonic() - task.received_monotonic
            entries.append(
                {
                    "id": task.id,
                    "entry": {
                        "attempt": task.attempt,
                        "token": task.lease_token,
                        "worker": self._worker_id,
                        "started": task.claimed_at.isoformat(),
                        "ended": (task.claimed_at + timedelta(seconds=ran_for)).isoformat(),
                        "outcome": outcome.label,
                        "state": None,
                    },
                }
            )
        try:
            self.session.call(
                lambda conn: conn.execute(
                    QUERIES["record_late_executions"], {"entries": json.dumps(entries)}
                ),
                retry=False,
            )
        except psycopg.Error as exc:
            logger.info("settler: could not record %d late execution(s): %s", len(lost), exc)

    def _announce(self, outcome: Outcome, state: str | None) -> None:
        task = outcome.task
        if not task_settled.receivers:
            return
        try:
            definition = registry.get(task.task_name, task.handler_version)
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
            database=self._alias,
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


def _level(outcome: Outcome, state: str) -> int:
    if state == "failed":  # a dead letter: failed for good
        return logging.ERROR
    # A failed attempt that will be retried.
    if state in ("pending", "scheduled") and outcome.label in (FAILURE, TIMEOUT, LOST):
        return logging.WARNING
    if outcome.label == SUCCESS:
        return logging.DEBUG
    return logging.INFO


def _duration(outcome: Outcome) -> float:
    """Seconds the attempt ran: the handler's own time when it returned, else from its
    start (or its claim, if it never started) until now."""
    if outcome.runtime is not None:
        return outcome.runtime
    task = outcome.task
    return time.monotonic() - (task.started_monotonic or task.received_monotonic)


def _row_json(outcome: Outcome) -> str:
    """The outcome's row for the settle statement, encoded once (``_storable`` encodes
    it first; a deferred outcome is written again with the same text)."""
    if outcome.encoded is None:
        outcome.encoded = _encode(outcome.as_row())
    return outcome.encoded


# json.dumps with options builds an encoder per call; one serves every outcome.
_encode = json.JSONEncoder(separators=(",", ":")).encode


def _storable(outcome: Outcome) -> Outcome:
    """The outcome, or a failure saying why its values cannot be encoded as JSON."""
    try:
        _row_json(outcome)
    except (TypeError, ValueError) as exc:
        logger.error(
            "%s: outcome %s cannot be stored as JSON (%s); failing the task instead",
            outcome.task.log_prefix(),
            outcome.label,
            exc,
            extra=task_fields(outcome.task, outcome=outcome.label),
        )
        return outcomes.unrunnable(
            outcome.task,
            "OutcomeNotStorable",
            f"the {outcome.label} outcome of this attempt cannot be stored as JSON "
            f"({outcomes.clean_text(str(exc), 500)}); recorded as a failure instead",
        )
    return outcome
