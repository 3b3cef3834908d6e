"""The prefork pool: every handler runs in a child process, so it can be stopped.

A thread cannot be stopped: in thread mode a handler past its timeout keeps running
while its retry starts elsewhere. With ``EXECUTION = "process"`` each slot owns one
pre-started child process (started with ``spawn.start_child``: a fresh interpreter with
Django set up, never the parent's script), and the slot thread only waits for it:

* The slot thread sends the claimed task to an idle child (one JSON line on a pipe) and
  waits for its outcome (one JSON line back) until the task's deadline plus
  ``DEADLINE_MARGIN``.
* Past that, or on a hard cancel (``kill(lease)``, from the heartbeat), the child is
  killed: told to terminate (the running sync handler gets an exception, so its
  ``finally`` blocks run), then SIGKILLed if it is still alive ``kill_grace`` seconds
  later. The slot thread reaps it, starts a replacement, and only then returns the
  outcome (``timed_out`` / ``killed_on_cancel``): the attempt is settled, and the retry
  can start, only once the handler is dead. No second run overlaps it.
* A child that dies on its own (a segfault, ``os._exit``, the OOM killer) fails that
  attempt ("the handler's process died with signal 11 (SIGSEGV)") and is replaced.
* A soft cancel seen by the heartbeat is passed on over the pipe: the handler sees
  ``context.cancel_requested`` as in thread mode.
* At shutdown, ``kill_running()`` kills the children of unfinished handlers and waits
  until they are gone; the worker then releases their tasks.
* Recycling (``MAX_TASKS_PER_CHILD``, ``MAX_MEMORY_PER_CHILD``; recycle.py): a child
  past its limit after a task sends that task's outcome marked ``recycle`` and exits
  with status 0; the slot thread starts a new child. A task given to a child that is
  still setting Django up waits for it, and its timeout counts from then.

A child exits as soon as its task pipe reaches end of file: when the worker closes it
(``stop()``), and when the worker dies, whatever its handler was doing. Signals meant
for the whole process group (Ctrl-C in a terminal, systemd's control-group SIGTERM) are
ignored by the children: the worker's graceful shutdown decides when handlers stop.

The child's side is ``run_child``, which runs ``execution.execute`` exactly as a slot
thread does in thread mode.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from django_pgqueue.tasking.registry import registry
from django_pgqueue.worker import outcomes, remote_error, task_logs
from django_pgqueue.worker.asyncio_runner import AsyncRunner
from django_pgqueue.worker.claimed import ClaimedTask, Lease
from django_pgqueue.worker.execution import execute
from django_pgqueue.worker.logging import (
    configure_logging,
    configured_format,
    configured_level,
    task_fields,
)
from django_pgqueue.worker.outcomes import Outcome
from django_pgqueue.worker.recycle import Recycling
from django_pgqueue.worker.spawn import start_child
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")

# How far past its deadline a handler's process may run before it is killed: enough
# for an async handler's own timeout (asyncio.wait_for in the child) to report first.
DEADLINE_MARGIN = 0.5
# How often a waiting slot thread passes on cancel requests and checks the deadline.
_TICK = 0.2
# How long the pool's children may take to set Django up when the worker starts.
STARTUP_TIMEOUT = 60.0

# Why the parent ends a child (its ``verdict``).
_TIMEOUT = "timeout"
_CANCELLED = "cancelled"
_SHUTDOWN = "shutdown"

# The child's exit code once its handler was terminated on the worker's order.
_EXIT_TERMINATED = 128 + signal.SIGTERM

_TASK_DATETIMES = tuple(f.name for f in fields(ClaimedTask) if f.type == "datetime")
_TASK_FIELDS = tuple(
    f.name
    for f in fields(ClaimedTask)
    if f.name
    not in ("received_monotonic", "started_monotonic", "context", "raised", "picked_up", "logs")
)
# The exception crosses as a description (remote_error.py), beside the outcome's fields.
_OUTCOME_FIELDS = tuple(f.name for f in fields(Outcome) if f.name not in ("task", "exc"))


class _ChildGone(Exception):
    """The child closed its outcome pipe or exited."""


class _Child:
    """The parent's handle on one child: its process, its two pipes, what it runs.

    Only the thread that holds the child (the slot thread running a task on it, or
    ``start``/``stop`` while it is idle) reads its pipe or closes it.
    """

    def __init__(self, proc: subprocess.Popen[bytes], to_child: int, from_child: int) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._to_child: int | None = to_child
        self._from_child: int | None = from_child
        self._poller = select.poll()
        self._poller.register(from_child, select.POLLIN)
        self._buffer = bytearray()
        self._send_lock = threading.Lock()
        self.ready = False
        self.lease: Lease | None = None
        self.verdict: str | None = None
        self.terminate_sent_at: float | None = None
        # Why the child exits after the outcome it just sent (recycle.py); None: it stays.
        self.recycle: str | None = None

    def send(self, message: dict[str, Any]) -> None:
        data = memoryview((json.dumps(message, separators=(",", ":")) + "\n").encode())
        with self._send_lock:
            if self._to_child is None:
                raise BrokenPipeError(f"the pipe to process {self.pid} is closed")
            while data:
                data = data[os.write(self._to_child, data) :]

    def order_terminate(self) -> None:
        """Tell the child to stop its handler; ``wait_exit`` SIGKILLs it after the grace."""
        if self.terminate_sent_at is not None:
            return
        self.terminate_sent_at = time.monotonic()
        with contextlib.suppress(OSError):  # already gone
            self.send({"terminate": True})

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or None if none came within ``timeout``; raises _ChildGone."""
        end = time.monotonic() + timeout
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                message = json.loads(self._buffer[:newline])
                del self._buffer[: newline + 1]
                if message.get("ready"):
                    self.ready = True
                    continue
                return message
            if not self._poller.poll(max(0.0, end - time.monotonic()) * 1000):
                # A process the handler forked may hold the pipe open: ask the kernel.
                if self.proc.poll() is not None:
                    raise _ChildGone
                return None
            data = os.read(self._from_child, 65536)
            if not data:
                raise _ChildGone
            self._buffer += data

    def wait_exit(self, grace: float) -> None:
        """Wait for the child to exit; SIGKILL it once ``grace`` has passed since it was
        told to terminate (or from now, if it was not)."""
        told = self.terminate_sent_at or time.monotonic()
        try:
            self.proc.wait(max(0.0, told + grace - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        with self._send_lock:
            for fd in (self._to_child, self._from_child):
                if fd is not None:
                    os.close(fd)
            self._to_child = self._from_child = None

    def how_it_died(self) -> str:
        code = self.proc.returncode
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            hint = " (the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            return f"died with signal {-code} ({name}){hint}"
        return f"exited with code {code}"


class PreforkPool:
    """One child process per slot; ``execute`` is what a slot thread calls."""

    def __init__(
        self,
        size: int,
        database: str,
        kill_grace: float,
        stats: WorkerStats,
        max_tasks: int | None = None,
        max_memory: int | None = None,
    ) -> None:
        self.size = size
        self.database = database
        self.kill_grace = kill_grace
        self._stats = stats
        # Each child's recycling limits (MAX_TASKS_PER_CHILD, MAX_MEMORY_PER_CHILD).
        self.max_tasks = max_tasks
        self.max_memory = max_memory
        # None: a slot whose process could not be replaced; its next task tries again.
        self._idle: queue.SimpleQueue[_Child | None] = queue.SimpleQueue()
        self._busy: dict[Lease, _Child] = {}
        self._children: set[_Child] = set()
        self._lock = threading.Lock()
        self._closing = False
        # The children set their logging up as this process did (from the same LOGGING).
        self._log_level = configured_level()

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        """Start the children and wait until each has set Django up."""
        started = [self._spawn() for _ in range(self.size)]
        deadline = time.monotonic() + STARTUP_TIMEOUT
        try:
            for child in started:
                self._wait_ready(child, deadline)
        except RuntimeError:
            self.stop()
            raise
        for child in started:
            self._idle.put(child)
        logger.info(
            "prefork pool: %d handler processes ready (pids %s)",
            self.size,
            ",".join(str(c.pid) for c in started),
        )

    @staticmethod
    def _wait_ready(child: _Child, deadline: float) -> None:
        try:
            while not child.ready:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(
                        f"handler process {child.pid} did not finish setting Django up "
                        f"within {STARTUP_TIMEOUT:g}s"
                    )
                child.receive(min(left, _TICK))
        except _ChildGone:
            child.proc.wait()
            raise RuntimeError(
                f"handler process {child.pid} {child.how_it_died()} while setting Django "
                "up; its error is in the log above (with EXECUTION = 'process' every "
                "handler process imports the settings and the task modules itself)"
            ) from None

    def stop(self) -> None:
        """Close the idle children's pipes (each exits at once) and reap them.

        Claims not yet started are never started from now on.
        """
        with self._lock:
            self._closing = True
            idle = [c for c in self._children if c.lease is None]
            self._children.difference_update(idle)
        for child in idle:
            child.close()
        for child in idle:
            child.wait_exit(self.kill_grace)

    def kill_running(self) -> None:
        """Shutdown: kill the children of running handlers; return once they are gone.

        Their slot threads never return (the worker releases these tasks itself), and
        claims not yet started are never started: the worker releases them too.
        """
        with self._lock:
            self._closing = True
            busy = list(self._busy.items())
            for _, child in busy:
                child.verdict = child.verdict or _SHUTDOWN
        for _, child in busy:
            child.order_terminate()
        for lease, child in busy:
            child.wait_exit(self.kill_grace)
            logger.warning("%s: its handler's process %s was killed at shutdown", lease, child.pid)

    def kill(self, lease: Lease) -> None:
        """A hard cancel: kill the child running ``lease`` (its slot thread settles it)."""
        with self._lock:
            child = self._busy.get(lease)
            if child is None or child.verdict is not None:
                return
            child.verdict = _CANCELLED
        logger.warning("%s: cancelled with hard=True; killing process %s", lease, child.pid)
        child.order_terminate()

    # -- running one task -------------------------------------------------------------
    def execute(self, task: ClaimedTask) -> Outcome:
        """Run ``task`` in an idle child and return its outcome (never raises)."""
        try:
            child = self._checkout(task)
        except OSError as exc:
            message = f"could not start a process to run the handler: {exc}"
            logger.error("%s: %s", task.log_prefix(), message, extra=task_fields(task))
            return outcomes.failed(task, outcomes.plain_error(task, "HandlerProcessDied", message))
        if child is None:
            return outcomes.cancelled(
                task,
                outcomes.plain_error(
                    task, "Cancelled", "cancelled with hard=True before its handler started"
                ),
            )
        outcome: Outcome | None = None
        try:
            if not child.ready:
                self._await_ready(child, task)
            child.send({"task": _task_message(task)})
            outcome = self._wait(child, task)
        except (_ChildGone, OSError):
            pass
        with self._lock:
            self._busy.pop(task.lease, None)
            child.lease = None
            verdict = child.verdict
        if verdict is None and outcome is not None:
            if child.recycle is None:
                self._idle.put(child)
            else:
                self._recycled(child)
            return outcome
        if verdict is not None:
            child.order_terminate()
        child.wait_exit(self.kill_grace)
        with self._lock:
            self._children.discard(child)
        child.close()
        if verdict == _SHUTDOWN:
            self._park()
        self._replace()
        if outcome is not None:  # the handler finished before the kill landed
            return outcome
        return self._verdict_outcome(task, child, verdict)

    def _checkout(self, task: ClaimedTask) -> _Child | None:
        """An idle child, now running ``task``; None if a hard cancel was requested
        while it waited for a slot (cancel_hard alone, left by an older release's
        retry, is none). Parks once the pool is closing."""
        child = self._idle.get()
        if child is None:
            try:
                child = self._spawn()
            except OSError:
                self._idle.put(None)
                raise
        with self._lock:
            closing, cancelled = self._closing, task.cancel_requested and task.cancel_hard
            if not closing and not cancelled:
                child.lease = task.lease
                self._busy[task.lease] = child
                return child
        self._idle.put(child)
        if closing:
            self._park()
        return None

    def _await_ready(self, child: _Child, task: ClaimedTask) -> None:
        """Wait until a new child has set Django up (it replaced a recycled or killed
        one), then restart the task's clock: the wait is the slot's, not the handler's."""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not child.ready:
            with self._lock:
                if child.verdict is not None:  # a hard cancel meanwhile
                    raise _ChildGone
            if time.monotonic() >= deadline:
                raise _ChildGone
            child.receive(_TICK)
        task.mark_started()

    def _recycled(self, child: _Child) -> None:
        """The child exits after the outcome it sent: reap it, start its successor."""
        logger.info(
            "handler process %s is recycled: %s; starting a new one for its slot",
            child.pid,
            child.recycle,
        )
        self._stats.incr("handler_processes_recycled")
        child.wait_exit(self.kill_grace)
        with self._lock:
            self._children.discard(child)
        child.close()
        self._replace()

    def _wait(self, child: _Child, task: ClaimedTask) -> Outcome | None:
        """The child's outcome, or None once the parent decided to kill it."""
        deadline = task.deadline_monotonic
        if deadline is not None:
            deadline += DEADLINE_MARGIN
        cancel_sent = task.cancel_requested
        while True:
            wait = _TICK if deadline is None else min(_TICK, deadline - time.monotonic())
            message = child.receive(max(0.0, wait))
            if message is not None:
                outcome = Outcome(task=task, **message["outcome"])
                outcome.exc = _rebuilt(message.get("exc"), task)
                child.recycle = message.get("recycle")
                return outcome
            with self._lock:
                if child.verdict is not None:
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    child.verdict = _TIMEOUT
                    return None
            if task.cancel_requested and not cancel_sent:
                child.send({"cancel": True})
                cancel_sent = True

    def _verdict_outcome(self, task: ClaimedTask, child: _Child, verdict: str | None) -> Outcome:
        if verdict is None:
            self._stats.incr("handler_processes_died")
            when = "while it ran" if child.ready else "while it set Django up"
            message = f"the handler's process {child.pid} {child.how_it_died()} {when}"
            logger.error(
                "%s: %s; starting a replacement",
                task.log_prefix(),
                message,
                extra=task_fields(task, outcome=outcomes.FAILURE),
            )
            return outcomes.failed(task, outcomes.plain_error(task, "HandlerProcessDied", message))
        self._stats.incr("handler_processes_killed")
        if verdict == _CANCELLED:
            return outcomes.killed_on_cancel(task)
        if child.proc.returncode == -signal.SIGKILL:
            how = f"SIGKILL: it was still running {self.kill_grace:g}s after it was told to stop"
        else:
            how = "it stopped when told to"
        logger.error(
            "%s overran its timeout of %gs; its process %s was killed (%s)",
            task.log_prefix(),
            task.timeout,
            child.pid,
            how,
            extra=task_fields(task, outcome=outcomes.TIMEOUT),
        )
        return outcomes.timed_out(
            task,
            f"the attempt exceeded its timeout of {task.timeout:g}s; its process was "
            f"killed ({how})",
        )

    def _spawn(self) -> _Child:
        task_read, task_write = os.pipe()
        outcome_read, outcome_write = os.pipe()
        try:
            proc = start_child(
                "django_pgqueue.worker.prefork.run_child",
                {
                    "database": self.database,
                    "task_fd": task_read,
                    "outcome_fd": outcome_write,
                    "log_level": self._log_level,
                    "log_format": configured_format(),
                    "max_tasks": self.max_tasks,
                    "max_memory": self.max_memory,
                },
                pass_fds=(task_read, outcome_write),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            os.close(task_write)
            os.close(outcome_read)
            raise
        finally:
            # Only the child holds these ends: its exit is an end of file here, and the
            # end of this process is one there.
            os.close(task_read)
            os.close(outcome_write)
        child = _Child(proc, task_write, outcome_read)
        with self._lock:
            self._children.add(child)
        return child

    def _replace(self) -> None:
        with self._lock:
            if self._closing:
                return
        try:
            child: _Child | None = self._spawn()
        except OSError as exc:
            logger.error(
                "could not start a replacement handler process (%s); this slot's next "
                "task tries again",
                exc,
            )
            child = None
        self._idle.put(child)

    @staticmethod
    def _park() -> None:
        """Never return: the worker is shutting down and releases this slot's task
        itself; an outcome from here would settle the attempt twice."""
        threading.Event().wait()


def _rebuilt(description: dict[str, Any] | None, task: ClaimedTask) -> BaseException | None:
    """The handler's exception for the settlement's log record; never fails the outcome."""
    try:
        return remote_error.rebuild(description)
    except Exception:
        logger.warning(
            "%s: the handler's exception could not be rebuilt for the log",
            task.log_prefix(),
            exc_info=True,
            extra=task_fields(task),
        )
        return None


def _task_message(task: ClaimedTask) -> dict[str, Any]:
    message = {name: getattr(task, name) for name in _TASK_FIELDS}
    for name in _TASK_DATETIMES:
        message[name] = message[name].isoformat()
    # The child's deadline is this one: it counts from the start in the slot (and the
    # claim's time from the claim), not from the pipe.
    now = time.monotonic()
    message["elapsed"] = now - task.received_monotonic
    message["started_elapsed"] = now - (task.started_monotonic or task.received_monotonic)
    return message


# -- the child's side --------------------------------------------------------------------


class _Terminated(BaseException):
    """Raised in a sync handler when the worker kills it (timeout, hard cancel, shutdown).

    A BaseException, so that ``except Exception`` in the handler lets it through and its
    ``finally`` blocks and context managers run on the way out.
    """


@dataclass
class _ChildState:
    running: ClaimedTask | None = None
    terminating: bool = False


def run_child(
    database: str,
    task_fd: int,
    outcome_fd: int,
    log_level: str | None,
    log_format: str = "text",
    max_tasks: int | None = None,
    max_memory: int | None = None,
) -> int:
    """A handler process of the prefork pool, started by ``spawn.start_child``."""
    multiprocessing.current_process().name = f"pgqueue-handler-{os.getpid()}"
    configure_logging(log_level, log_format)
    task_logs.install_from_settings()
    # A process the handler forks or starts must not hold the pool's pipes open.
    os.set_inheritable(task_fd, False)
    os.set_inheritable(outcome_fd, False)
    state = _ChildState()
    signal.signal(signal.SIGINT, _ignore_signal)
    signal.signal(signal.SIGTERM, lambda signum, frame: _on_terminate(state))
    async_runner = AsyncRunner() if any(d.is_async for d in registry.all()) else None
    inbox: queue.SimpleQueue[ClaimedTask] = queue.SimpleQueue()
    threading.Thread(
        target=_read_parent, args=(task_fd, inbox, state), name="pgqueue-pipe", daemon=True
    ).start()
    out = open(outcome_fd, "wb")  # noqa: SIM115 - this process ends with os._exit
    recycling = Recycling(max_tasks, max_memory)
    recycle: str | None = None
    try:
        _write(out, {"ready": True})
        while recycle is None:
            task = inbox.get()
            state.running = task
            outcome = execute(task, database, async_runner)
            state.running = None
            if state.terminating:
                break
            recycling.count()
            recycle = recycling.reason() if recycling else None
            message = {
                "outcome": {n: getattr(outcome, n) for n in _OUTCOME_FIELDS},
                "exc": remote_error.describe(outcome.exc),
            }
            _write(out, {**message, "recycle": recycle} if recycle else message)
    except _Terminated:
        pass
    except BrokenPipeError:
        state.terminating = True  # the worker closed the pipe: it stopped, or died
    sys.stdout.flush()
    logging.shutdown()
    os._exit(0 if recycle is not None else _EXIT_TERMINATED)


def _read_parent(task_fd: int, inbox: queue.SimpleQueue, state: _ChildState) -> None:
    """Tasks go to the main thread; cancel and terminate orders act at once. At end of
    file (the worker closed the pipe, or died) the process exits, whatever runs."""
    latest: ClaimedTask | None = None
    with open(task_fd, "rb") as pipe:
        for line in pipe:
            message = json.loads(line)
            if "task" in message:
                latest = _claimed_task(message["task"])
                inbox.put(latest)
            elif message.get("cancel") and latest is not None:
                latest.request_cancel()  # before or while it runs: it sees it either way
            elif message.get("terminate"):
                state.terminating = True
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
    os._exit(0)


def _on_terminate(state: _ChildState) -> None:
    if not state.terminating:
        return  # not the worker's order (a signal to the whole process group)
    if state.running is None:
        os._exit(_EXIT_TERMINATED)
    raise _Terminated("the worker killed this handler (timeout, hard cancel or shutdown)")


def _ignore_signal(signum: int, frame: object) -> None:
    """SIGINT is for the worker (Ctrl-C reaches the whole process group)."""


def _claimed_task(message: dict[str, Any]) -> ClaimedTask:
    values = {name: message[name] for name in _TASK_FIELDS}
    for name in _TASK_DATETIMES:
        values[name] = datetime.fromisoformat(values[name])
    now = time.monotonic()
    return ClaimedTask(
        **values,
        received_monotonic=now - message["elapsed"],
        started_monotonic=now - message["started_elapsed"],
    )


def _write(out: Any, message: dict[str, Any]) -> None:
    out.write((json.dumps(message, separators=(",", ":")) + "\n").encode())
    out.flush()
