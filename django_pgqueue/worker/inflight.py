"""The claims this process holds and has not settled yet, keyed by lease.

Shared by the claimer (adds), the settler (removes once the row is written, or the
write was refused), the heartbeat (renews what is here) and shutdown (releases what is
left). Keyed by ``Lease`` (id, attempt, token), never by task id alone: an old run of a
task and a new attempt of it can be in flight here at once, and the refusal of the old
run's outcome must not touch the new one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from django_pgqueue.worker.claimed import ClaimedTask, Lease


class InFlight:
    def __init__(self) -> None:
        self._tasks: dict[Lease, ClaimedTask] = {}
        self._settling: set[Lease] = set()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def add(self, tasks: Iterable[ClaimedTask]) -> None:
        with self._lock:
            for task in tasks:
                self._tasks[task.lease] = task

    def mark_settling(self, lease: Lease) -> None:
        """The handler is done; its outcome is on its way to the database."""
        with self._lock:
            self._settling.add(lease)

    def remove(self, leases: Iterable[Lease]) -> None:
        with self._lock:
            for lease in leases:
                self._tasks.pop(lease, None)
                self._settling.discard(lease)
            self._changed.notify_all()

    def snapshot(self) -> list[ClaimedTask]:
        with self._lock:
            return list(self._tasks.values())

    def get(self, lease: Lease) -> ClaimedTask | None:
        with self._lock:
            return self._tasks.get(lease)

    def is_settling(self, lease: Lease) -> bool:
        with self._lock:
            return lease in self._settling or lease not in self._tasks

    def running(self) -> list[ClaimedTask]:
        """Claims whose handler has not returned yet."""
        with self._lock:
            return [t for lease, t in self._tasks.items() if lease not in self._settling]

    def settling_count(self) -> int:
        with self._lock:
            return len(self._settling)

    def __len__(self) -> int:
        with self._lock:
            return len(self._tasks)

    def wait_below(self, limit: int, timeout: float) -> bool:
        """Block until fewer than ``limit`` claims are held (or ``timeout``)."""
        with self._lock:
            return self._changed.wait_for(lambda: len(self._tasks) < limit, timeout)

    def wait_empty(self, timeout: float) -> bool:
        with self._lock:
            return self._changed.wait_for(lambda: not self._tasks, timeout)
