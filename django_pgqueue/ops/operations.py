"""Operations on tasks outside the worker: read (a task, its logs), cancel, retry and
requeue, delete, retention on demand, re-encryption, and the queue overview.

Every write goes to the task's database: ``DATABASE``, or the alias passed as
``database=`` (task ids are per database: the same id can name a task on each), or,
for what is about a queue (pause, resume), the queue's own alias (PGQUEUE['DATABASES'],
docs/databases.md). The overview's reads (``queue_overview``,
``queue_capacity``, ``queue_history``, ``pauses``, ``replica_lag``) go to the read
database, ``READ_DATABASE`` when it is set (a replica), unless told ``using=``: a
caller that must see what it just wrote reads ``using=DATABASE``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

import psycopg
from django.db import IntegrityError, connections, transaction

from django_pgqueue.core.conf import database_for, get_settings, queue_databases, read_database
from django_pgqueue.core.exceptions import (
    EncryptionError,
    InvalidTaskError,
    PayloadTooLarge,
    TaskDoesNotExist,
)
from django_pgqueue.core.fairness import validate_pattern, validate_weight
from django_pgqueue.core.options import validate_queue, validate_task_name
from django_pgqueue.core.payload import (
    SIGNAL_LIMIT,
    check_json,
    check_size,
    check_text,
    dumps,
    short_repr,
)
from django_pgqueue.db import encryption
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.ops import retention
from django_pgqueue.ops.archive import Archive

if TYPE_CHECKING:
    from django_pgqueue.models import Task


def _alias(database: str | None) -> str:
    """Where a write goes: ``database``, or DATABASE."""
    return database or get_settings().DATABASE


def get_task(task_id: int, database: str | None = None) -> Task:
    """The task row with this id (on ``database``, default DATABASE), or TaskDoesNotExist."""
    from django_pgqueue.models import Task

    try:
        return Task.objects.using(_alias(database)).get(pk=task_id)
    except (Task.DoesNotExist, ValueError, TypeError):
        raise TaskDoesNotExist(f"no task with id {task_id!r}") from None


@dataclass(frozen=True)
class AttemptLogs:
    """The log records one attempt of a task kept (TASK_LOGS, docs/logging.md).

    ``records``: oldest first, each a dict of ``time`` (a datetime, UTC), ``level``,
    ``logger``, ``message`` and, when the record carried an exception, ``exception``
    (its traceback); ``dropped``: how many older records of the attempt were left out
    (TASK_LOG_RECORDS, TASK_LOG_BYTES). ``lease_token`` names the execution, as the
    entries of the task's ``executions`` do; ``settled_at`` is when its settlement was
    written."""

    attempt: int
    lease_token: str
    settled_at: datetime
    records: list[dict[str, Any]]
    dropped: int


def task_logs(task_id: int, database: str | None = None) -> list[AttemptLogs]:
    """The log records of each attempt of the task that kept some (on ``database``,
    default DATABASE), oldest attempt first; an empty list for a task with none, or no
    such task. Records are logs: they may hold personal data (docs/security.md)."""
    from django_pgqueue.models import TaskLog

    rows = TaskLog.objects.using(_alias(database)).filter(task_id=task_id).order_by("id")
    return [
        AttemptLogs(
            attempt=row.attempt,
            lease_token=str(row.lease_token),
            settled_at=row.created_at,
            records=row.entries(),
            dropped=row.dropped,
        )
        for row in rows
    ]


def cancel(
    task_id: int, hard: bool = False, database: str | None = None
) -> Literal["cancelled", "cancel_requested"] | None:
    """Cancel a task. Returns ``"cancelled"`` (it was pending or waiting: done at once),
    ``"cancel_requested"`` (it is running: its handler sees ``context.cancel_requested``
    and its settlement records cancelled), or None (no such task, or already finished).

    ``hard=True`` also kills a running handler: a worker with ``EXECUTION = "process"``
    kills the handler's process when its heartbeat sees the request (within about
    ``HEARTBEAT_SECONDS``) and records the task cancelled, with an error saying it was
    killed. A thread cannot be killed: in thread mode a hard cancel acts as a soft one.
    ``database``: the alias of the task's queue, when it is not DATABASE.
    """
    with connections[_alias(database)].cursor() as cursor:
        cursor.execute(QUERIES["cancel_task"], {"id": task_id, "hard": hard})
        row = cursor.fetchone()
    if row is None:
        return None
    return "cancel_requested" if row[1] == "running" else "cancelled"


def signal(
    task_id: int, name: str, payload: Any = None, database: str | None = None
) -> Literal["resumed", "stored"] | None:
    """Send the signal ``name`` (with a JSON ``payload``) to a task (docs/workflows.md).

    Returns ``"resumed"`` (the task was waiting for this signal: it is pending now, and
    its next attempt finds the payload in ``context.signals[name]`` and
    ``context.wake``), ``"stored"`` (it is not waiting for it yet: the signal is kept,
    and a later ``Suspend(name)`` resumes at once), or None (no such task, or it has
    finished). ``database``: the alias of the task's queue, when it is not DATABASE.
    A task keeps each name's last payload until it ends: a payload larger than
    ``MAX_SIGNAL_BYTES``, or a signal that would make the task's signals more than
    ``MAX_TASK_SIGNALS_BYTES`` or ``MAX_TASK_SIGNALS`` names, raises PayloadTooLarge:
    nothing is sent. An encrypted task takes the payload encrypted; where this process
    cannot encrypt (no ENCRYPTION_KEYS), such a task raises EncryptionError: nothing is
    sent."""
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise InvalidTaskError(f"a task id is an int, not {short_repr(task_id)}")
    if not isinstance(name, str) or not 1 <= len(name) <= 255:
        raise InvalidTaskError(
            f"a signal name is a string of 1-255 characters, not {short_repr(name)}"
        )
    check_text(name, "the signal name")
    body = dumps(check_json(payload, "signal payload"))
    check_size(SIGNAL_LIMIT, body)
    conf = get_settings()
    bounds = {"max_names": conf.MAX_TASK_SIGNALS, "max_bytes": conf.MAX_TASK_SIGNALS_BYTES}
    with connections[_alias(database)].cursor() as cursor:
        cursor.execute(QUERIES["task_encrypted"], {"id": task_id})
        found = cursor.fetchone()
        encrypted = bool(found and found[0])
        for _ in range(2):  # a second time if the row was replaced by another kind
            sent = _signal_payload(task_id, name, body, encrypted)
            params = {"id": task_id, "name": name, "payload": sent, "sealed": encrypted}
            cursor.execute(QUERIES["signal_task"], {**params, **bounds})
            row = cursor.fetchone()
            if row is None or row[-1] == encrypted:
                break
            encrypted = row[-1]
        else:
            raise InvalidTaskError(
                f"signal {short_repr(name)} to task {task_id}: the task was replaced twice "
                "while the signal was sent; nothing was sent, send it again"
            )
    if row is None:
        return None
    _, _, resumed, _, fits, names, size, _ = row
    if not fits:
        raise PayloadTooLarge(_signals_too_large(task_id, name, names, size, **bounds))
    return "resumed" if resumed else "stored"


def _signal_payload(task_id: int, name: str, body: str, encrypted: bool) -> str:
    """The payload's JSON as the task's row takes it: sealed for an encrypted task
    (EncryptionError, nothing sent, where this process cannot encrypt)."""
    if not encrypted:
        return body
    try:
        return encryption.seal_text(body)
    except EncryptionError as exc:
        raise EncryptionError(
            f"signal {short_repr(name)} to task {task_id}: the task is encrypted, and its "
            f"payload cannot be encrypted here: {exc}; nothing was sent"
        ) from None


def _signals_too_large(
    task_id: int,
    name: str,
    names: int,
    size: int | None,
    max_names: int | None,
    max_bytes: int | None,
) -> str:
    """Why signal() refused a signal that the task's signals cannot take."""
    keeps = (
        "a task keeps every signal sent to it (the last payload of each name) until it "
        "ends; nothing was sent"
    )
    if max_names is not None and names > max_names:
        return (
            f"signal {short_repr(name)} to task {task_id}: the task would keep {names:,} "
            f"signal names, more than the limit of {max_names:,} "
            f"(PGQUEUE['MAX_TASK_SIGNALS']): send under a name it has, or raise the limit; "
            f"{keeps}"
        )
    return (
        f"signal {short_repr(name)} to task {task_id}: the task's signals would take "
        f"{size:,} bytes as JSON, more than the limit of {max_bytes:,} bytes "
        "(PGQUEUE['MAX_TASK_SIGNALS_BYTES']): send a reference to large data instead, or "
        f"raise the limit; {keeps}"
    )


def pause(queue: str, task_name: str | None = None) -> None:
    """Pause a queue, or one task name within it: no worker claims from it (running
    tasks finish) until ``resume``. Persisted in the database, honoured by the next
    claim of every worker. Pausing a queue nobody serves yet is allowed. Written on
    the queue's database."""
    validate_queue(queue)
    if task_name is not None:
        validate_task_name(task_name)
    with connections[database_for(queue)].cursor() as cursor:
        cursor.execute(QUERIES["pause_queue"], {"queue": queue, "task_name": task_name})


def resume(queue: str, task_name: str | None = None) -> bool:
    """Resume a paused queue (its own pause: task names paused in it stay paused), or
    one task name. Wakes the queue's idle workers. False if the queue has no row
    (it was never paused nor served)."""
    validate_queue(queue)
    if task_name is not None:
        validate_task_name(task_name)
    with connections[database_for(queue)].cursor() as cursor:
        cursor.execute(QUERIES["resume_queue"], {"queue": queue, "task_name": task_name})
        return cursor.fetchone() is not None


def set_fair_weight(key: str, weight: float, database: str | None = None) -> None:
    """Give a fair-share key (or every key starting with a prefix: ``"customer:vip-*"``)
    a weight at runtime (docs/tenants.md): it wins over PGQUEUE["FAIR_WEIGHTS"] for the
    tasks of matching keys that become due from then on. Written on ``database``, or on
    every database that holds queues."""
    key, weight = _fair_weight_args(key, weight)
    for alias in _weight_databases(database):
        with connections[alias].cursor() as cursor:
            cursor.execute(QUERIES["set_fair_weight"], {"key": key, "weight": weight})


def clear_fair_weight(key: str, database: str | None = None) -> bool:
    """Remove the runtime weight of a key or prefix (the keys fall back on
    FAIR_WEIGHTS). False if there was none."""
    key, _ = _fair_weight_args(key, 1)
    cleared = False
    for alias in _weight_databases(database):
        with connections[alias].cursor() as cursor:
            cursor.execute(QUERIES["clear_fair_weight"], {"key": key})
            cleared = cursor.fetchone() is not None or cleared
    return cleared


def runtime_fair_weights(using: str | None = None) -> dict[str, float]:
    """The weights set at runtime: ``{key or 'prefix*': weight}`` (on ``using``, default
    DATABASE)."""
    return {row[0]: row[1] for row in _fetchall("fair_weights", {}, _alias(using))}


def fair_shares(
    queue: str | None = None,
    search: str | None = None,
    limit: int = 20,
    seconds: float = 60.0,
    using: str | None = None,
) -> list[dict[str, Any]]:
    """Who is getting what (docs/tenants.md): per fair key of ``queue`` (None: every
    queue), ``{"queue", "key", "pending", "running", "started"}``, ``started`` being the
    tasks started within the last ``seconds`` (sampled on a busy queue, see
    queues.sql: fair_shares), for the ``limit`` keys that started the most; ``search``
    keeps the keys that contain it. Read from the read database unless ``using``."""
    if queue is not None:
        validate_queue(queue)
    params = {"queue": queue, "search": search or None, "limit": limit, "seconds": seconds,
              "sample": FAIR_SHARES_SAMPLE}  # fmt: skip
    return _dicts("fair_shares", params, using)


def release_sequence(queue: str, key: str, database: str | None = None) -> int | None:
    """Release a sequence held by a failed task (docs/tenants.md): its next waiting task
    starts, in this call's transaction; the failed task stays a dead letter. Returns
    the id of the task that starts (None: none waits, or the sequence was not held).
    Written on the queue's database (or ``database``)."""
    validate_queue(queue)
    check_text(key, "sequence key")
    alias = database or database_for(queue)
    params = {"queue": queue, "key": key}
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(QUERIES["release_sequence"], params)
        if cursor.fetchone()[0] is None:
            return None
        cursor.execute(QUERIES["start_sequence"], params)
        return cursor.fetchone()[0]


def held_sequences(
    queue: str | None = None, search: str | None = None, limit: int = 20,
    using: str | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """The sequences a failed task holds (docs/tenants.md): ``{"queue", "key",
    "task_id", "task_name", "finished_at", "waiting"}``, the most recently held first;
    ``search`` keeps the keys that contain it. Read from the read database unless
    ``using``."""
    if queue is not None:
        validate_queue(queue)
    params = {"queue": queue, "search": search or None, "limit": limit}
    return _dicts("held_sequences", params, using)


# Ended tasks per state fair_shares reads at most to count the recent starts.
FAIR_SHARES_SAMPLE = 10_000


def _fair_weight_args(key: Any, weight: Any) -> tuple[str, float]:
    try:
        return validate_pattern(key), validate_weight(weight)
    except ValueError as exc:
        raise InvalidTaskError(str(exc)) from None


def _weight_databases(database: str | None) -> list[str]:
    return [database] if database else queue_databases()


def pauses(using: str | None = None) -> dict[str, dict[str, Any]]:
    """Per queue with a row: ``{"paused": bool, "paused_tasks": [names], "paused_at":
    datetime | None, "rate_tat_in": float | None}`` (rate_tat_in: seconds from the
    database's now() to the rate limit's theoretical arrival time; see queue_pauses).
    Read from the read database unless ``using`` names another alias."""
    return {
        row.pop("queue"): {**row, "paused_tasks": json.loads(row["paused_tasks"])}
        for row in _dicts("queue_pauses", {}, using)
    }


def own_pauses(alias: str, using: str | None = None) -> dict[str, dict[str, Any]]:
    """``pauses`` of the queues whose tasks are on ``alias`` (PGQUEUE['DATABASES']), read
    on ``using`` (default: the alias's read database). A row a queue left on another
    database before it moved is not its pause: no claim of its workers reads it."""
    found = pauses(using=using or read_database(alias))
    return {queue: pause for queue, pause in found.items() if database_for(queue) == alias}


class QueueOverviewRow(TypedDict):
    """One row of ``queue_overview()``: the columns of the statement queue_overview
    (tests/test_typing.py keeps the two in step)."""

    queue: str
    task_name: str
    handler_version: int
    pending_routable: int
    pending_unroutable: int
    scheduled: int
    running: int
    waiting: int
    waiting_parents: int
    waiting_signal: int
    waiting_child: int
    waiting_sequence: int
    failed: int
    oldest_due_seconds: float | None
    oldest_running_seconds: float | None
    completed_5m: int
    completed_1h: int
    failed_5m: int
    failed_1h: int


def queue_overview(using: str | None = None) -> list[QueueOverviewRow]:
    """Per (queue, task_name): pending routable / unroutable, scheduled, running,
    waiting (and by what for: waiting_parents, waiting_signal, waiting_child, waiting_sequence; see
    overview.WAIT_REASONS), failed (dead letters), the age in seconds of the oldest due task
    (``oldest_due_seconds``) and of the oldest running attempt, since its claim
    (``oldest_running_seconds``: a hung handler shows there; each None when there is no
    such task), and completed_5m / completed_1h / failed_5m / failed_1h (finished in the
    last 5 minutes / hour). Read from the read database unless ``using`` names
    another alias."""
    rows = _dicts("queue_overview", {"stale_seconds": get_settings().WORKER_STALE_AFTER}, using)
    return cast(list[QueueOverviewRow], rows)


def _fetchall(query: str, params: dict[str, Any], database: str | None = None) -> list[tuple]:
    """A statement on ``database`` (default DATABASE): every write, and the reads of
    what a write will change."""
    with connections[_alias(database)].cursor() as cursor:
        cursor.execute(QUERIES[query], params)
        return cursor.fetchall()


def _dicts(query: str, params: dict[str, Any], using: str | None) -> list[dict[str, Any]]:
    """The rows of a read, by column name, from ``using`` or else the read database."""
    with connections[using or read_database()].cursor() as cursor:
        cursor.execute(QUERIES[query], params)
        columns = [c[0] for c in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def queue_history(minutes: int = 60, using: str | None = None) -> list[dict[str, Any]]:
    """Per minute of the last ``minutes``: tasks completed, tasks dead-lettered, and the
    queue depth (due, not yet started) at the end of the minute, oldest minute first.
    Read from the read database unless ``using`` names another alias."""
    return _dicts("queue_history", {"minutes": minutes}, using)


def queue_capacity(using: str | None = None) -> list[dict[str, Any]]:
    """Per queue: live workers serving it, their slots and their tasks in flight. Read
    from the read database unless ``using`` names another alias."""
    return _dicts("queue_capacity", {"stale_seconds": get_settings().WORKER_STALE_AFTER}, using)


@dataclass(frozen=True)
class ReplicaLag:
    """How far behind its primary ``READ_DATABASE`` reads (the statement replica_lag)."""

    alias: str
    # The server is a standby, replaying its primary's WAL (pg_is_in_recovery()). False:
    # READ_DATABASE is a primary under another alias, and its reads are not behind.
    replica: bool
    # Seconds since the primary committed the last transaction the standby replayed,
    # by the standby's clock; None when not a replica, or when the standby has
    # replayed no transaction since it started.
    seconds: float | None


def replica_lag() -> ReplicaLag | None:
    """The lag of the read database, read on it; None when ``READ_DATABASE`` is not set
    (the reads go to DATABASE, and nothing is behind)."""
    alias = get_settings().READ_DATABASE
    if alias is None:
        return None
    [row] = _dicts("replica_lag", {}, alias)
    return ReplicaLag(alias, row["in_recovery"], row["lag_seconds"])


_BIGINT_MAX = 2**63 - 1  # the id column


def _ids(task_ids: Iterable[int]) -> list[int]:
    """The ids as ints, without those no row can have (past the bigint column): a
    forged id matches no task, as an unknown one does."""
    return [i for i in map(int, task_ids) if -_BIGINT_MAX <= i <= _BIGINT_MAX]


class Revived(list[int]):
    """The ids a retry or requeue revived (in a dry run: would revive), in order; a list.

    ``skipped``: the dead letters asked for that it left dead for their unique key,
    each with why: a live task holds the key (two live tasks may not share one), or a
    newer dead letter of the same key was revived instead (at most one per key is).
    """

    def __init__(self, ids: Iterable[int] = (), skipped: dict[int, str] | None = None) -> None:
        super().__init__(ids)  # built like a list too, as list(ids): Django's lookups do
        self.skipped = {} if skipped is None else skipped


def retry_now(task_ids: Iterable[int], database: str | None = None) -> Revived:
    """Make these tasks due now: pending ones at once, dead letters with one more
    attempt; a cancel asked before is cleared. Running and finished tasks are left
    alone. Returns the ids retried, and in ``.skipped`` the dead letters left dead for
    their unique key (``Revived``)."""
    ids = _ids(task_ids)
    return _revive("retry_now", {"ids": ids}, database, lambda alias: ids)


def requeue_dead(
    task_ids: Iterable[int] | None = None,
    *,
    task_name: str | None = None,
    queue: str | None = None,
    since: datetime | None = None,
    dry_run: bool = False,
    database: str | None = None,
) -> Revived:
    """Put dead letters (failed tasks) back to pending with a fresh attempt budget.

    Filters combine (None matches all); ``since`` keeps tasks that died at or after it.
    Of the dead letters that share a unique_key, only the newest is requeued, and none
    while a live task holds the key: the others are returned in ``.skipped`` with why
    (``Revived``). With ``dry_run``, nothing changes and the ids that would be requeued
    are returned (and those that would be skipped). On ``database``, else on
    ``queue``'s database, else on DATABASE.
    """
    for value, what in ((task_name, "task_name"), (queue, "queue")):
        if value is not None:
            check_text(value, what)
    params = {
        "ids": None if task_ids is None else _ids(task_ids),
        "task_name": task_name,
        "queue": queue,
        "since": since,
    }
    if database is None and queue is not None:
        database = database_for(queue)
    if dry_run:
        return _revived(_fetchall("find_dead", params, database))
    return _revive(
        "requeue_dead",
        params,
        database,
        lambda alias: [row[0] for row in _fetchall("find_dead", params, alias)],
    )


def _revive(
    query: str,
    params: dict[str, Any],
    database: str | None,
    candidates: Callable[[str], list[int]],
) -> Revived:
    """Run a revive (retry_now, requeue_dead) in a savepoint. If a task made live by
    another transaction after the statement began took the unique key of a row it was
    reviving (see retry_now in db/sql/operations.sql), the rows are revived one at a time
    instead, newest first, each in a savepoint: each statement sees the rows the ones
    before it revived, and the task that won the key."""
    alias = _alias(database)
    try:
        with transaction.atomic(using=alias):
            return _revived(_fetchall(query, params, alias))
    except IntegrityError as exc:
        if not _key_taken(exc):
            raise
    rows: list[tuple] = []
    for task_id in sorted(set(candidates(alias)), reverse=True):
        try:
            with transaction.atomic(using=alias):
                rows += _fetchall(query, {**params, "ids": [task_id]}, alias)
        except IntegrityError as exc:
            if not _key_taken(exc):
                raise
            rows.append((task_id, False, None, None, None))
    return _revived(sorted(rows))


def _key_taken(exc: IntegrityError) -> bool:
    """Whether ``exc`` is two live tasks sharing a unique key."""
    cause = exc.__cause__
    return (
        isinstance(cause, psycopg.errors.UniqueViolation)
        and cause.diag.constraint_name == "pgqueue_task_unique_live"
    )


def _revived(rows: list[tuple]) -> Revived:
    """The rows of retry_now, requeue_dead or find_dead (id, revived, unique_key,
    live_id, newer_id, ...) as a Revived."""
    skipped: dict[int, str] = {}
    for task_id, revived, key, live_id, newer_id, *_ in rows:
        if revived:
            continue
        if live_id is not None:
            skipped[task_id] = f"its unique key {short_repr(key)} belongs to live task {live_id}"
        elif newer_id is not None:
            skipped[task_id] = (
                f"task {newer_id}, a newer dead letter with the same unique key "
                f"{short_repr(key)}, is revived instead"
            )
        else:
            skipped[task_id] = "a task with the same unique key became live meanwhile"
    return Revived((row[0] for row in rows if row[1]), skipped)


def delete_finished(task_ids: Iterable[int], database: str | None = None) -> list[int]:
    """Delete these tasks if they are finished (succeeded, failed or cancelled).
    Pending, running and waiting tasks are never deleted. Returns the ids deleted."""
    rows = _fetchall("delete_finished", {"ids": _ids(task_ids)}, database)
    return sorted(row[0] for row in rows)


def prunable_counts(
    result_ttl: float | None = None, dead_ttl: float | None = None, database: str | None = None
) -> dict[str, int]:
    """How many rows retention would delete now, per state (defaults: the settings)."""
    conf = get_settings()
    params = {
        "result_ttl": conf.RESULT_TTL if result_ttl is None else result_ttl,
        "dead_ttl": conf.DEAD_TTL if dead_ttl is None else dead_ttl,
    }
    return dict(_fetchall("count_prunable", params, database))


def prune_expired(
    result_ttl: float | None = None,
    dead_ttl: float | None = None,
    batch: int | None = None,
    database: str | None = None,
    archive_dir: str | None = None,
) -> int:
    """Run retention now, batch by batch (what the worker's pruner does on its
    interval). Returns how many rows were deleted. With ``archive_dir`` (default:
    PRUNE_ARCHIVE_DIR), each batch is written to the archive there first (archive.py),
    and a batch whose write fails raises ArchiveError, deleting nothing of it."""
    conf = get_settings()
    alias = _alias(database)
    result_ttl = conf.RESULT_TTL if result_ttl is None else result_ttl
    dead_ttl = conf.DEAD_TTL if dead_ttl is None else dead_ttl
    batch = conf.PRUNE_BATCH if batch is None else batch
    archive_dir = archive_dir or conf.PRUNE_ARCHIVE_DIR
    if archive_dir is None:
        return retention.prune(
            lambda query, params: _fetchall(query, params, alias), result_ttl, dead_ttl, batch
        )

    def in_transaction(function: Callable[[retention.Cursor], Any]) -> Any:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            return function(cursor)

    return retention.prune_to_archive(
        in_transaction, Archive(archive_dir, alias), result_ttl, dead_ttl, batch
    )


def restore_archived(
    rows: Iterable[dict[str, Any]], database: str | None = None
) -> dict[int, Literal["restored", "present", "unique_key"]]:
    """Bring archived tasks (rows of an archive file, ``archive.find``) back, each under
    its own id, pending and due now with a fresh attempt budget (the statement
    restore_archived). Per id: "restored"; "present" (a row with this id is in the
    table: never pruned, or restored already; left alone); "unique_key" (a live task
    holds its unique_key; nothing written). On ``database``, else on each row's
    queue's database."""
    outcomes: dict[int, Literal["restored", "present", "unique_key"]] = {}
    for row in rows:
        alias = database or database_for(row["queue"])
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                cursor.execute(QUERIES["restore_archived"], {"row": json.dumps(row)})
                outcomes[row["id"]] = "restored" if cursor.fetchall() else "present"
        except IntegrityError as exc:
            if "pgqueue_task_unique_live" not in str(exc):
                raise
            outcomes[row["id"]] = "unique_key"
    return outcomes


@dataclass
class Reencrypted:
    """What ``reencrypt`` did: ``rewritten`` rows now encrypted with the newest key,
    ``current`` rows that already were, ``left`` the ids of rows it could not take this
    time (running, or held by another transaction: run it again later), ``failed`` the
    ids of rows that no key decrypts, with the reason (left as they are)."""

    rewritten: int = 0
    current: int = 0
    left: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


REENCRYPT_BATCH = 500


def reencrypt(batch: int = REENCRYPT_BATCH, database: str | None = None) -> Reencrypted:
    """Encrypt every encrypted task's payloads again with the newest key of
    ENCRYPTION_KEYS (its first), ``batch`` rows per transaction, walking the table by
    id (the statements encrypted_batch and reencrypt_rows). Running rows, and rows
    another transaction holds, are left for a later run (``left``): a worker may write
    to them meanwhile. Raises EncryptionError at once when nothing can be encrypted
    here (no key, no cryptography)."""
    problem = encryption.key_problem()
    if problem is not None:
        raise EncryptionError(problem)
    alias = _alias(database)
    done = Reencrypted()
    after = 0
    while True:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute(QUERIES["encrypted_batch"], {"after": after, "batch": batch})
            rows = cursor.fetchall()
            changes = [change for row in rows if (change := _reencrypted(row, done))]
            if changes:
                cursor.execute(QUERIES["reencrypt_rows"], {"rows": dumps(changes)})
                done.rewritten += len(cursor.fetchall())
        if len(rows) < batch:
            return done
        after = rows[-1][0]


def _reencrypted(row: tuple, done: Reencrypted) -> dict[str, Any] | None:
    """The changed columns of one row of encrypted_batch (with its id), or None;
    counts the row in ``done`` when it is left, failed or current."""
    task_id, locked, *values = row
    if not locked:
        done.left.append(task_id)
        return None
    changes = {}
    try:
        for column, value in zip(encryption.PAYLOAD_COLUMNS, values, strict=True):
            loaded = json.loads(value) if isinstance(value, str) else value
            new = encryption.rotated(column, loaded, f"task {task_id}'s {column}")
            if new is not None:
                changes[column] = new
    except EncryptionError as exc:
        done.failed[task_id] = str(exc)
        return None
    if not changes:
        done.current += 1
        return None
    return {"id": task_id, **changes}


def delete_stale_workers(database: str | None = None) -> list[str]:
    """Remove registry rows of workers that stopped heartbeating (WORKER_STALE_AFTER)."""
    stale = {"stale_seconds": get_settings().WORKER_STALE_AFTER}
    rows = _fetchall("delete_stale_workers", stale, database)
    return [row[0] for row in rows]
