"""Enqueue: validate, then INSERT in the caller's transaction (or on its commit).

Validation happens before any SQL runs, so bad input raises and writes nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.signals import setting_changed
from django.db import ProgrammingError, connections, transaction

from django_pgqueue.core.conf import database_for, migrate_command
from django_pgqueue.core.exceptions import InvalidTaskError, TransactionDatabaseError
from django_pgqueue.core.fairness import fair_weights
from django_pgqueue.core.options import (
    LIVE_STATES,
    TASK_STATES,
    Call,
    check_key,
    check_run_at,
    check_unique_key,
)
from django_pgqueue.core.payload import (
    ARGS_LIMIT,
    METADATA_LIMIT,
    check_json,
    check_size,
    dumps,
    fits,
)
from django_pgqueue.core.retry import ATOMIC_KEY
from django_pgqueue.db import encryption
from django_pgqueue.db.enqueue_cursor import enqueue_cursor
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.tasking import tracing
from django_pgqueue.tasking.middleware import before_enqueue

if TYPE_CHECKING:
    from django_pgqueue.core.retry import RetryPolicy
    from django_pgqueue.tasking.registry import TaskDefinition


def check_transaction(definition: TaskDefinition, queue: str, alias: str, how: str) -> None:
    """Refuse a write to ``alias`` while the caller's transaction is on another alias
    and none is open on ``alias``: the task would commit at once, on its own, and run
    even if that transaction rolled back (or run before its data is committed)."""
    # One database configured (the common case): no other transaction can be open.
    if len(connections.settings) == 1 or connections[alias].in_atomic_block:
        return
    for connection in connections.all(initialized_only=True):
        if connection.alias != alias and connection.in_atomic_block:
            other = connection.alias
            raise TransactionDatabaseError(
                f"task {definition.name!r} goes to queue {queue!r} on database {alias!r}, "
                f"but {how} runs inside a transaction on {other!r}: the task would commit "
                f"now, on its own, whether or not that transaction commits. Keep the "
                f"queue on {other!r} (PGQUEUE['DATABASES']), or enqueue when it commits: "
                f"{definition.name}.using(commit_alias={other!r}).enqueue_on_commit(...), "
                f"or open a transaction on {alias!r} around the enqueue "
                f"(transaction.atomic(using={alias!r})) if two separate commits are what "
                "you want; nothing was enqueued"
            )


_NO_DELAY = timedelta(0)


@functools.lru_cache(maxsize=256)
def _policy_json(
    policy: RetryPolicy,
    retry_on: tuple[str, ...] | None = None,
    discard_on: tuple[str, ...] = (),
    atomic: bool | None = None,
) -> str:
    """A retry policy's JSON, with the exception rules (by name) when the task has any,
    and the call's own ``atomic`` when it chose one (retry.ATOMIC_KEY): the same few
    policies are written on every enqueue."""
    stored: dict[str, Any] = policy.as_dict()
    if retry_on is not None:
        stored["retry_on"] = list(retry_on)
    if discard_on:
        stored["discard_on"] = list(discard_on)
    if atomic is not None:
        stored[ATOMIC_KEY] = atomic
    return dumps(stored)


def _interval(seconds: float | None) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=seconds)


# The row's parts computed from each call's arguments (and, for metadata, the trace
# context of the moment); every other key depends only on the task definition, its
# options and the settings, so build_row computes it once per definition (_constant).
# An option whose value is computed per call must be added here.
PER_CALL = frozenset({"args", "kwargs", "metadata", "concurrency_key", "fair_key", "fair_weight",
                      "sequence_key"})
_EMPTY_JSON = "{}"
_settings_generation = 0


def _settings_changed(**kwargs: Any) -> None:
    """override_settings (tests): the rows cached under the old settings are stale."""
    global _settings_generation
    _settings_generation += 1


setting_changed.connect(_settings_changed, dispatch_uid="django_pgqueue.enqueue.rows")


def build_row(
    definition: TaskDefinition, args: Any, kwargs: Any, *, key_per_call: bool = True
) -> dict[str, Any]:
    """The INSERT parameters for one call, or InvalidTaskError. ``key_per_call=False``
    leaves the task's concurrency_key function out (enqueue_many applies it per call).

    The options' part of the row is validated and built on a definition's first call
    and kept on it (a ``using()`` copy is another definition), with whether the task
    encrypts; later calls check and encode only their arguments and metadata (and
    encrypt the arguments, for an encrypted task: encryption.py). A first call that
    raises keeps nothing, so every call with a bad option raises the same error."""
    cached = definition.__dict__.get("_pgqueue_row")
    if cached is None or cached[0] != _settings_generation:
        row = _build_row(definition, args, kwargs, key_per_call=key_per_call)
        encrypt = encryption.chosen(definition.encrypt)
        if encrypt:  # measured in clear (MAX_ARGS_BYTES), stored sealed
            row["args"] = encryption.seal_text(row["args"])
            if kwargs:  # no kwargs stay {}: nothing to hide, and a Fernet call saved
                row["kwargs"] = encryption.seal_text(row["kwargs"])
        # Stored only once the whole row validated: a cached definition's options are
        # valid, so the per-call checks below raise what _build_row would have raised.
        constant = {k: v for k, v in row.items() if k not in PER_CALL}
        constant["after"] = tuple(row["after"])
        if definition.concurrency_key is None or definition.options.concurrency_key is not None:
            constant["concurrency_key"] = row["concurrency_key"]
        if definition.fair_key is None:
            constant["fair_key"] = constant["fair_weight"] = None
        if definition.sequence_key is None:
            constant["sequence_key"] = None
        else:  # a call's state depends on its sequence key: kept as if it had none
            constant["state"] = _state(definition.options)
        object.__setattr__(
            definition, "_pgqueue_row", (_settings_generation, constant, encrypt)
        )
        return row
    if not isinstance(kwargs, dict):
        raise InvalidTaskError(f"kwargs must be a dict, not {type(kwargs).__name__}")
    args_json = dumps(check_json(list(args), "args"))
    kwargs_json = dumps(check_json(kwargs, "kwargs")) if kwargs else _EMPTY_JSON
    check_size(ARGS_LIMIT, args_json, kwargs_json)
    row = cached[1].copy()
    if cached[2]:
        args_json = encryption.seal_text(args_json)
        if kwargs:
            kwargs_json = encryption.seal_text(kwargs_json)
    row["args"] = args_json
    row["kwargs"] = kwargs_json
    trace = tracing.trace_context()
    metadata = definition.options.metadata
    if trace or metadata:  # a dict the caller may have changed since: checked again
        metadata_json = dumps(check_json({**trace, **metadata}, "metadata"))
        check_size(METADATA_LIMIT, metadata_json)
        row["metadata"] = metadata_json
    else:
        row["metadata"] = _EMPTY_JSON
    if "concurrency_key" not in row:
        key = _key_of(definition, args, kwargs) if key_per_call else None
        row["concurrency_key"] = check_key(key, "concurrency_key")
    if "fair_key" not in row:
        row["fair_key"], row["fair_weight"] = _fair_key(definition, args, kwargs, key_per_call)
    if "sequence_key" not in row:
        row["sequence_key"] = _sequence_key(definition, args, kwargs, key_per_call)
        if row["sequence_key"] is not None:
            row["state"] = "waiting"  # its turn in its sequence (enqueue_keyed)
    row["after"] = list(row["after"])  # a list of its own per row
    return row


def _build_row(
    definition: TaskDefinition, args: Any, kwargs: Any, *, key_per_call: bool = True
) -> dict[str, Any]:
    """build_row without the cache: every check, in order."""
    opts = definition.options
    if not isinstance(kwargs, dict):
        raise InvalidTaskError(f"kwargs must be a dict, not {type(kwargs).__name__}")
    args_json = dumps(check_json(list(args), "args"))
    kwargs_json = dumps(check_json(kwargs, "kwargs"))
    check_size(ARGS_LIMIT, args_json, kwargs_json)
    run_at = check_run_at(opts.run_at)
    unique_key = check_unique_key(opts.unique_key)
    unique = None if unique_key is None else _unique_policy(definition)
    if unique_key is None and (
        opts.unique_for is not None or opts.unique_states is not None or opts.on_conflict
    ):
        _no_key(opts)
    metadata_json = dumps(check_json({**tracing.trace_context(), **opts.metadata}, "metadata"))
    check_size(METADATA_LIMIT, metadata_json)
    backoff = opts.backoff or definition.backoff
    retry_on = definition.retry_on if opts.retry_on is None else opts.retry_on
    expires = definition.expires if opts.expires is None else opts.expires
    discard_on = definition.discard_on if opts.discard_on is None else opts.discard_on
    concurrency_key = opts.concurrency_key
    if concurrency_key is None and definition.concurrency_key is not None and key_per_call:
        concurrency_key = _key_of(definition, args, kwargs)
    fair_key, fair_weight = _fair_key(definition, args, kwargs, key_per_call)
    sequence_key = _sequence_key(definition, args, kwargs, key_per_call)
    return {
        "id": None,
        "queue": opts.queue or definition.queue,
        "task_name": definition.name,
        "handler_version": definition.version,
        "priority": definition.priority if opts.priority is None else opts.priority,
        "args": args_json,
        "kwargs": kwargs_json,
        "run_at": run_at,
        "delay": _interval(opts.delay) or _NO_DELAY,
        # A sequenced call waits for its turn (its start makes it pending or scheduled).
        "state": "waiting" if sequence_key is not None else _state(opts),
        "max_attempts": opts.max_attempts or definition.max_attempts,
        "retry_policy": _policy_json(backoff, retry_on, discard_on, opts.atomic),
        "timeout": _interval(definition.call_timeout),
        "unique_key": unique_key,
        "unique": unique,
        "metadata": metadata_json,
        "concurrency_key": check_key(concurrency_key, "concurrency_key"),
        "fair_key": fair_key,
        "fair_weight": fair_weight,
        "sequence_key": sequence_key,
        "sequence_hold": definition.sequence_key is not None and definition.on_failure == "hold",
        "after": list(opts.after),
        "proceed": opts.after_failure == "run",
        # Expiry: a time, or seconds after the enqueue statement (the database's clock).
        "expires_at": expires if isinstance(expires, datetime) else None,
        "expires": None if isinstance(expires, datetime) else _interval(expires),
    }


@dataclass(frozen=True)
class UniquePolicy:
    """How a call with a unique_key treats a duplicate, when other than by default
    (a live task holds the key, the new call is dropped): _insert_unique."""

    window: timedelta | None  # unique_for
    states: list[str]  # the states that count (the live ones always do)
    replace: bool  # on_conflict="replace"


def _unique_policy(definition: TaskDefinition) -> UniquePolicy | None:
    """The call's policy; None for the default one (today's single statement)."""
    opts = definition.options
    unique_for = definition.unique_for if opts.unique_for is None else opts.unique_for
    states = definition.unique_states if opts.unique_states is None else opts.unique_states
    on_conflict = opts.on_conflict or definition.on_conflict or "keep"
    if states is None:
        # unique_for alone counts every state ("enqueued within the period, whatever
        # its state"); without it, the live ones.
        states = TASK_STATES if unique_for is not None else LIVE_STATES
    if unique_for is None and states == LIVE_STATES and on_conflict == "keep":
        return None
    return UniquePolicy(_interval(unique_for), list(states), on_conflict == "replace")


def _no_key(opts: Any) -> None:
    given = [
        name
        for name in ("unique_for", "unique_states", "on_conflict")
        if getattr(opts, name) is not None
    ]
    raise InvalidTaskError(
        f"{', '.join(given)} without a unique_key: these options say how a duplicate "
        "of a key is treated, so pass one with .using(unique_key=...); nothing was enqueued"
    )


def _key_of(definition: TaskDefinition, args: Any, kwargs: dict[str, Any]) -> Any:
    """The task's concurrency_key function applied to this call's arguments."""
    try:
        key = definition.concurrency_key(*args, **kwargs)
    except Exception as exc:
        raise InvalidTaskError(
            f"the concurrency_key function of task {definition.name!r} raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return check_key(key, f"the key of task {definition.name!r} (its concurrency_key function)")


def _state(opts: Any) -> str:
    """Scheduled rows are not claimable until the stager makes them pending. Any
    explicit run_at counts as scheduled (the caller's clock cannot tell whether it is
    past by the database's); one already due is staged at the next claim."""
    return "scheduled" if opts.run_at is not None or opts.delay else "pending"


def _sequence_key(
    definition: TaskDefinition, args: Any, kwargs: dict[str, Any], key_per_call: bool = True
) -> str | None:
    """A sequenced task's sequence for this call: ``using(sequence_key=...)``, else the
    task's function's (None: this call is in no sequence). None for other tasks, and
    for enqueue_many's shared row (``key_per_call=False``), which keys each call."""
    if definition.sequence_key is None:
        return None
    if definition.options.sequence_key is not None:
        return check_key(definition.options.sequence_key, "sequence_key")
    if not key_per_call:
        return None
    try:
        key = definition.sequence_key(*args, **kwargs)
    except Exception as exc:
        raise InvalidTaskError(
            f"the sequence_key function of task {definition.name!r} raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return check_key(key, f"the key of task {definition.name!r} (its sequence_key function)")


def _fair_key(
    definition: TaskDefinition, args: Any, kwargs: dict[str, Any], key_per_call: bool = True
) -> tuple[str | None, float | None]:
    """A fair task's key for this call and the weight FAIR_WEIGHTS gives it: the key
    of ``using(fair_key=...)``, else the task's function's (the key "" when it returns
    None: the calls without a key share one flow). (None, None) for other tasks, and
    for enqueue_many's shared row (``key_per_call=False``), which keys each call."""
    if definition.fair_key is None:
        return None, None
    key = definition.options.fair_key
    if key is None and not key_per_call:
        return None, None
    if key is None:
        try:
            key = definition.fair_key(*args, **kwargs)
        except Exception as exc:
            raise InvalidTaskError(
                f"the fair_key function of task {definition.name!r} raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        key = check_key(key, f"the key of task {definition.name!r} (its fair_key function)")
    else:
        key = check_key(key, "fair_key")
    if key is None:
        return "", 1.0
    return key, fair_weights().of(key)


# The SQLSTATEs of a statement that names a table or a column the database lacks:
# undefined_table, undefined_column.
_NOT_MIGRATED = frozenset({"42P01", "42703"})


def _raise_if_not_migrated(exc: ProgrammingError, alias: str) -> None:
    """Raise, instead of ``exc``, an error that says to migrate, when ``exc`` is a
    statement of enqueue meeting a table or column that the database lacks. Only read
    once an enqueue has failed: a working enqueue pays nothing for it."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) in _NOT_MIGRATED:
        raise ProgrammingError(
            f"{str(cause).splitlines()[0]}: database {alias!r} lacks migrations of "
            f"django_pgqueue; run {migrate_command(alias)}. Nothing was enqueued."
        ) from exc


def _insert(alias: str, row: dict[str, Any]) -> tuple[int, datetime]:
    """INSERT one task; returns its id and enqueued_at (the live duplicate's, if any)."""
    try:
        return _insert_row(alias, row)
    except ProgrammingError as exc:
        _raise_if_not_migrated(exc, alias)
        raise


def _insert_row(alias: str, row: dict[str, Any]) -> tuple[int, datetime]:
    if row["after"]:
        return _insert_after(alias, row)
    if row["unique"] is not None:
        return _insert_unique(alias, row)
    if row["fair_key"] is not None or row["sequence_key"] is not None:
        query = QUERIES["enqueue_keyed"]
    else:
        query = QUERIES["enqueue_unique" if row["unique_key"] else "enqueue"]
    with enqueue_cursor(connections[alias]) as cursor:
        cursor.execute(query, row)
        found = cursor.fetchone()
        if found is not None:
            return found[0], found[1]
        # A live task with this unique_key exists: return it instead of inserting.
        cursor.execute(QUERIES["find_live_unique"], {"unique_key": row["unique_key"]})
        existing = cursor.fetchone()
    if existing is None:
        # The conflicting row finished between the two statements: insert again.
        return _insert_row(alias, row)
    return existing[0], existing[1]


def _insert_unique(alias: str, row: dict[str, Any]) -> tuple[int, datetime]:
    """A call whose unique_key has options (unique_for, unique_states, on_conflict):
    the key's advisory lock, then the duplicate it finds (kept, or replaced if queued),
    or a new row. The lock is held to the end of the transaction, so a concurrent
    enqueuer of the key waits for this one's commit and then sees its row (or, after a
    rollback, inserts its own); outside a transaction one is opened for the three
    statements (enqueue_on_commit's insert runs after the commit)."""
    policy: UniquePolicy = row["unique"]
    find = {
        "unique_key": row["unique_key"],
        "unique_states": policy.states,
        "unique_for": policy.window,
        "task_name": row["task_name"],
    }
    with (
        transaction.atomic(using=alias, savepoint=False),
        enqueue_cursor(connections[alias]) as cursor,
    ):
        cursor.execute(QUERIES["lock_unique_key"], find)
        while True:
            cursor.execute(QUERIES["find_unique"], find)
            found = cursor.fetchone()
            if found is None:
                keyed = row["fair_key"] is not None or row["sequence_key"] is not None
                insert = "enqueue_keyed" if keyed else "enqueue_unique"
                cursor.execute(QUERIES[insert], row)
                inserted = cursor.fetchone()
                if inserted is not None:
                    return inserted[0], inserted[1]
                # A live row appeared (a default enqueue takes no lock): find it.
                continue
            task_id, enqueued_at, replaceable = found
            if not (policy.replace and replaceable):
                return task_id, enqueued_at
            cursor.execute(QUERIES["replace_unique"], {**row, "target": task_id})
            if cursor.fetchone() is not None:
                return task_id, enqueued_at
            # A worker claimed it between the two statements: look again.


def _insert_after(alias: str, row: dict[str, Any]) -> tuple[int, datetime]:
    """INSERT a task that waits for others (``after=``)."""
    with enqueue_cursor(connections[alias]) as cursor:
        cursor.execute(QUERIES["enqueue_after"], row)
        found = cursor.fetchone()
        if found is not None:
            return found[0], found[1]
        cursor.execute(QUERIES["missing_tasks"], {"ids": row["after"]})
        missing = [r[0] for r in cursor.fetchall()]
    raise InvalidTaskError(
        f"after: no task with id(s) {', '.join(map(str, missing))}; a task can only wait "
        "for tasks that exist (enqueue the parents first, in the same transaction if you "
        "like); nothing was enqueued"
    )


_F = TypeVar("_F", bound=Callable[..., Any])


def _enqueuing(operation: str) -> Callable[[_F], _F]:
    """An enqueue function, with the enqueue hooks of PGQUEUE['MIDDLEWARE'] applied to
    the task first (middleware.py), and the call in a producer span when OpenTelemetry
    is installed (tracing.py)."""

    def decorate(fn: _F) -> _F:
        traced = tracing.producer(operation, fn)

        @functools.wraps(fn)
        def call(definition: TaskDefinition, *args: Any) -> Any:
            return traced(before_enqueue(definition), *args)

        return call  # type: ignore[return-value]

    return decorate


@_enqueuing("enqueue")
def insert(definition: TaskDefinition, args: Any, kwargs: dict[str, Any]) -> tuple[int, datetime]:
    """Like ``enqueue``, also returning the row's enqueued_at (the database's clock)."""
    row = build_row(definition, args, kwargs)
    alias = database_for(row["queue"])
    check_transaction(definition, row["queue"], alias, "enqueue()")
    return _insert(alias, row)


def enqueue(definition: TaskDefinition, args: Any, kwargs: dict[str, Any]) -> int:
    return insert(definition, args, kwargs)[0]


@_enqueuing("enqueue_on_commit")
def enqueue_on_commit(definition: TaskDefinition, args: Any, kwargs: dict[str, Any]) -> int:
    """Reserve the id now, INSERT when the outermost atomic block commits.

    The block is the one on ``commit_alias`` (default: the queue's database), so a view
    writing to another database can defer the task until its own commit. With
    ``unique_key`` the id returned is the reserved one; if a duplicate holds the key at
    commit time (kept or replaced, by the call's unique options), the reservation is
    simply not used.
    """
    row = build_row(definition, args, kwargs)
    alias = database_for(row["queue"])
    commit_alias = definition.options.commit_alias or alias
    check_transaction(definition, row["queue"], commit_alias, "enqueue_on_commit()")
    try:
        with enqueue_cursor(connections[alias]) as cursor:
            cursor.execute(QUERIES["reserve_id"])
            row["id"] = cursor.fetchone()[0]
    except ProgrammingError as exc:
        _raise_if_not_migrated(exc, alias)
        raise
    transaction.on_commit(lambda: _insert(alias, row), using=commit_alias)
    return row["id"]


def _split_call(item: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(item, Call):
        return item.args, item.kwargs
    if isinstance(item, tuple):
        return item, {}
    if isinstance(item, dict):
        return (), item
    return (item,), {}


@_enqueuing("enqueue_many")
def enqueue_many(definition: TaskDefinition, calls: Iterable[Any]) -> list[int]:
    """All calls in one INSERT ... SELECT statement; returns the ids in input order.

    The options (queue, priority, run_at, ...) are validated once for the batch; each
    call's args and kwargs are checked like a single enqueue's (their size too, each
    call's against MAX_ARGS_BYTES). With a unique_key, the
    whole batch shares it: the first call is enqueued (unless a live task holds the key;
    with on_conflict="replace", the last call, as if each replaced the one before) and
    every position returns that task's id. An encrypted task's calls are encrypted one
    by one (each row its own sealed args and kwargs).
    """
    shared = build_row(definition, (), {}, key_per_call=False)
    keyed = shared["concurrency_key"] is None and definition.concurrency_key is not None
    fair = definition.fair_key is not None
    sequenced = definition.sequence_key is not None and shared["sequence_key"] is None
    args_list: list[Any] = []
    kwargs_list: list[Any] = []
    keys_list: list[str | None] = []
    fair_keys: list[tuple[str | None, float | None]] = []
    sequence_keys: list[str | None] = []
    for index, item in enumerate(calls):
        args, kwargs = _split_call(item)
        try:
            args_list.append(check_json(args, "args"))
            kwargs_list.append(check_json(kwargs, "kwargs") if kwargs else _EMPTY)
            if keyed:
                key = check_key(_key_of(definition, args, kwargs), "concurrency_key")
                keys_list.append(key)
            if fair:
                fair_keys.append(_fair_key(definition, args, kwargs))
            if sequenced:
                sequence_keys.append(_sequence_key(definition, args, kwargs))
        except InvalidTaskError as exc:
            raise InvalidTaskError(f"item {index}: {exc}") from exc
    if not args_list:
        return []
    args_json, kwargs_json = dumps(args_list), dumps(kwargs_list)
    _check_sizes(args_list, kwargs_list, args_json, kwargs_json)
    if encryption.chosen(definition.encrypt):
        args_list = [encryption.seal(args) for args in args_list]
        kwargs_list = [encryption.seal(kwargs) if kwargs else kwargs for kwargs in kwargs_list]
        args_json, kwargs_json = dumps(args_list), dumps(kwargs_list)
    alias = database_for(shared["queue"])
    check_transaction(definition, shared["queue"], alias, "enqueue_many()")
    def one(i: int) -> dict[str, Any]:
        """The row of call ``i`` alone (for the paths that insert calls one by one)."""
        row = {**shared, "args": dumps(args_list[i]), "kwargs": dumps(kwargs_list[i])}
        if keyed:
            row["concurrency_key"] = keys_list[i]
        if fair:
            row["fair_key"], row["fair_weight"] = fair_keys[i]
        if sequenced:
            row["sequence_key"] = sequence_keys[i]
        if row["sequence_key"] is not None:
            row["state"] = "waiting"
        return row

    if shared["after"]:
        # Each row waits on its own edges: one statement per call.
        return [_insert(alias, one(i))[0] for i in range(len(args_list))]
    if shared["unique_key"] is not None:
        pick = -1 if shared["unique"] is not None and shared["unique"].replace else 0
        return [_insert(alias, one(pick % len(args_list)))[0]] * len(args_list)
    params = {
        **shared,
        "args_list": args_json,
        "kwargs_list": kwargs_json,
        "keys_list": dumps(keys_list) if keyed else None,
    }
    keyed = fair or definition.sequence_key is not None
    if keyed:
        params["fair_keys_list"] = dumps([key for key, _ in fair_keys]) if fair else None
        params["fair_weights_list"] = dumps([w for _, w in fair_keys]) if fair else None
        keys = sequence_keys if sequenced else [shared["sequence_key"]] * len(args_list)
        params["sequence_keys_list"] = dumps(keys)
    try:
        with enqueue_cursor(connections[alias]) as cursor:
            cursor.execute(QUERIES["enqueue_many_keyed" if keyed else "enqueue_many"], params)
            return [row[0] for row in cursor.fetchall()]
    except ProgrammingError as exc:
        _raise_if_not_migrated(exc, alias)
        raise


def _check_sizes(
    args_list: list[Any], kwargs_list: list[Any], args_json: str, kwargs_json: str
) -> None:
    """Each call's args and kwargs within MAX_ARGS_BYTES, or PayloadTooLarge naming the
    call. The batch is encoded once, for the statement: a batch within the limit as a
    whole has every call within it (the common case). Only a larger batch has its
    calls measured one by one (encoded again)."""
    if fits(ARGS_LIMIT, args_json, kwargs_json):
        return
    for index, (args, kwargs) in enumerate(zip(args_list, kwargs_list, strict=True)):
        check_size(ARGS_LIMIT, dumps(args), dumps(kwargs), where=f"item {index}: ")


_EMPTY: dict[str, Any] = {}
