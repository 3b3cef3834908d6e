"""Several worker processes (``runtaskworker --processes N``) under one supervisor.

The supervisor runs no tasks. It starts ``processes`` children with worker/spawn.py:
fresh interpreters that inherit no database connection or lock, and never run the
parent's script again (a ``manage.py`` without a ``__main__`` guard would otherwise start
a supervisor in every child). It replaces a child that dies or recycles itself (a child
whose handler overran timeout + grace writes its slot off and exits, so the stuck thread
dies with it), forwards the first SIGTERM/SIGINT for a graceful stop, and kills the
children on a second signal.

Each child tells the supervisor over a pipe that it is ready once its worker has
started (``Worker.run``'s ``on_started``): Django set up, the task modules imported, the
metrics port bound, the prefork pool (``--execution process``) up, the worker registered
and its components running. A child that exits before that has failed at start-up: it
is started again after a backoff, and when one slot's children fail at start-up
``STARTUP_ATTEMPTS`` times in a row, the supervisor gives up: it stops the other
children and exits with ``EXIT_CHILDREN_CANNOT_START``, naming the exit codes. Such
failures (a broken settings module, a missing dependency, a port in use) do not fix
themselves, and restarting forever would hide them. A child that crashes after it was
ready (a handler that kills its process) is only ever replaced.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from django_pgqueue.worker.connection import Backoff
from django_pgqueue.worker.logging import configure_logging
from django_pgqueue.worker.spawn import start_child
from django_pgqueue.worker.worker import EXIT_RECYCLE, Worker, WorkerOptions

logger = logging.getLogger("django_pgqueue.worker")

# Consecutive start-up failures of one slot after which the supervisor gives up.
STARTUP_ATTEMPTS = 5
# Exit code of a supervisor that gave up because its children cannot start.
EXIT_CHILDREN_CANNOT_START = 1
# A child that ran this long since it was ready resets its slot's restart backoff.
STABLE_SECONDS = 30.0

_READY = b"r"


def run_child(
    index: int,
    options: dict[str, Any],
    log_level: str | None,
    metrics_port: int | None,
    ready_fd: int,
    log_format: str = "text",
    metrics_addr: str = "0.0.0.0",
) -> int:
    """A worker process under the supervisor, started by ``spawn.start_child``."""
    # The name shows in log lines formatted with %(processName)s.
    multiprocessing.current_process().name = f"pgqueue-worker-{index}"
    configure_logging(log_level, log_format)
    worker = Worker(WorkerOptions(**options), supervised=True)
    if metrics_port:
        from django_pgqueue.worker.metrics_server import serve_worker_metrics, watch_worker

        serve_worker_metrics(metrics_port, metrics_addr)
        watch_worker(worker)

    def ready() -> None:
        os.write(ready_fd, _READY)
        os.close(ready_fd)

    return worker.run(on_started=ready)


@dataclass
class _Slot:
    """One of the supervisor's places for a child: the child in it, and its record."""

    index: int
    # What its child runs: the queues of one database (PGQUEUE['DATABASES']).
    options: WorkerOptions
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.5, cap=30.0))
    child: subprocess.Popen[bytes] | None = None
    ready_pipe: int | None = None  # read end, open until the child is ready or gone
    ready_at: float | None = None
    restart_at: float = 0.0
    # Exit codes of the children that failed at start-up since one was last ready.
    failed_starts: list[int] = field(default_factory=list)
    # Pids of those children, to find their errors in the log.
    failed_pids: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        options: WorkerOptions | list[WorkerOptions],
        processes: int,
        log_level: str | None,
        metrics_port: int | None = None,
        log_format: str = "text",
        metrics_addr: str = "0.0.0.0",
    ) -> None:
        """``processes`` children for each of ``options`` (a list: one per database
        whose queues the command serves, each with its ``database`` and queues)."""
        groups = options if isinstance(options, list) else [options]
        self.metrics_port = metrics_port
        self.metrics_addr = metrics_addr
        self.options = groups[0]
        self.processes = processes * len(groups)
        self.log_level = log_level
        self.log_format = log_format
        self._slots = [
            _Slot(index, group)
            for index, group in enumerate(g for g in groups for _ in range(processes))
        ]
        self._stopping = False
        self._signals = 0

    def run(self) -> int:
        """Supervise until a signal (returns 0) or until children cannot start."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            return self._supervise()
        finally:
            self._stop_children()

    def _supervise(self) -> int:
        for slot in self._slots:
            self._start(slot)
        while not self._stopping:
            time.sleep(0.2)
            for slot in self._slots:
                if slot.child is None:
                    if time.monotonic() >= slot.restart_at and not self._stopping:
                        self._start(slot)
                    continue
                pid, returncode = slot.child.pid, slot.child.poll()
                # Read after poll: whatever an exited child wrote is in the pipe by now.
                self._read_ready(slot)
                if returncode is None or self._stopping:
                    continue
                self._on_exit(slot, pid, returncode)
                if len(slot.failed_starts) >= STARTUP_ATTEMPTS:
                    self._give_up(slot)
                    return EXIT_CHILDREN_CANNOT_START
        return 0

    def _start(self, slot: _Slot) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        try:
            child = start_child(
                "django_pgqueue.worker.supervisor.run_child",
                {
                    "index": slot.index,
                    "options": asdict(slot.options),
                    "log_level": self.log_level,
                    # Each child serves its own /metrics: port, port + 1, ...
                    "metrics_port": self.metrics_port + slot.index if self.metrics_port else None,
                    "ready_fd": write_fd,
                    "log_format": self.log_format,
                    "metrics_addr": self.metrics_addr,
                },
                pass_fds=(write_fd,),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        slot.child, slot.ready_pipe, slot.ready_at = child, read_fd, None
        logger.info(
            "started worker process %s (%d of %d)%s",
            child.pid,
            slot.index + 1,
            self.processes,
            f" for database {slot.options.database}" if slot.options.database else "",
        )

    def _read_ready(self, slot: _Slot) -> None:
        if slot.ready_pipe is None:
            return
        try:
            data = os.read(slot.ready_pipe, 1)
        except BlockingIOError:
            return  # still starting
        if data == _READY:
            slot.ready_at = time.monotonic()
            slot.failed_starts.clear()
            slot.failed_pids.clear()
        # Ready, or closed without a word (the child is gone): nothing more will come.
        os.close(slot.ready_pipe)
        slot.ready_pipe = None

    def _on_exit(self, slot: _Slot, pid: int, returncode: int) -> None:
        """Record how the slot's child ended, and when to start the next one."""
        now, ready_at = time.monotonic(), slot.ready_at
        slot.child, slot.ready_at = None, None
        if slot.ready_pipe is not None:
            os.close(slot.ready_pipe)
            slot.ready_pipe = None
        if ready_at is None:
            slot.failed_starts.append(returncode)
            slot.failed_pids.append(pid)
            if len(slot.failed_starts) >= STARTUP_ATTEMPTS:
                return  # no retry: the supervisor gives up (_give_up says why)
            delay = slot.backoff.next_delay()
            slot.restart_at = now + delay
            logger.error(
                "worker process %s (%d of %d) %s before it was ready (its error is above); "
                "start-up failure %d of %d in a row, starting it again in %.1fs",
                pid,
                slot.index + 1,
                self.processes,
                _describe_exit(returncode),
                len(slot.failed_starts),
                STARTUP_ATTEMPTS,
                delay,
            )
            return
        if now - ready_at >= STABLE_SECONDS:
            slot.backoff.reset()
        delay = 0.0 if returncode in (0, EXIT_RECYCLE) else slot.backoff.next_delay()
        slot.restart_at = now + delay
        # Status 0: it stopped on its own terms (MAX_TASKS, MAX_MEMORY: recycle.py).
        logger.log(
            logging.INFO if returncode == 0 else logging.WARNING,
            "worker process %s %s; starting a replacement in %.1fs",
            pid,
            _describe_exit(returncode),
            delay,
        )

    def _give_up(self, slot: _Slot) -> None:
        logger.error(
            "worker process %d of %d failed to start %d times in a row (exit codes %s); "
            "each child's own error is above in this log (pids %s). Stopping the other "
            "worker processes: fix the cause, then start runtaskworker again.",
            slot.index + 1,
            self.processes,
            len(slot.failed_starts),
            ", ".join(_describe_code(code) for code in slot.failed_starts),
            ", ".join(str(pid) for pid in slot.failed_pids),
        )

    def _stop_children(self) -> None:
        """SIGTERM every child, wait for the graceful stops, kill what remains."""
        self._stopping = True
        running = [s.child for s in self._slots if s.child is not None and s.child.poll() is None]
        for child in running:
            child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.options.shutdown_grace + 15
        for child in running:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.error("worker process %s did not stop in time; killing it", child.pid)
                child.kill()
                child.wait()
        for slot in self._slots:
            if slot.ready_pipe is not None:
                os.close(slot.ready_pipe)
                slot.ready_pipe = None

    def _on_signal(self, signum: int, _frame: object) -> None:
        # The main loop notices _stopping within 0.2 s and forwards the stop, so that a
        # child it is starting at this moment is not missed.
        self._signals += 1
        if self._signals > 1:
            logger.warning("second signal: killing worker processes")
            for slot in self._slots:
                if slot.child is not None:
                    slot.child.kill()
            os._exit(1)
        self._stopping = True


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with {returncode}"


def _describe_code(returncode: int) -> str:
    return signal.Signals(-returncode).name if returncode < 0 else str(returncode)
