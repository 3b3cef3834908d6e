"""Base of the worker's background components that do one thing on an interval."""

from __future__ import annotations

import logging
import random
import threading

from django_pgqueue.worker.connection import Session

logger = logging.getLogger("django_pgqueue.worker")


class Periodic:
    """A daemon thread calling ``tick()`` every ``interval`` seconds (jittered +/-10%).

    Each component owns one database session, so a slow or broken statement in one
    never blocks another. ``tick`` errors are logged and the loop carries on.
    """

    name = "periodic"

    def __init__(self, alias: str, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self.session = Session(alias, self.name, self._stop)
        self._thread = threading.Thread(target=self._run, name=f"pgqueue-{self.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.session.close()

    def wait_first(self) -> float:
        """Seconds before the first tick."""
        return self.interval * random.uniform(0.1, 1.0)

    def _run(self) -> None:
        delay = self.wait_first()
        while not self._stop.wait(delay):
            try:
                self.tick()
            except Exception:
                if self._stop.is_set():
                    break
                logger.exception("%s: tick failed; will retry", self.name)
            delay = self.interval * random.uniform(0.9, 1.1)

    def tick(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
