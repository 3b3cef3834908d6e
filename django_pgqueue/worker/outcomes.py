"""The outcome policy: what each way an attempt can end does to the task's row.

One home for every transition a worker decides:

==============================  ===========================================================
how the attempt ended           what is written (fenced on the lease)
==============================  ===========================================================
returned                        succeeded, result stored
raised, attempts left           pending after the frozen backoff, error appended
raised, attempts spent          failed (dead letter), error appended
raised, a frozen exception      failed at once, whatever attempts remain: a class of
rule says no retry              ``discard_on``, or none of ``retry_on`` (the error's
                                ``rule`` says which)
``Retry(delay)``                as raised, with the given delay
``Snooze(delay)``               pending after delay, the attempt refunded, no error
``Continue(checkpoint)``        pending now, attempt counter reset, checkpoint saved
``Suspend`` / ``wait_for``      waiting for a signal or tasks, attempt refunded,
                                checkpoint saved if given (pending at once when the
                                signal already came or the tasks already ended)
``Cancelled`` / cancel request  cancelled, error says why
timeout / written off / killed  as raised, with a TimeoutError (of the exception rules,
                                only ``discard_on`` applies to it); a written-off
                                handler is settled so when it returns, whatever it
                                returned or raised
written off, still running at   as a timeout, due no sooner than ``RELEASE_DELAY`` after
the exit of its process         the write (the process exits right after it)
hard cancel (process killed)    cancelled, error says the handler was killed
payload cannot run              failed at once, no retry (bad stored args, bad result)
payload cannot be decrypted     as raised, with an EncryptionError (its row keeps its
                                ciphertext: requeued once the key is back, it runs)
lease lapsed before the start    not run: pending again (failed on the last attempt), as
                                the sweep would write it (a process that stalled)
shutdown, handler unfinished    scheduled for ``RELEASE_DELAY``, attempt not refunded
                                (failed on the last attempt, with WorkerShutdown)
atomic attempt (``atomic=True``) returned, ``Continue`` and ``Suspend`` as above, written
                                by the handler's own transaction, which they commit with
                                (worker/atomic.py); every other ending rolls that
                                transaction back first, then is written as above
atomic attempt whose lease was  its writes rolled back; then as a lapsed lease: pending
lost before its commit          again (failed on the last attempt), if still ours
==============================  ===========================================================

An encrypted task's result and checkpoint are encrypted here, by the outcome that
carries them, in the process that ran the handler (encryption.py): they are never
written, nor sent from a handler's process, in clear.

Two transitions happen without a worker and live in SQL beside their statements:
a cancel requested while the handler ran wins over a retry (``settle``), and a lease
that lapsed is recovered as pending, or failed once the attempts are spent
(``recover_expired_leases``). Both record an ``executions`` entry like a settlement.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field
from typing import Any

from django_pgqueue.core.conf import get_settings
from django_pgqueue.core.exceptions import EncryptionError
from django_pgqueue.core.retry import RetryPolicy, backoff_fields, exception_rule
from django_pgqueue.db import encryption
from django_pgqueue.worker.claimed import ClaimedTask

logger = logging.getLogger("django_pgqueue.worker")

# The labels of the outcomes counter (metrics, logs and the executions history).
SUCCESS = "success"
FAILURE = "failure"
TIMEOUT = "timeout"
LOST = "lost"
CANCELLED = "cancelled"
CONTINUED = "continued"
SNOOZED = "snoozed"
RELEASED = "released"
SUSPENDED = "suspended"

# A task released at shutdown becomes due this long after the release commits. The
# releasing process exits as soon as the release is written (its handler threads die
# with it), well inside this margin: the next run never overlaps the released one.
RELEASE_DELAY = 1.0

# Error text is stored in jsonb: no NUL, no lone surrogates, and a bounded size.
MAX_MESSAGE = 10_000
MAX_TRACEBACK = 50_000


@dataclass
class Outcome:
    """What to write about one claimed task; the settler applies it, fenced."""

    task: ClaimedTask
    label: str
    state: str
    result: Any = None
    error: dict[str, Any] | None = None
    delay: float | None = None
    attempt_reset: bool = False
    attempt_refund: bool = False
    checkpoint: Any = None
    save_checkpoint: bool = False
    # Suspensions: "signal" (wait_signal names it) or "child", and the timeout.
    wait_reason: str | None = None
    wait_signal: str | None = None
    wait_seconds: float | None = None
    runtime: float | None = None
    encoded: str | None = None  # as_row() as JSON, once the settler has encoded it
    # The state an atomic attempt's own transaction wrote with this outcome (it is
    # committed): the settler only accounts for it.
    written: str | None = None
    # The attempt's log records, with TASK_LOGS (task_logs.take: records, dropped,
    # bytes, task_bytes): stored in the settlement's transaction (task_logs.store).
    logs: dict[str, Any] | None = field(default=None, repr=False)
    # The exception the attempt ended with, for the log record of its settlement (and so
    # for error reporters such as Sentry): never part of the row, never JSON-encoded.
    exc: BaseException | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # An error that error_entry made from an exception (it has a traceback) keeps
        # that exception: error dicts are copied on their way here, the task is not.
        if self.exc is None and self.error is not None and self.error.get("traceback"):
            self.exc = self.task.raised

    def as_row(self) -> dict[str, Any]:
        """The settle statement's row (one element of its JSON array). Values that are
        None, and flags that are false, are left out: jsonb_to_recordset reads a missing
        key as NULL, as it reads a JSON null, and the statement takes a NULL flag as
        false. A success's row is then six keys instead of fifteen, for the settler to
        encode and for the server to parse. (A result or checkpoint of ``False`` is a
        value, and is kept.)"""
        t = self.task
        row = {
            "id": t.id,
            "attempt": t.attempt,
            "token": t.lease_token,
            "label": self.label,
            "state": self.state,
        }
        for key, value in (
            ("result", self.result),
            ("error", self.error),
            ("delay", self.delay),
            ("checkpoint", self.checkpoint),
            ("wait_reason", self.wait_reason),
            ("wait_signal", self.wait_signal),
            ("wait_seconds", self.wait_seconds),
        ):
            if value is not None:
                row[key] = value
        for flag, value in (
            ("attempt_reset", self.attempt_reset),
            ("attempt_refund", self.attempt_refund),
            ("save_checkpoint", self.save_checkpoint),
        ):
            if value:
                row[flag] = True
        return row


def clean_text(text: str, limit: int) -> str:
    """Text that PostgreSQL's jsonb can store: NUL and lone surrogates escaped, size capped."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit} characters cut]"
    return text


def error_entry(task: ClaimedTask, exc: BaseException, kind: str | None = None) -> dict[str, Any]:
    """The stored error of an attempt that ended with ``exc``. The exception itself stays
    on the task (``task.raised``) for the outcome's log record, never in the row."""
    task.raised = exc
    try:
        message = str(exc)
    except Exception as broken:  # a __str__ that raises must not lose the outcome
        message = f"<str() of the exception raised {type(broken).__name__}>"
    return {
        "attempt": task.attempt,
        "type": clean_text(kind or f"{type(exc).__module__}.{type(exc).__qualname__}", 500),
        "message": clean_text(message, MAX_MESSAGE),
        "traceback": clean_text("".join(traceback.format_exception(exc)), MAX_TRACEBACK),
    }


def plain_error(task: ClaimedTask, kind: str, message: str) -> dict[str, Any]:
    """A stored error without a traceback; its text capped like error_entry's."""
    return {
        "attempt": task.attempt,
        "type": clean_text(kind, 500),
        "message": clean_text(message, MAX_MESSAGE),
        "traceback": None,
    }


def succeeded(task: ClaimedTask, result: Any, runtime: float | None) -> Outcome:
    """The result is encrypted for an encrypted task (in the process that ran it)."""
    if task.encrypted:
        try:
            result = encryption.seal(result)
        except EncryptionError as exc:
            return unsealable(task, "result", exc)
    return Outcome(task, SUCCESS, "succeeded", result=result, runtime=runtime)


def failed(
    task: ClaimedTask,
    error: dict[str, Any],
    label: str = FAILURE,
    retry_delay: float | None = None,
    retryable: bool = True,
) -> Outcome:
    """A failed attempt: back to pending after the backoff, or dead-lettered if spent."""
    error = {**error, "outcome": label}
    if retryable and task.attempt < task.max_attempts:
        if retry_delay is None:
            retry_delay = backoff(task)
        return Outcome(task, label, "pending", error=error, delay=retry_delay)
    return Outcome(task, label, "failed", error=error)


def raised(task: ClaimedTask, exc: BaseException) -> Outcome:
    """A handler raised ``exc`` (none of the exceptions that steer the queue): retried
    after the backoff, unless the exception rules frozen on the row (``retry_on``,
    ``discard_on``: retry.py) fail it at once."""
    error = error_entry(task, exc)
    rule = exception_rule(task.retry_policy, type(exc))
    if rule is None:
        return failed(task, error)
    return failed(task, {**error, "rule": rule}, retryable=False)


def backoff(task: ClaimedTask) -> float:
    """The delay before the next attempt, by the policy frozen on the row at enqueue.

    A policy the row cannot express (written by hand or by an old version) falls back to
    the current default, with a warning: a bad row must never lose its outcome.
    """
    try:
        return RetryPolicy.from_value(backoff_fields(task.retry_policy)).delay(task.attempt)
    except (TypeError, ValueError) as exc:
        logger.warning(
            "%s: the stored retry policy is invalid (%s); using DEFAULT_BACKOFF",
            task.log_prefix(),
            exc,
        )
        return RetryPolicy.from_value(get_settings().DEFAULT_BACKOFF).delay(task.attempt)


def undecryptable(task: ClaimedTask, message: str) -> Outcome:
    """An encrypted row whose payloads no key of ENCRYPTION_KEYS decrypts (the key was
    removed, or this worker lacks it): a failed attempt, retried after the backoff (a
    worker that holds the key may take it) and failed once the attempts are spent. The
    row is not touched beyond that: its ciphertext stays, to run once the key is back."""
    return failed(task, plain_error(task, "EncryptionError", message))


def unsealable(task: ClaimedTask, what: str, exc: EncryptionError) -> Outcome:
    """An encrypted task's result or checkpoint that could not be encrypted (its keys
    changed while it ran): never written in clear; a failed attempt instead."""
    return failed(
        task, plain_error(task, "EncryptionError", f"the {what} could not be encrypted: {exc}")
    )


def unrunnable(task: ClaimedTask, kind: str, message: str) -> Outcome:
    """The stored call or the returned value can never work: fail now, no retry."""
    return failed(task, plain_error(task, kind, message), retryable=False)


def snoozed(task: ClaimedTask, delay: float) -> Outcome:
    return Outcome(task, SNOOZED, "pending", delay=delay, attempt_refund=True)


def continued(task: ClaimedTask, checkpoint: Any, save: bool) -> Outcome:
    if task.encrypted:
        try:
            checkpoint = encryption.seal(checkpoint)
        except EncryptionError as exc:
            return unsealable(task, "checkpoint", exc)
    return Outcome(
        task,
        CONTINUED,
        "pending",
        delay=0,
        attempt_reset=True,
        checkpoint=checkpoint,
        save_checkpoint=save,
    )


def suspended(
    task: ClaimedTask,
    reason: str,
    signal: str | None,
    timeout: float | None,
    checkpoint: Any,
    save: bool,
) -> Outcome:
    if task.encrypted:
        try:
            checkpoint = encryption.seal(checkpoint)
        except EncryptionError as exc:
            return unsealable(task, "checkpoint", exc)
    return Outcome(
        task,
        SUSPENDED,
        "waiting",
        attempt_refund=True,
        checkpoint=checkpoint,
        save_checkpoint=save,
        wait_reason=reason,
        wait_signal=signal,
        wait_seconds=timeout,
    )


def cancelled(task: ClaimedTask, error: dict[str, Any]) -> Outcome:
    return Outcome(task, CANCELLED, "cancelled", error={**error, "outcome": CANCELLED})


def killed_on_cancel(task: ClaimedTask) -> Outcome:
    return cancelled(
        task,
        plain_error(
            task,
            "Cancelled",
            "cancelled with hard=True: the handler's process was killed",
        ),
    )


def timed_out(task: ClaimedTask, message: str) -> Outcome:
    """The attempt overran its timeout: judged as a TimeoutError by ``discard_on`` only
    (a retry_on list that leaves TimeoutError out does not stop timeouts retrying)."""
    error = plain_error(task, "TimeoutError", message)
    rule = exception_rule(task.retry_policy, TimeoutError, timeout=True)
    if rule is None:
        return failed(task, error, label=TIMEOUT)
    return failed(task, {**error, "rule": rule}, label=TIMEOUT, retryable=False)


def abandoned(task: ClaimedTask, message: str) -> Outcome:
    """A written-off handler still running when its process exits: settled as a timeout,
    and due again no sooner than ``RELEASE_DELAY`` after the write, as a release is. The
    process exits right after the write (its handler threads die with it), so the next
    run never overlaps the abandoned one."""
    outcome = timed_out(task, message)
    if outcome.state == "pending":
        outcome.delay = max(outcome.delay or 0.0, RELEASE_DELAY)
    return outcome


def expired_before_start(task: ClaimedTask) -> Outcome:
    """A claimed task held ready (a prefetch, a busy slot) whose lease lapsed before its
    handler could start (the process stalled past the lease): not run, since the sweep
    may already have handed it to another worker. Written as the sweep would (fenced: if
    the sweep did recover it, nothing is written): pending again, or failed when this was
    the last attempt."""
    error = {
        **plain_error(
            task,
            "LeaseExpired",
            "the lease expired while the task waited to start in this worker (the process "
            "stalled for longer than the lease); it was not run here",
        ),
        "outcome": LOST,
    }
    state = "pending" if task.attempt < task.max_attempts else "failed"
    return Outcome(task, LOST, state, error=error, delay=0 if state == "pending" else None)


def fenced(task: ClaimedTask) -> Outcome:
    """An atomic attempt's commit found its lease gone (it lapsed, the sweep recovered
    it, another worker holds the task): its transaction was rolled back, so nothing the
    handler wrote is kept. Written as the sweep would write a lapsed lease (fenced on the
    token: if the sweep did recover it, nothing is written): pending again, or failed
    when this was the last attempt."""
    error = {
        **plain_error(
            task,
            "LeaseLost",
            "the attempt's lease was no longer held when its atomic transaction was to "
            "commit (it expired, was recovered, or another worker holds the task): the "
            "transaction was rolled back, and none of the handler's writes were kept",
        ),
        "outcome": LOST,
    }
    state = "pending" if task.attempt < task.max_attempts else "failed"
    return Outcome(task, LOST, state, error=error, delay=0 if state == "pending" else None)


def released(task: ClaimedTask) -> Outcome:
    """Shutdown gave up on a running handler: hand the task back, attempt not refunded.

    On the final attempt there is nothing to hand back to; the task dead-letters with an
    error saying why, so the dead letter is never unexplained.
    """
    if task.attempt >= task.max_attempts:
        error = plain_error(
            task, "WorkerShutdown", "the worker shut down while the final attempt was running"
        )
        return Outcome(task, RELEASED, "failed", error={**error, "outcome": RELEASED})
    return Outcome(task, RELEASED, "pending", delay=RELEASE_DELAY)
