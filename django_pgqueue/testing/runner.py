"""Running due tasks inside a test, through the worker's own SQL and outcome policy.

``run_tasks`` is a worker reduced to one slot in the test's thread: it stages what is
due (``stage``), claims one task (``claim``, with every registered task as a route),
runs its handler (``execution.execute``, the worker's outcome mapping), and writes the
outcome (``settle``, fenced on the lease it just took), until nothing is due. So a
retry is scheduled after its backoff, a dependent task is released by the trigger, a
chord's callback runs once its members have ended, ``Suspend`` waits for its signal
and ``Continue`` comes back, and the tasks of a sequence run one after another: as in
production. An atomic task (``atomic=True``) runs in its transaction (a savepoint inside
the test's), which its outcome commits with, or which rolls back with its handler's
writes when it fails.

Everything happens on the test's own connection to the queue's database, so it works
inside a ``TestCase`` (whose rows no other connection can see) as well as with
committed data. Inside a transaction, each handler runs in a savepoint: a handler that
leaves the transaction aborted (a failed statement it caught) is rolled back to it, so
the outcome can still be written and the test can go on. Callbacks a handler registers
with ``transaction.on_commit`` (``enqueue_on_commit``) run right after it, as they
would in a worker, where a handler runs in autocommit.

No worker row, heartbeat or sweep is involved, and no lease outlives the call: every
claimed task is settled before the next is claimed (docs/testing.md).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from asgiref.sync import async_to_sync
from django.db import connections, transaction
from psycopg.types.json import JsonbLoader

from django_pgqueue.core.conf import database_for, get_setting, get_settings
from django_pgqueue.core.exceptions import Retry, TaskNotRegistered
from django_pgqueue.core.signals import task_settled
from django_pgqueue.db import encryption
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.tasking.registry import registry
from django_pgqueue.worker.claimed import ClaimedTask, claimed_rows
from django_pgqueue.worker.claimer import STAGE_BATCH, route_params, stage_params
from django_pgqueue.worker.execution import execute, execute_async, execute_batch
from django_pgqueue.worker.outcomes import FAILURE, TIMEOUT, Outcome
from django_pgqueue.worker.settler import _row_json, _storable

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from django_pgqueue.models import Task

logger = logging.getLogger("django_pgqueue.testing")

# Without max_tasks, a call that has run this many tasks stops with an error: a task
# that requeues itself forever (Snooze or Continue, or Retry with scheduled=True) would
# otherwise never let the test end.
RUN_LIMIT = 10_000

# Make due what is due by the wall clock, before ``stage`` stages it. Inside a TestCase
# the test is one transaction, so the database's now() stays at its start while rows
# are stamped later (enqueue's run_at is statement_timestamp()): a dependent released by
# the trigger would be 'scheduled' for ever, and a suspension's timeout would never
# pass. Rows due by clock_timestamp() are made due by now(); with scheduled=True
# (%(everything)s) every scheduled row is, retries waiting out their backoff included.
# A test-time clock correction, not part of the queue's database contract: it lives
# here rather than in db/sql/. In autocommit now() is the statement's start,
# and only %(everything)s changes anything.
_MAKE_DUE = """
UPDATE pgqueue_task
   SET run_at = CASE WHEN state = 'scheduled' THEN now() ELSE run_at END,
       wait_until = CASE WHEN state = 'waiting' THEN now() ELSE wait_until END
 WHERE queue = ANY (%(queues)s::text[])
   AND ((state = 'scheduled' AND run_at > now()
         AND (%(everything)s OR run_at <= clock_timestamp()))
        OR (state = 'waiting' AND wait_until > now() AND wait_until <= clock_timestamp()))
"""

# The queues that have something to run, when the caller names none.
_LIVE_QUEUES = """
SELECT DISTINCT queue
  FROM pgqueue_task
 WHERE state IN ('scheduled', 'pending', 'waiting')
 ORDER BY queue
"""


class TaskFailed(AssertionError):
    """``run_tasks(raise_errors=True)``: a task failed without a Python exception to
    re-raise (its stored arguments do not fit, its result is not JSON...)."""


@dataclass(frozen=True)
class TaskRun:
    """One execution by ``run_tasks``: the task, and what its settlement wrote."""

    id: int
    task_name: str
    queue: str
    attempt: int
    args: list[Any]
    kwargs: dict[str, Any]
    # The outcome's label: success, failure, timeout, cancelled, continued, snoozed,
    # suspended (django_pgqueue.worker.outcomes).
    outcome: str
    # The row's state after the settlement: succeeded, failed, pending, scheduled...
    state: str
    result: Any = None
    error: dict[str, Any] | None = None
    # The exception the handler raised, if it raised one.
    exception: BaseException | None = field(default=None, repr=False)


@dataclass
class RunResult:
    """What a ``run_tasks`` call ran, in order."""

    runs: list[TaskRun] = field(default_factory=list)
    # The alias of the table the tasks ran from.
    database: str = "default"

    def __len__(self) -> int:
        return len(self.runs)

    @property
    def ids(self) -> list[int]:
        """The ids of the tasks run, in order (a task run twice appears twice)."""
        return [run.id for run in self.runs]

    @property
    def counts(self) -> Counter[str]:
        """Runs by outcome label: ``result.counts["success"]``, ``["failure"]``..."""
        return Counter(run.outcome for run in self.runs)

    @property
    def states(self) -> Counter[str]:
        """Runs by the state their settlement wrote: ``result.states["failed"]``..."""
        return Counter(run.state for run in self.runs)

    def tasks(self) -> list[Task]:
        """The rows of the tasks run, as they are now, by id."""
        from django_pgqueue.models import Task

        rows = Task.objects.using(self.database).filter(id__in=set(self.ids))
        return list(rows.order_by("id"))


def run_tasks(
    *,
    queues: str | Iterable[str] | None = None,
    max_tasks: int | None = None,
    scheduled: bool = False,
    raise_errors: bool = False,
    database: str | None = None,
) -> RunResult:
    """Run due tasks one at a time in this thread, on this thread's connection, until
    none is due (or ``max_tasks`` have run).

    ``queues``: the queues to run (default: every queue). ``scheduled=True`` also runs
    tasks due later, retries waiting out their backoff included (their run_at is set to
    now). ``raise_errors=True`` re-raises a handler's exception in the test once its
    failure is written (the row is settled first: retried or dead-lettered as by a
    worker); explicit ``Retry``, ``Snooze``, ``Suspend``, ``Continue`` and cancellation
    are outcomes, not errors. ``database``: the alias of the queues' table (default:
    theirs by PGQUEUE["DATABASES"], else DATABASE).
    """
    if max_tasks is not None and (
        isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 0
    ):
        raise TypeError(f"max_tasks must be an int >= 0 or None, not {max_tasks!r}")
    names = _queue_names(queues)
    alias = _database(names, database)
    connection = connections[alias]
    routes = [(d.name, d.version) for d in registry.all()]
    limit = RUN_LIMIT if max_tasks is None else max_tasks
    result = RunResult(database=alias)
    while len(result) < limit:
        task = _claim_one(connection, names, routes, scheduled)
        if task is None:
            return result
        run = _run(connection, alias, task)
        result.runs.append(run)
        if raise_errors:
            _raise_error(run)
    if max_tasks is None:
        raise RuntimeError(
            f"run_tasks ran {RUN_LIMIT} tasks and did not run out of due tasks: does a "
            "task requeue itself forever (Snooze, Continue, or Retry with "
            f"scheduled=True)? Last run: {result.runs[-1]}. Pass max_tasks=N to run at "
            "most N tasks"
        )
    return result


def drain(
    *,
    queues: str | Iterable[str] | None = None,
    max_tasks: int | None = None,
    raise_errors: bool = False,
    database: str | None = None,
) -> RunResult:
    """``run_tasks(scheduled=True)``: run until nothing is left to run, tasks due later
    and retries included, so every task ends (succeeded, failed, cancelled) unless it
    waits for a signal."""
    return run_tasks(
        queues=queues,
        max_tasks=max_tasks,
        scheduled=True,
        raise_errors=raise_errors,
        database=database,
    )


def _queue_names(queues: str | Iterable[str] | None) -> list[str] | None:
    if queues is None:
        return None
    names = [queues] if isinstance(queues, str) else list(queues)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"queues must be queue names (strings), not {queues!r}")
    return names


def _database(queues: list[str] | None, database: str | None) -> str:
    if database is not None:
        return database
    if not queues:
        return get_setting("DATABASE")
    aliases = {database_for(queue) for queue in queues}
    if len(aliases) > 1:
        raise ValueError(
            f"queues {', '.join(queues)} are on several databases ({', '.join(sorted(aliases))}, "
            "by PGQUEUE['DATABASES']): call run_tasks once per database"
        )
    return aliases.pop()


_SEQUENCES_NOW = "SET CONSTRAINTS pgqueue_sequence_join, pgqueue_sequence_rejoin IMMEDIATE"


def _claim_one(
    connection: BaseDatabaseWrapper,
    queues: list[str] | None,
    routes: list[tuple[str, int]],
    scheduled: bool,
) -> ClaimedTask | None:
    """Stage what is due, then claim one task, as a worker's claimer does."""
    conf = get_settings()
    with connection.cursor() as cursor:
        if queues is None:
            cursor.execute(_LIVE_QUEUES)
            names = [row[0] for row in cursor.fetchall()]
        else:
            names = queues
        if not names or not routes:
            return None
        if connection.in_atomic_block:
            # Inside the test's transaction (a TestCase), the tasks of a sequence wait
            # for their turn from a trigger deferred to the commit (docs/tenants.md),
            # which never comes: it runs now, and at each enqueue from now on.
            cursor.execute(_SEQUENCES_NOW)
        cursor.execute(_MAKE_DUE, {"queues": names, "everything": scheduled})
        while True:
            cursor.execute(QUERIES["stage"], stage_params(names, STAGE_BATCH))
            if sum(row[1] for row in cursor.fetchall()) < STAGE_BATCH:
                break
        params = {
            **route_params(names, routes, conf.STARVATION_TIMEOUT),
            "look_for_starving": False,  # priority order only: a test wants it predictable
            "limit": 1,
            "lease_seconds": conf.LEASE_SECONDS,
            "worker_id": f"pgqueue.testing-{os.getpid()}",
        }
        # The worker's claim reads jsonb as Python values into ClaimedTask; Django's
        # adapters read it as text: this cursor (only) loads it as the worker does.
        raw = cursor.cursor
        raw.adapters.register_loader("jsonb", JsonbLoader)
        raw.row_factory = claimed_rows
        while True:
            # The claim ends an expired row (cancelled, Expired) instead of leasing it,
            # as in a worker: claim again, with a new token, until one can run.
            cursor.execute(QUERIES["claim"], {**params, "token": str(uuid.uuid4())})
            claimed = cursor.fetchall()
            if not claimed:
                return None
            if not claimed[0].expired:
                return claimed[0]


def _run(connection: BaseDatabaseWrapper, alias: str, task: ClaimedTask) -> TaskRun:
    """Run the claimed task's handler and write its outcome."""
    savepoint = connection.savepoint() if connection.in_atomic_block else None
    hooks_before = len(connection.run_on_commit)
    task.mark_started()
    if _is_async(task):
        # async_to_sync runs the handler's loop in another thread, and sends the
        # handler's sync_to_async calls (the ORM's a* methods too) back to this thread:
        # they use this connection, inside the test's transaction.
        outcome = async_to_sync(execute_async)(task, alias, recycle_connections=False)
    elif _is_batch(task):  # a batch handler: a batch of this one call
        (outcome,) = execute_batch([task], alias, recycle_connections=False)
    else:
        outcome = execute(task, alias, None, recycle_connections=False, renewed_lease=False)
    hooks = []
    if savepoint is not None:
        if _aborted(connection):
            transaction.savepoint_rollback(savepoint, using=alias)
            connection.needs_rollback = False
        else:
            transaction.savepoint_commit(savepoint, using=alias)
        # A worker's handler runs in autocommit: its on_commit callbacks run at once
        # (or when its own atomic block commits). Here they would wait for the test's
        # transaction, which never commits: run them now.
        hooks = connection.run_on_commit[hooks_before:]
        del connection.run_on_commit[hooks_before:]
    outcome, state = _settle(connection, alias, outcome)
    for _savepoints, callback, robust in hooks:
        if robust:
            try:
                callback()
            except Exception:
                logger.exception("on_commit callback %r of task %s raised", callback, task.id)
        else:
            callback()
    error = outcome.error
    result = outcome.result
    if task.encrypted:  # the settled result was encrypted: the test reads it in clear
        result = encryption.open_value(result, f"task {task.id}'s result")
    return TaskRun(
        id=task.id,
        task_name=task.task_name,
        queue=task.queue,
        attempt=task.attempt,
        args=task.args,
        kwargs=task.kwargs,
        outcome=outcome.label,
        state=state,
        result=result,
        error={k: v for k, v in error.items() if k != "traceback"} if error else None,
        exception=outcome.exc,
    )


def _is_batch(task: ClaimedTask) -> bool:
    try:
        return registry.get(task.task_name, task.handler_version).batch_size is not None
    except TaskNotRegistered:
        return False  # execute reports it


def _is_async(task: ClaimedTask) -> bool:
    try:
        return registry.get(task.task_name, task.handler_version).is_async
    except TaskNotRegistered:
        return False  # execute() reports it as the outcome


def _aborted(connection: BaseDatabaseWrapper) -> bool:
    """Did the handler leave the transaction unusable?"""
    status = connection.connection.info.transaction_status
    return connection.needs_rollback or status == psycopg.pq.TransactionStatus.INERROR


def _settle(
    connection: BaseDatabaseWrapper, alias: str, outcome: Outcome
) -> tuple[Outcome, str]:
    """Write the outcome with the worker's ``settle`` statement, fenced on the lease
    (an atomic task's handler wrote it already, in its transaction)."""
    if outcome.written is not None:
        _announce(outcome, outcome.written, alias)
        return outcome, outcome.written
    outcome = _storable(outcome)
    params = {"outcomes": f"[{_row_json(outcome)}]", "limit_queues": [], "limit_concurrency": []}
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["settle"], params)
        rows = cursor.fetchall()
    task = outcome.task
    if not rows:
        raise RuntimeError(
            f"{task.log_prefix()}: its {outcome.label} outcome was not written: the row no "
            "longer holds the lease run_tasks took (a worker or the lease sweep took it "
            "over, or the test changed the row while its handler ran)"
        )
    state = rows[0][3]
    _announce(outcome, state, alias)
    return outcome, state


def _announce(outcome: Outcome, state: str, alias: str) -> None:
    """``task_settled``, with the arguments a worker's settler sends."""
    task = outcome.task
    if not task_settled.receivers:
        return
    try:
        definition = registry.get(task.task_name, task.handler_version)
    except TaskNotRegistered:
        return
    runtime = outcome.runtime
    if runtime is None:
        runtime = time.monotonic() - task.received_monotonic
    task_settled.send_robust(
        definition,
        task_id=task.id,
        attempt=task.attempt,
        outcome=outcome.label,
        state=state,
        written=True,
        queue=task.queue,
        database=alias,
        runtime=runtime,
        queue_wait=max(0.0, (task.claimed_at - task.run_at).total_seconds()),
    )


def _raise_error(run: TaskRun) -> None:
    """raise_errors=True: a failed attempt fails the test, with the handler's traceback."""
    if run.outcome not in (FAILURE, TIMEOUT) or isinstance(run.exception, Retry):
        return
    if run.exception is not None:
        raise run.exception
    error = run.error or {}
    raise TaskFailed(
        f"task {run.id} ({run.task_name}) attempt {run.attempt} failed "
        f"({run.state}): {error.get('type')}: {error.get('message')}"
    )
