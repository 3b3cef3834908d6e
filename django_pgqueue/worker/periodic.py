"""Base of the worker's background components that do one thing on an interval."""

from __future__ import annotations

import logging
import random
import threading

from django_pgqueue.worker.connection import Session

logger = logging.getLogger("django_pgqueue.worker")


# A fleet-wide duty ticks at most this many times less often in each process than its
# interval: with 10 or more live workers, each sweeps every 10 x SWEEP_INTERVAL.
FLEET_SCALE_CAP = 10


class Fleet:
    """How many live workers the fleet has, as the last heartbeat read it (1 until then)."""

    def __init__(self) -> None:
        self.size = 1


class Periodic:
    """A daemon thread calling ``tick()`` every ``interval`` seconds (jittered +/-10%).

    A component owns its database session, so a slow or broken statement in one never
    blocks another, unless it is given one to share (``session``: the worker's
    maintenance session, for the duties whose statements are short; worker.py).
    ``tick`` errors are logged and the loop carries on.

    A fleet-wide duty (``fleet`` given: the sweeper, the vacuumer, the pruner) is one
    the fleet needs done every ``interval``, not each process: it ticks every
    ``interval`` x the number of live workers, up to FLEET_SCALE_CAP x ``interval``,
    so the fleet's processes share it (each tick's phase is random, so their ticks
    spread over the interval), and the longest gap between two ticks of the fleet stays
    bounded by the cap whatever the fleet's size.
    """

    name = "periodic"

    def __init__(
        self,
        alias: str,
        interval: float,
        fleet: Fleet | None = None,
        session: Session | None = None,
    ) -> None:
        self.interval = interval
        self.fleet = fleet
        self._stop = threading.Event()
        self._owns_session = session is None
        self.session = session or Session(alias, self.name, self._stop)
        self._thread = threading.Thread(target=self._run, name=f"pgqueue-{self.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._owns_session:
            self.session.close()

    def wait_first(self) -> float:
        """Seconds before the first tick."""
        return self.period * random.uniform(0.1, 1.0)

    @property
    def period(self) -> float:
        """Seconds between this process's ticks."""
        return self.interval * (min(self.fleet.size, FLEET_SCALE_CAP) if self.fleet else 1)

    def _run(self) -> None:
        delay = self.wait_first()
        while not self._stop.wait(delay):
            try:
                self.tick()
            except Exception:
                if self._stop.is_set():
                    break
                logger.exception("%s: tick failed; will retry", self.name)
            delay = self.period * random.uniform(0.9, 1.1)

    def tick(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
