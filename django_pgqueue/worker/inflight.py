"""The set of tasks this process has claimed and not yet settled.

Shared by the claimer (adds), the settler (removes once the row is written), the
heartbeat (renews what is here) and shutdown (releases what is left).
"""

from __future__ import annotations

import threading

from django_pgqueue.worker.execution import ClaimedTask


class InFlight:
    def __init__(self) -> None:
        self._tasks: dict[int, ClaimedTask] = {}
        self._settling: set[int] = set()
        self._lock = threading.Lock()
        self._empty = threading.Condition(self._lock)

    def add(self, tasks: list[ClaimedTask]) -> None:
        with self._lock:
            for task in tasks:
                self._tasks[task.id] = task

    def mark_settling(self, task_id: int) -> None:
        """The handler is done; its outcome is on its way to the database."""
        with self._lock:
            self._settling.add(task_id)

    def remove(self, task_ids: list[int]) -> None:
        with self._lock:
            for task_id in task_ids:
                self._tasks.pop(task_id, None)
                self._settling.discard(task_id)
            if not self._tasks:
                self._empty.notify_all()

    def snapshot(self) -> list[ClaimedTask]:
        with self._lock:
            return list(self._tasks.values())

    def is_settling(self, task_id: int) -> bool:
        with self._lock:
            return task_id in self._settling or task_id not in self._tasks

    def running(self) -> list[ClaimedTask]:
        """Tasks whose handler has not returned yet."""
        with self._lock:
            return [t for i, t in self._tasks.items() if i not in self._settling]

    def __len__(self) -> int:
        with self._lock:
            return len(self._tasks)

    def wait_empty(self, timeout: float) -> bool:
        with self._lock:
            return self._empty.wait_for(lambda: not self._tasks, timeout)
