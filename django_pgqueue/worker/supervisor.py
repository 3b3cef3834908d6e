"""Process mode: several worker processes under one supervisor.

The supervisor runs no tasks. It starts ``processes`` children (fresh interpreters, so
no database connection or lock is inherited across a fork), replaces a child that dies
or recycles itself (a child whose handler overran timeout + grace writes its slot off
and exits, so the stuck thread dies with it), forwards the first SIGTERM/SIGINT for a
graceful stop, and kills the children on a second signal.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from dataclasses import asdict
from typing import Any

from django_pgqueue.worker.connection import Backoff
from django_pgqueue.worker.worker import WorkerOptions

logger = logging.getLogger("django_pgqueue.worker")


def _child_main(options: dict[str, Any], log_level: str, metrics_port: int | None) -> None:
    import django

    django.setup()
    from django_pgqueue.worker.logging import configure_logging
    from django_pgqueue.worker.worker import Worker

    configure_logging(log_level)
    worker = Worker(WorkerOptions(**options), supervised=True)
    if metrics_port:
        from django_pgqueue.metrics import serve_worker_metrics, watch_worker

        serve_worker_metrics(metrics_port)
        watch_worker(worker)
    raise SystemExit(worker.run())


class Supervisor:
    def __init__(
        self,
        options: WorkerOptions,
        processes: int,
        log_level: str,
        metrics_port: int | None = None,
    ) -> None:
        self.metrics_port = metrics_port
        self.options = options
        self.processes = processes
        self.log_level = log_level
        self._ctx = multiprocessing.get_context("spawn")
        self._children: list[multiprocessing.process.BaseProcess | None] = [None] * processes
        self._stopping = False
        self._signals = 0
        self._backoff = Backoff(initial=0.5, cap=30.0)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for index in range(self.processes):
            self._start(index)
        while not self._stopping:
            time.sleep(0.2)
            for index, child in enumerate(self._children):
                if child is not None and not child.is_alive() and not self._stopping:
                    logger.warning(
                        "worker process %s exited with %s; starting a replacement",
                        child.pid,
                        child.exitcode,
                    )
                    if child.exitcode not in (0, 75):
                        time.sleep(self._backoff.next_delay())
                    self._start(index)
        deadline = time.monotonic() + self.options.shutdown_grace + 15
        for child in self._children:
            if child is not None:
                child.join(max(0.1, deadline - time.monotonic()))
                if child.is_alive():
                    logger.error("worker process %s did not stop in time; killing it", child.pid)
                    child.kill()
        return 0

    def _start(self, index: int) -> None:
        child = self._ctx.Process(
            target=_child_main,
            args=(
                asdict(self.options),
                self.log_level,
                # Each child serves its own /metrics: port, port + 1, ...
                self.metrics_port + index if self.metrics_port else None,
            ),
            name=f"pgqueue-worker-{index}",
        )
        child.start()
        self._children[index] = child
        logger.info("started worker process %s (%d of %d)", child.pid, index + 1, self.processes)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals += 1
        if self._signals > 1:
            logger.warning("second signal: killing worker processes")
            for child in self._children:
                if child is not None and child.is_alive():
                    child.kill()
            os._exit(1)
        self._stopping = True
        for child in self._children:
            if child is not None and child.is_alive():
                os.kill(child.pid, signal.SIGTERM)
