"""The atomic attempt: a handler's writes and its outcome commit in one transaction.

With ``atomic=True`` (docs/guarantees.md, "Exactly-once effects in the task's
database") the handler runs inside ``transaction.atomic()`` on the task's database (the
alias of its queue), and the attempt's outcome is written by the last statement of
that same transaction, fenced on the lease (its token, and a lease not lapsed): a
success by ``settle_atomic``; a ``Continue`` or a ``Suspend`` by ``settle`` (the
settler's own statement), once ``hold_lease`` has locked the row. Then the transaction
commits. When the fence matches no row, the lease is lost (it lapsed, the sweep
recovered it, another worker runs the task): the transaction rolls back, and the
handler's writes vanish with it.

The outcomes that commit with the handler's writes are those that keep its work: a
success, ``Continue`` (the slice's work, with its checkpoint) and ``Suspend`` (what it
did before it waits, such as the task it waits for). Every other ending (an exception,
``Retry``, ``Snooze``, ``Cancelled``, a timeout, a result that cannot be stored) rolls
the transaction back first; the settler then writes the outcome, as for any task.

The task's row is not locked while the handler runs, only from that last statement to
the commit (docs/design.md, "Atomic tasks"). A checkpoint or progress the handler saves is
held on its context until then (context.py): written at once, it would lock the row for
the rest of the handler, and the heartbeat could not renew the lease.

A connection lost during the commit leaves it unknown whether it committed. The attempt
then goes to the settler as a failure: its fenced settle writes it if the row still
holds the lease (nothing committed), and recognises the committed settle by the
executions entry it wrote (``settle_check``: written) if it did.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DataError, connections, transaction

from django_pgqueue.core.conf import configured
from django_pgqueue.core.exceptions import AtomicWriteRefused
from django_pgqueue.core.limits import parse_limits
from django_pgqueue.core.payload import dumps
from django_pgqueue.core.retry import ATOMIC_KEY
from django_pgqueue.db.enqueue_cursor import enqueue_cursor
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.tasking.registry import TaskDefinition
from django_pgqueue.worker import outcomes, task_logs
from django_pgqueue.worker.claimed import ClaimedTask
from django_pgqueue.worker.logging import task_fields
from django_pgqueue.worker.outcomes import CONTINUED, SUCCESS, SUSPENDED, Outcome

logger = logging.getLogger("django_pgqueue.worker")

# The endings whose outcome commits with the handler's writes.
KEEPS_WRITES = frozenset({SUCCESS, CONTINUED, SUSPENDED})
SUCCEEDED = "succeeded"

# A statement that writes, by its first word: refused through another alias.
_WRITE = re.compile(r"\s*(INSERT|UPDATE|DELETE|MERGE|TRUNCATE|COPY)\b", re.IGNORECASE)


def chosen(definition: TaskDefinition, task: ClaimedTask) -> bool:
    """Does this attempt run atomically? The call's own ``using(atomic=...)``, frozen
    on its row, else the task's ``@task(atomic=...)`` as this worker runs it."""
    stored = task.retry_policy_json
    if stored and '"atomic"' in stored:  # only the rows whose call chose are parsed
        value = task.retry_policy.get(ATOMIC_KEY)
        if isinstance(value, bool):
            return value
    return definition.atomic


class _RollBack(Exception):
    """Leaves the attempt's transaction, rolling it back, with the outcome to settle."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.label)
        self.outcome = outcome


def run(
    task: ClaimedTask,
    database: str,
    attempt: Callable[[], Outcome],
    *,
    any_expiry: bool = False,
) -> Outcome:
    """Run ``attempt`` (the handler, mapped to its outcome; never raises) in a
    transaction on ``database``, and commit its outcome with it when that keeps its
    writes. Returns the outcome: written (``Outcome.written``) or for the settler.
    Never raises.

    ``any_expiry``: commit while the attempt holds its lease token, however late
    (django_pgqueue.testing, where nothing renews a lease); a worker also requires
    the lease not to have lapsed."""
    connection = connections[database]
    outermost = not connection.in_atomic_block
    committed: list[bool] = []
    context = task.context
    outcome: Outcome | None = None
    try:
        with transaction.atomic(using=database), _writes_only_through(database):
            if outermost:
                # The first of the block's commit callbacks: it tells a commit apart
                # from a failed one when a callback of the handler raises after it.
                transaction.on_commit(lambda: committed.append(True), using=database)
            if context is not None:
                context._held = {}
            outcome = attempt()
            if outcome.label not in KEEPS_WRITES:
                raise _RollBack(outcome)
            deadline = task.deadline_monotonic
            if deadline is not None and time.monotonic() >= deadline:
                raise _RollBack(outcomes.timed_out(task, (
                    f"the attempt exceeded its timeout of {task.timeout:g}s: its handler "
                    "returned past it, so its atomic transaction was rolled back"
                )))  # fmt: skip
            outcome.logs = task_logs.take(task)  # they commit with the outcome
            state = _commit(connection, outcome, any_expiry)
            if state is None:
                raise _RollBack(_fenced(task, outcome))
            outcome.written = state
    except _RollBack as rolled_back:
        return rolled_back.outcome
    except BaseException as exc:
        if outcome is not None and outcome.written is not None and committed:
            logger.error(
                "%s: an on_commit callback of its handler raised after its atomic "
                "transaction committed (the %s outcome is written)",
                task.log_prefix(),
                outcome.label,
                exc_info=exc,
                extra=task_fields(task, outcome=outcome.label, state=outcome.written),
            )
            return outcome
        return _in_doubt(task, exc)
    finally:
        if context is not None:
            context._held = None
    return outcome


def _commit(connection: Any, outcome: Outcome, any_expiry: bool) -> str | None:
    """In the attempt's transaction: write the outcome while the lease holds, with the
    checkpoint and progress the handler held back. The settled state, or None if the
    lease is lost. A success is one statement (settle_atomic); a Continue or a Suspend
    locks the row (hold_lease), then writes as the settler does (settle). The attempt's
    log records (TASK_LOGS) follow, in the same transaction (store_task_logs)."""
    task = outcome.task
    lease = {"id": task.id, "attempt": task.attempt, "token": task.lease_token,
             "any_expiry": any_expiry}  # fmt: skip
    held = task.context._held if task.context is not None else None
    limit = _concurrency_limit(task.queue)
    with enqueue_cursor(connection) as cursor:
        try:
            if outcome.label == SUCCESS:
                checkpoint = (held or {}).get("save_checkpoint")
                progress = (held or {}).get("save_progress")
                cursor.execute(QUERIES["settle_atomic"], {
                    **lease,
                    "result": None if outcome.result is None else dumps(outcome.result),
                    "save_checkpoint": checkpoint is not None,
                    "checkpoint": checkpoint and checkpoint["checkpoint"],
                    "save_progress": progress is not None,
                    "progress": progress and progress["progress"],
                    "limit_queue": limit and task.queue,
                    "limit_concurrency": limit,
                })  # fmt: skip
                if cursor.fetchone() is None:
                    return None
                task_logs.store(cursor.execute, [outcome])
                return SUCCEEDED
            cursor.execute(QUERIES["hold_lease"], lease)
            if cursor.fetchone() is None:
                return None
            if task.context is not None:
                task.context._write_held(cursor)
            cursor.execute(QUERIES["settle"], {
                "outcomes": dumps([outcome.as_row()]),
                "limit_queues": [task.queue] if limit else [],
                "limit_concurrency": [limit] if limit else [],
            })  # fmt: skip
            row = cursor.fetchone()
            if row is not None:
                task_logs.store(cursor.execute, [outcome])
        except DataError as exc:
            raise _RollBack(outcomes.unrunnable(
                task,
                "OutcomeNotStorable",
                f"the {outcome.label} outcome of this attempt could not be stored "
                f"(PostgreSQL: {str(exc).strip().splitlines()[0]}); its atomic "
                "transaction was rolled back, and the attempt recorded as a failure",
            )) from exc  # fmt: skip
    return None if row is None else row[3]


def _concurrency_limit(queue: str) -> int | None:
    """The concurrency limit of ``queue`` (QUEUE_LIMITS), if it has one: a settlement
    in a queue at its limit wakes the workers parked for room, as the settler's does."""
    limits = configured().get("QUEUE_LIMITS") or {}
    if queue not in limits:
        return None
    return parse_limits({queue: limits[queue]})[queue].concurrency


def _fenced(task: ClaimedTask, outcome: Outcome) -> Outcome:
    logger.warning(
        "%s: its lease was lost before its atomic transaction could commit (it expired, "
        "was recovered, or another worker holds the task); rolled back: none of the "
        "handler's writes were kept, and its %s outcome is not written",
        task.log_prefix(),
        outcome.label,
        extra=task_fields(task, outcome=outcomes.LOST),
    )
    return outcomes.fenced(task)


def _in_doubt(task: ClaimedTask, exc: BaseException) -> Outcome:
    """The transaction raised outside the handler (a lost connection, a refused
    statement, a failed commit): a failure for the settler, which recognises a commit
    that did happen (module docstring)."""
    logger.warning(
        "%s: its atomic transaction did not commit, or its commit's answer was lost "
        "(%s: %s); the settler writes a failure unless the commit happened",
        task.log_prefix(),
        type(exc).__name__,
        exc,
        extra=task_fields(task),
    )
    return outcomes.failed(task, outcomes.error_entry(task, exc))


@contextlib.contextmanager
def _writes_only_through(database: str) -> Iterator[None]:
    """Refuse a write through another alias while the attempt's transaction is open:
    it would commit on its own, whether or not the attempt does. Reads pass."""
    others = [alias for alias in connections.settings if alias != database]
    if not others:
        yield
        return

    def refuse_writes(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        if isinstance(sql, str) and _WRITE.match(sql):
            alias = context["connection"].alias
            raise AtomicWriteRefused(
                f"this atomic task's writes are committed with its success on its own "
                f"database, {database!r}, and this statement writes through {alias!r}, "
                f"where it would commit on its own, however the task ends: "
                f"{sql.lstrip()[:60]!r}... Write through {database!r}, or make the "
                "task non-atomic (docs/guarantees.md, \"Exactly-once effects in the "
                "task's database\"); the statement was not run"
            )
        return execute(sql, params, many, context)

    with contextlib.ExitStack() as stack:
        for alias in others:
            stack.enter_context(connections[alias].execute_wrapper(refuse_writes))
        yield
