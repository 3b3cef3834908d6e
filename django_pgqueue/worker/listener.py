"""The listener: one LISTEN connection per process; a wake-up for one of this worker's
queues wakes the claimer. Notifications are best-effort (the claimer also polls), so
after a reconnect the claimer is woken once in case one was missed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django_pgqueue.worker.connection import CONNECTION_ERRORS, Backoff, connect

logger = logging.getLogger("django_pgqueue.worker")

CHANNEL = "pgqueue"


class Listener:
    name = "listener"

    def __init__(self, alias: str, queues: list[str], wake: Callable[[], None]) -> None:
        self.alias = alias
        self.queues = set(queues)
        self.wake = wake
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pgqueue-listener", daemon=True)
        self.ready = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(3)

    def _run(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                with connect(self.alias) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if backoff.failures:
                        logger.info("listener: reconnected")
                    backoff.reset()
                    self.ready.set()
                    self.wake()
                    while not self._stop.is_set():
                        for notification in conn.notifies(timeout=0.5):
                            if notification.payload in self.queues:
                                self.wake()
            except CONNECTION_ERRORS as exc:
                self.ready.clear()
                delay = backoff.next_delay()
                logger.warning(
                    "listener: connection lost (%s); reconnecting in %.2fs",
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                    delay,
                )
                self._stop.wait(delay)
