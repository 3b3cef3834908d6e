"""Counters a worker process keeps about itself (outcomes, leases, write-offs).

``metrics_server.py`` exports them to Prometheus; the worker logs them when it stops.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

Listener = Callable[[str, int], None]


class WorkerStats:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def incr(self, name: str, amount: int = 1) -> None:
        if amount == 0:
            return
        with self._lock:
            self._counts[name] += amount
        for listener in self._listeners:
            listener(name, amount)

    def get(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
