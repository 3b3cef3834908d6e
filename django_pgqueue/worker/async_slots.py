"""Async slots: ``async def`` handlers awaited on the worker's event loop, no thread each.

An I/O-bound handler (an HTTP call, ``asyncio.sleep``) spends its time awaiting. Giving
each one a thread slot would cap a worker at CONCURRENCY of them; here the claimer fills
``ASYNC_CONCURRENCY`` async slots with claims of the async tasks only, and each claimed
task becomes one coroutine on the loop (asyncio_runner.py). A slot is free again when
its coroutine has produced its outcome; the outcome goes to the settler like a thread
slot's.

What is the same as for a thread slot: the lease (the heartbeat renews every claimed
task, whatever runs it), the timeout (``asyncio.wait_for`` from the attempt's deadline,
so the task is cancelled at its deadline and settled as a timeout), cancellation
(``context.should_stop()`` and ``cancel_requested``), and shutdown (running tasks get
the grace period, then their leases are released and the process exits).
What differs: a handler that blocks the loop (a sync call inside ``async def``) stalls
every async slot of the process, and the ORM through ``sync_to_async`` runs in one
thread per process (asgiref's), so ORM-heavy handlers belong in thread slots.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from django_pgqueue.worker.asyncio_runner import AsyncRunner
from django_pgqueue.worker.claimed import ClaimedTask
from django_pgqueue.worker.execution import execute_async
from django_pgqueue.worker.outcomes import Outcome


class AsyncSlots:
    def __init__(
        self,
        size: int,
        runner: AsyncRunner,
        database: str,
        *,
        on_outcome: Callable[[Outcome], None],
        changed: threading.Condition,
        stale: Callable[[ClaimedTask], Outcome | None] = lambda task: None,
    ) -> None:
        # The outcome of a task whose lease lapsed before it could start (worker.py).
        self._stale = stale
        self.size = size
        self.capacity = size  # no prefetch: a free async slot starts a task at once
        self._runner = runner
        self._database = database
        self._on_outcome = on_outcome
        self._free = size
        # Shared with the thread slots: the claimer waits for either kind to free up.
        self._free_changed = changed
        self._running: dict[ClaimedTask, asyncio.Task] = {}

    def _available(self) -> int:
        return self._free

    def free(self) -> int:
        with self._free_changed:
            return self._free

    def submit(self, tasks: list[ClaimedTask], overflow: bool = False) -> None:
        with self._free_changed:
            if len(tasks) > self._free and not overflow:
                raise RuntimeError("claimed more async tasks than free async slots")
            self._free -= len(tasks)
        for task in tasks:
            asyncio.run_coroutine_threadsafe(self._run(task), self._runner.loop)

    async def _run(self, task: ClaimedTask) -> None:
        if task.picked_up is not None:
            task.picked_up.set()
        task.mark_started()
        self._running[task] = asyncio.current_task()
        try:
            outcome = self._stale(task) or await execute_async(task, self._database)
        finally:
            self._running.pop(task, None)
        try:
            self._on_outcome(outcome)
        finally:
            with self._free_changed:
                self._free += 1
                self._free_changed.notify_all()

    def busy(self) -> list[ClaimedTask]:
        return list(self._running)

    def cancel(self, task: ClaimedTask) -> bool:
        """A hard cancel: unlike a thread, a coroutine can be interrupted. Its handler
        sees CancelledError at its current await; the attempt ends ``cancelled``."""
        running = self._running.get(task)
        if running is None:
            return False
        self._runner.loop.call_soon_threadsafe(running.cancel)
        return True

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass  # the running coroutines end with the loop (see Worker._shutdown)
