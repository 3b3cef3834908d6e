"""Recycling: a process that has run enough tasks, or grown too big, makes way for a new one.

Handlers that leak (a cache that only grows, a library that keeps every object it
saw) make a long-lived process grow until the kernel's OOM killer ends it in the middle
of a task. A process that exits on its own terms, between tasks, loses nothing:

- thread execution: the worker process (``MAX_TASKS``, ``MAX_MEMORY``) stops claiming,
  finishes every task it holds, and exits with status 0: its process manager starts it
  again, or the supervisor (``--processes N``) replaces it (worker.py);
- process execution: a slot's handler process (``MAX_TASKS_PER_CHILD``,
  ``MAX_MEMORY_PER_CHILD``) sends its last outcome and exits; the slot starts a new
  one (prefork.py).

Memory is the resident set size in KiB, as Celery's ``--max-memory-per-child`` counts it.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from pathlib import Path

_STATM = Path("/proc/self/statm")
_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def resident_kib() -> int:
    """This process's resident memory in KiB: now on Linux (/proc/self/statm), its peak
    elsewhere (getrusage), which for a growing process is the same."""
    try:
        return int(_STATM.read_text().split()[1]) * _PAGE_KIB
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak // 1024 if sys.platform == "darwin" else peak  # macOS counts bytes


class Recycling:
    """When a process should make way: after ``max_tasks`` tasks, or once its resident
    memory is above ``max_memory`` KiB (either None: no such limit)."""

    def __init__(self, max_tasks: int | None, max_memory: int | None) -> None:
        self.max_tasks = max_tasks
        self.max_memory = max_memory
        self.ran = 0
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return self.max_tasks is not None or self.max_memory is not None

    def count(self) -> None:
        """One more task ran (its outcome is known)."""
        with self._lock:
            self.ran += 1

    def reason(self) -> str | None:
        """Why the process should make way now, in words; None if it should not."""
        if self.max_tasks is not None and self.ran >= self.max_tasks:
            return f"it has run {self.ran} tasks (the limit is {self.max_tasks})"
        if self.max_memory is not None:
            resident = resident_kib()
            if resident > self.max_memory:
                return (
                    f"its resident memory is {resident:,} KiB, above the limit of "
                    f"{self.max_memory:,} KiB"
                )
        return None
