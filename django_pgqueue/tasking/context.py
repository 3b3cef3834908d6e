"""What a handler with ``takes_context=True`` receives as its first argument."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from django_pgqueue.core.exceptions import _UNSET, InvalidTaskError, LeaseLost, Suspend
from django_pgqueue.core.payload import (
    CHECKPOINT_LIMIT,
    PROGRESS_LIMIT,
    check_json,
    check_size,
    dumps,
)
from django_pgqueue.db import encryption
from django_pgqueue.db.sql import QUERIES

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The namespace of idempotency keys (uuid5 of "django_pgqueue" in the URL namespace).
_IDEMPOTENCY_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "django_pgqueue")


@dataclass
class TaskContext:
    """The running attempt of one task.

    ``deadline`` is derived from the database's own timestamps (the claim's now() plus
    the task's timeout), never from the worker's clock alone; None when the task has no
    timeout. ``cancel_requested`` is refreshed by the worker's heartbeat; call
    ``refresh_cancel_requested()`` to ask the database now.

    ``save_checkpoint`` and ``report_progress`` are fenced writes on the handler's own
    database connection: inside an ``atomic()`` block they commit (or roll back) with
    the handler's own writes. In an atomic task (``@task(atomic=True)``) they are held
    until the attempt commits and written then, in its transaction (a write now would
    lock the task's row for the rest of the handler: its lease could not be renewed);
    rolled back, they are never written. They raise LeaseLost when the worker no longer
    owns the task; stop working when that happens. A value larger than
    ``MAX_CHECKPOINT_BYTES`` raises PayloadTooLarge, and nothing is written.

    ``idempotency_key`` names the task for the APIs that accept one (payments, email):
    the same for every attempt of the task, different for every other task.

    An encrypted task's (docs/security.md, "Encrypted payloads") checkpoint, signals and
    wake-up arrive here decrypted, and what it saves is encrypted before it is written.
    """

    task_id: int
    task_name: str
    queue: str
    attempt: int
    max_attempts: int
    enqueued_at: datetime
    claimed_at: datetime
    deadline: datetime | None
    checkpoint: Any
    metadata: dict[str, Any]
    lease_token: str
    database: str
    # Every signal delivered to the task so far (name -> payload), and what made it
    # pending again after it last waited (None if it did not wait): {"reason":
    # "signal", "signal": name, "payload": ...}, {"reason": "timeout", ...}, or
    # {"reason": "parents" | "child", "task": id, "state": ...} (docs/workflows.md).
    signals: dict[str, Any] = field(default_factory=dict)
    wake: dict[str, Any] | None = None
    # Set by the worker's heartbeat thread, read by the handler: plain flags suffice.
    _cancel_requested: bool = field(default=False, repr=False)
    _lease_lost: bool = field(default=False, repr=False)
    # An atomic attempt's checkpoint and progress writes, held until its commit (query
    # name -> parameters); None: written at once.
    _held: dict[str, dict[str, Any]] | None = field(default=None, repr=False)
    # Its row is encrypted: checkpoint and progress are written encrypted.
    _encrypted: bool = field(default=False, repr=False)

    @property
    def cancel_requested(self) -> bool:
        return self._cancel_requested

    @property
    def lease_lost(self) -> bool:
        return self._lease_lost

    @property
    def idempotency_key(self) -> str:
        """A key for this task, stable across its attempts (and a requeue of it) and
        different from every other task's: pass it to an API that deduplicates by key,
        so that an effect outside the database happens once however often the task
        runs. A UUID made from the task's id and the instant it was enqueued (the
        database's clock), so a table that starts its ids again (a new database) does
        not reuse the keys of the old one."""
        moment = self.enqueued_at
        if moment.tzinfo is None:  # USE_TZ = False: Django hands naive UTC-less times
            moment = moment.replace(tzinfo=UTC)
        enqueued = (moment - _EPOCH) // timedelta(microseconds=1)
        return str(uuid.uuid5(_IDEMPOTENCY_NAMESPACE, f"{self.task_id}:{enqueued}"))

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def time_left(self) -> timedelta | None:
        """Time until the deadline (negative once past it), or None without a timeout."""
        if self.deadline is None:
            return None
        return self.deadline - timezone.now()

    def should_stop(self) -> bool:
        """True once cancelled, past the deadline, or the lease is lost."""
        left = self.time_left()
        return (
            self.cancel_requested
            or self.lease_lost
            or (left is not None and left.total_seconds() <= 0)
        )

    def save_checkpoint(self, checkpoint: Any) -> None:
        """Persist resumable state; the next attempt receives it as ``context.checkpoint``."""
        value = check_json(checkpoint, "checkpoint")
        text = dumps(value)
        check_size(CHECKPOINT_LIMIT, text)
        if self._encrypted:
            text = encryption.seal_text(text)
        self._fenced("save_checkpoint", {"checkpoint": text})
        self.checkpoint = value

    def report_progress(self, progress: Any) -> None:
        """Publish progress (any JSON value) for the admin and API readers."""
        text = dumps(check_json(progress, "progress"))
        check_size(PROGRESS_LIMIT, text)
        if self._encrypted:
            text = encryption.seal_text(text)
        self._fenced("save_progress", {"progress": text})

    @property
    def timed_out(self) -> bool:
        """True when this attempt started because a suspension's timeout passed."""
        return bool(self.wake) and self.wake.get("reason") == "timeout"

    def suspend(
        self, signal: str, *, timeout: float | None = None, checkpoint: Any = _UNSET
    ) -> NoReturn:
        """Suspend until ``signal`` arrives or ``timeout`` seconds pass (raises Suspend)."""
        raise Suspend(signal, timeout=timeout, checkpoint=checkpoint)

    def wait_for(
        self, *task_ids: int, timeout: float | None = None, checkpoint: Any = _UNSET
    ) -> NoReturn:
        """Suspend until every task in ``task_ids`` has ended (succeeded, failed or
        cancelled), e.g. a child this handler just enqueued; the next attempt reads
        their outcomes with ``parent_results()``. Fenced: raises LeaseLost if this
        worker no longer owns the task, InvalidTaskError for an id with no task."""
        ids = sorted({_task_id(i) for i in task_ids})
        if not ids:
            raise InvalidTaskError("wait_for needs at least one task id")
        with connections[self.database].cursor() as cursor:
            cursor.execute(QUERIES["wait_for_tasks"], {**self._fence_params(), "ids": ids})
            found = {row[0] for row in cursor.fetchall()}
            if not found:
                cursor.execute(QUERIES["read_cancel_requested"], self._fence_params())
                if cursor.fetchone() is None:
                    self._lease_lost = True
                    raise LeaseLost(self._lost_message())
        missing = [i for i in ids if i not in found]
        if missing:
            raise InvalidTaskError(
                f"wait_for: no task with id(s) {', '.join(map(str, missing))}"
            )
        raise Suspend.for_tasks(ids, timeout, checkpoint)

    def parent_results(self) -> dict[int, dict[str, Any]]:
        """The tasks this one waited for (its parents, and tasks it ``wait_for``-ed), by
        id: ``{"task_name", "state", "result", "error"}`` (``error``: the last error's
        message). Read when called, so a task that does not ask loads nothing. A parent
        pruned by retention since is missing. An encrypted parent's result is decrypted
        (EncryptionError if no key of ENCRYPTION_KEYS decrypts it)."""
        with connections[self.database].cursor() as cursor:
            cursor.execute(QUERIES["parent_results"], {"id": self.task_id})
            rows = cursor.fetchall()
        return {
            parent: {"task_name": name, "state": state,
                     "result": _parent_result(parent, _load(result), encrypted),
                     "error": error}
            for parent, name, state, result, error, encrypted in rows
        }  # fmt: skip

    def refresh_cancel_requested(self) -> bool:
        """Ask the database whether cancellation was requested; returns the answer."""
        with connections[self.database].cursor() as cursor:
            cursor.execute(QUERIES["read_cancel_requested"], self._fence_params())
            row = cursor.fetchone()
        if row is None:
            self._lease_lost = True
            raise LeaseLost(self._lost_message())
        if row[0]:
            self._cancel_requested = True
        return self.cancel_requested

    # For ``async def`` handlers: the same fenced writes, off the event loop.
    async def asave_checkpoint(self, checkpoint: Any) -> None:
        await sync_to_async(self.save_checkpoint)(checkpoint)

    async def areport_progress(self, progress: Any) -> None:
        await sync_to_async(self.report_progress)(progress)

    async def arefresh_cancel_requested(self) -> bool:
        return await sync_to_async(self.refresh_cancel_requested)()

    def _fence_params(self) -> dict[str, Any]:
        return {"id": self.task_id, "attempt": self.attempt, "token": self.lease_token}

    def _fenced(self, query: str, params: dict[str, Any]) -> None:
        if self._held is not None:
            # Atomic: check the lease now (a read: no lock), write at the commit.
            self.refresh_cancel_requested()
            self._held[query] = params
            return
        with connections[self.database].cursor() as cursor:
            cursor.execute(QUERIES[query], {**self._fence_params(), **params})
            row = cursor.fetchone()
        if row is None:
            self._lease_lost = True
            raise LeaseLost(self._lost_message())
        if row[0]:
            self._cancel_requested = True

    def _write_held(self, cursor: Any) -> None:
        """An atomic attempt's commit (worker/atomic.py, with the row locked by
        hold_lease): the checkpoint and progress its handler saved, on ``cursor``."""
        for query, params in (self._held or {}).items():
            cursor.execute(QUERIES[query], {**self._fence_params(), **params})
        self._held = {}

    async def aparent_results(self) -> dict[int, dict[str, Any]]:
        return await sync_to_async(self.parent_results)()

    async def await_for(
        self, *task_ids: int, timeout: float | None = None, checkpoint: Any = _UNSET
    ) -> NoReturn:
        await sync_to_async(self.wait_for)(*task_ids, timeout=timeout, checkpoint=checkpoint)
        raise AssertionError("unreachable")  # wait_for always raises

    def _lost_message(self) -> str:
        return (
            f"task {self.task_id} attempt {self.attempt}: the lease is no longer held by this "
            "worker (it expired and was recovered, or the task was settled); nothing was written"
        )


def _task_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTaskError(f"a task id is an int, not {value!r}")
    return value


def _parent_result(parent: int, result: Any, encrypted: bool) -> Any:
    if not encrypted:
        return result
    return encryption.open_value(result, f"the result of task {parent}")


def _load(value: Any) -> Any:
    # Django's cursor hands jsonb over as text.
    return json.loads(value) if isinstance(value, str) else value
