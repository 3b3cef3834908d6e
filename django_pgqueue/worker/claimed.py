"""What the worker holds about a claimed task: the claimed row and its lease.

A task id alone does not name a claim: a worker may still run an old attempt of a task
(its lease lapsed, or the claim was lost in a database crash) while a new attempt of the
same task runs beside it. Everything the worker tracks about a claimed task is keyed by
its ``Lease``: (id, attempt, lease token).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from django_pgqueue.db import encryption
from django_pgqueue.tasking.context import TaskContext

if TYPE_CHECKING:
    import psycopg

    from django_pgqueue.worker.attempt_log import AttemptLog


class Lease(NamedTuple):
    """The key of one claim of one task: what every fenced write carries."""

    id: int
    attempt: int
    token: str

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "attempt": self.attempt, "token": self.token}

    def __str__(self) -> str:
        return f"task {self.id} attempt {self.attempt} lease {self.token[:8]}"


@dataclass(eq=False)
class ClaimedTask:
    """A row as the claim returned it (columns read by name), plus the worker's bookkeeping."""

    id: int
    task_name: str
    handler_version: int
    queue: str
    priority: int
    args: Any
    kwargs: Any
    attempt: int
    max_attempts: int
    retry_policy_json: str
    timeout: float | None
    lease_token: str
    lease_expires_at: datetime
    claimed_at: datetime
    enqueued_at: datetime
    run_at: datetime
    checkpoint_json: str | None
    cancel_requested: bool
    cancel_hard: bool
    metadata_json: str
    signals_json: str | None = None
    wake_json: str | None = None
    # A fair task's key (docs/tenants.md; None: not a fair task): the slots let a key
    # with nothing waiting for a slot go first (SlotPool.submit).
    fair_key: str | None = None
    # The claim found it expired and ended it cancelled instead of starting it: the
    # claimer counts it and drops it (sql: claim). Never run.
    expired: bool = False
    # How many rows the claim left pending to keep its batch within CLAIM_BATCH_BYTES
    # (the same on every row of one claim; sql: claim): the claimer claims again at once.
    left_out: int = 0
    # Rows the claim's walk found that their key's limit held back (same on every row):
    # with a per-key rate, the claimer then sets aside those out of budget.
    key_held: int = 0
    # Its payloads are encrypted in the row (encryption.py), and were decrypted here by
    # open_payloads: its result, checkpoint and progress are encrypted before written.
    encrypted: bool = False
    received_monotonic: float = field(default_factory=time.monotonic)
    # When a slot began running it: a prefetched task may wait for a slot, and its
    # timeout counts from its start, not from its claim.
    started_monotonic: float | None = None
    # When the heartbeat last renewed the lease (the renewal was sent then: monotonic).
    renewed_monotonic: float | None = None
    context: TaskContext | None = None
    # The exception the handler's attempt ended with (set by outcomes.error_entry), for
    # the log record of the settlement: never stored, never sent to a process.
    raised: BaseException | None = None
    # Set by the slot that takes the task, when the claimer waits for that (see
    # Claimer._hand_over): an idle worker's claimer lets the slot start first.
    picked_up: threading.Event | None = None
    # A batch handler's batch (worker/batcher.py), on its first task, which carries it
    # through a slot: every task of the batch, this one first. None: a task of its own.
    batch: list[ClaimedTask] | None = None
    # The attempt's log records, with TASK_LOGS, in the process that runs its handler
    # (task_logs.py): never stored as such, never sent to a process.
    logs: AttemptLog | None = None

    @functools.cached_property
    def lease(self) -> Lease:
        """Fixed from the claim on (id, attempt and token never change in the worker):
        made once, though the slot, the in-flight set and the settler each ask for it."""
        return Lease(self.id, self.attempt, self.lease_token)

    # Rarely needed columns arrive as JSON text and are parsed on first use.
    @property
    def retry_policy(self) -> dict[str, Any]:
        return json.loads(self.retry_policy_json) if self.retry_policy_json else {}

    @property
    def checkpoint(self) -> Any:
        return json.loads(self.checkpoint_json) if self.checkpoint_json else None

    @property
    def metadata(self) -> dict[str, Any]:
        # Most rows carry none: "{}" is not worth a parse on every context built.
        if not self.metadata_json or self.metadata_json == "{}":
            return {}
        return json.loads(self.metadata_json)

    @property
    def signals(self) -> dict[str, Any]:
        return json.loads(self.signals_json) if self.signals_json else {}

    @property
    def wake(self) -> dict[str, Any] | None:
        return json.loads(self.wake_json) if self.wake_json else None

    def open_payloads(self) -> None:
        """Decrypt an encrypted row's payloads in place (args, kwargs, checkpoint,
        signals, wake), for the handler; raises EncryptionError, changing nothing, when
        one cannot be decrypted. Called for a row whose args are an object only (a
        plain row's are an array): a plain task pays one type check."""
        where = f"task {self.id}'s"
        opened = {
            "args": encryption.open_value(self.args, f"{where} args"),
            "kwargs": encryption.open_value(self.kwargs, f"{where} kwargs"),
        }
        checkpoint = json.loads(self.checkpoint_json) if self.checkpoint_json else None
        if encryption.is_sealed(checkpoint):
            opened["checkpoint_json"] = encryption.open_text(checkpoint, f"{where} checkpoint")
        for name, column in (("signals_json", "signals"), ("wake_json", "wake")):
            text = getattr(self, name)
            if text:
                value = encryption.open_column(column, json.loads(text), f"{where} {column}")
                opened[name] = json.dumps(value)
        self.__dict__.update(opened)
        self.encrypted = True

    @property
    def route(self) -> tuple[str, int]:
        return self.task_name, self.handler_version

    def mark_started(self) -> None:
        self.started_monotonic = time.monotonic()

    def lease_left(self, lease_seconds: float) -> float:
        """Seconds the lease surely still holds, on this process's clock: from the claim's
        arrival or the last renewal the heartbeat saw written (both after the database
        stamped them). Negative after a stall longer than the lease (a SIGSTOP, a frozen
        VM): the sweep may have given the task to another worker meanwhile."""
        held_since = self.renewed_monotonic or self.received_monotonic
        return held_since + lease_seconds - time.monotonic()

    @property
    def waited(self) -> float:
        """Seconds between the claim's arrival and the start of the handler."""
        if self.started_monotonic is None:
            return 0.0
        return max(0.0, self.started_monotonic - self.received_monotonic)

    @property
    def deadline(self) -> datetime | None:
        """The claim's database now(), plus the wait for a slot, plus the timeout."""
        if self.timeout is None:
            return None
        return self.claimed_at + timedelta(seconds=self.waited + self.timeout)

    @property
    def deadline_monotonic(self) -> float | None:
        """The watchdog's deadline on this process's monotonic clock.

        The handler's deadline is ``deadline``, derived from the claim's database
        now(). The claim's result arrives one round trip after that stamp, and the
        watchdog starts counting from the handler's start: at most a round trip of extra
        budget, and no dependence on the worker's wall clock being in step with the
        database's.
        """
        if self.timeout is None:
            return None
        return (self.started_monotonic or self.received_monotonic) + self.timeout

    def request_cancel(self, hard: bool = False) -> None:
        """The heartbeat saw a cancel request: tell the handler (and, if hard, the pool).
        A cancel_hard claimed without a cancel_requested was no request (sql: cancel_task)."""
        self.cancel_hard = (self.cancel_requested and self.cancel_hard) or hard
        self.cancel_requested = True
        if self.context is not None:
            self.context._cancel_requested = True

    def mark_lease_lost(self) -> None:
        if self.context is not None:
            self.context._lease_lost = True

    def log_prefix(self) -> str:
        return (
            f"task {self.id} ({self.task_name}) attempt {self.attempt} "
            f"lease {self.lease_token[:8]}"
        )


_FIELDS = dataclasses.fields(ClaimedTask)
_NAMES = frozenset(f.name for f in _FIELDS)
_REQUIRED = frozenset(
    f.name
    for f in _FIELDS
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)
_DEFAULTS = {f.name: f.default for f in _FIELDS if f.default is not dataclasses.MISSING}
_FACTORIES = tuple(
    (f.name, f.default_factory) for f in _FIELDS if f.default_factory is not dataclasses.MISSING
)


def claimed_rows(cursor: psycopg.Cursor[Any]) -> Callable[[Sequence[Any]], ClaimedTask]:
    """A psycopg row factory: a ClaimedTask from each row of a claim, its columns read
    by name, as ``class_row(ClaimedTask)`` would make it, for a third of the CPU
    (``class_row`` calls the dataclass's ``__init__`` with some thirty keyword arguments
    per row, and a claim returns up to a few hundred rows).

    The columns are checked once per result: each must be a field, and every field
    without a default must be there (else making a row raises TypeError); the fields a
    row has no column for get their defaults, or their default factory's value."""
    if cursor.description is None:
        return _no_result
    names = [column.name for column in cursor.description]
    unknown = sorted(set(names) - _NAMES)
    missing = sorted(_REQUIRED - set(names))
    if unknown or missing:
        # Raised for a row, not for the result: a cursor may run other statements whose
        # rows are never fetched (as class_row would).
        problem = (
            f"a claim's columns do not make a ClaimedTask: unknown {unknown}, "
            f"missing {missing}"
        )

        def refuse(values: Sequence[Any]) -> ClaimedTask:
            raise TypeError(problem)

        return refuse
    new = object.__new__

    def make(values: Sequence[Any]) -> ClaimedTask:
        task = new(ClaimedTask)
        fields = task.__dict__
        fields.update(_DEFAULTS)
        for name, factory in _FACTORIES:
            fields[name] = factory()
        fields.update(zip(names, values, strict=True))
        return task

    return make


def _no_result(values: Sequence[Any]) -> ClaimedTask:
    raise TypeError("the statement returned no rows to make ClaimedTasks of")
