"""Slots: threads that only run handlers, and the watchdog that writes off stuck ones.

A thread cannot be interrupted. A handler that ignores its deadline keeps its thread;
past ``timeout + grace`` the watchdog writes the slot off: the attempt is settled as a
timeout (so the task is retried elsewhere, visibly, on a counter and in the log), a new
thread takes the slot's place so capacity is not lost, and once too many slots are
written off the process asks to be recycled.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from django_pgqueue.worker.claimed import ClaimedTask
from django_pgqueue.worker.logging import task_fields
from django_pgqueue.worker.outcomes import TIMEOUT, Outcome, timed_out
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")

_STOP = object()

# PREFETCH None (the default): claimed tasks may wait for a slot up to this many times
# the slots, as long as the queue they form is about PREFETCH_WAIT seconds of work.
ADAPTIVE_PREFETCH = 3
PREFETCH_WAIT = 0.1


class _Slot:
    def __init__(self, number: int) -> None:
        self.number = number
        self.lock = threading.Lock()
        self.task: ClaimedTask | None = None
        self.written_off = False
        self.thread: threading.Thread | None = None


class SlotPool:
    def __init__(
        self,
        size: int,
        execute: Callable[[ClaimedTask], Outcome],
        *,
        prefetch: int | None = 0,
        on_outcome: Callable[[Outcome], None],
        stats: WorkerStats,
        timeout_grace: float,
        write_off_limit: int,
        on_recycle: Callable[[], None],
        changed: threading.Condition | None = None,
    ) -> None:
        self.size = size
        # Claimed tasks may wait for a slot (prefetch): bigger claims, fewer commits per
        # task. ``capacity`` is the most the claimer may hold before a slot frees up.
        # prefetch None: adaptive, up to ADAPTIVE_PREFETCH x size (see prefetch_now).
        self.adaptive = prefetch is None
        self.max_prefetch = ADAPTIVE_PREFETCH * size if prefetch is None else prefetch
        self.capacity = size + self.max_prefetch
        self._runtime: float | None = None  # moving average of a handler's seconds
        self._execute = execute
        self._on_outcome = on_outcome
        self._stats = stats
        self._timeout_grace = timeout_grace
        self._write_off_limit = write_off_limit
        self._on_recycle = on_recycle
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._free = self.capacity
        # Shared with the async slots, if any: the claimer waits for either to free up.
        self._free_changed = changed or threading.Condition()
        self._slots: list[_Slot] = []
        self._slots_lock = threading.Lock()
        self._next_number = 0
        self._stopping = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="pgqueue-watchdog", daemon=True)
        self.written_off = 0

    # -- capacity ---------------------------------------------------------------------
    def prefetch_now(self) -> int:
        """How many claimed tasks may wait for a slot now. Fixed when PREFETCH is set;
        adaptive by default: as many as the slots get through in PREFETCH_WAIT seconds
        at the handlers' recent pace (all ADAPTIVE_PREFETCH x size for short tasks,
        none for tasks of PREFETCH_WAIT or longer), CONCURRENCY until a task has run."""
        if not self.adaptive:
            return self.max_prefetch
        if self._runtime is None:
            return min(self.size, self.max_prefetch)
        depth = int(self.size * PREFETCH_WAIT / max(self._runtime, 1e-6))
        return max(0, min(self.max_prefetch, depth))

    def _available(self) -> int:
        """Free places to claim into (the caller holds ``_free_changed``)."""
        return self._free - (self.max_prefetch - self.prefetch_now())

    def free(self) -> int:
        with self._free_changed:
            return self._available()

    def submit(self, tasks: list[ClaimedTask], overflow: bool = False) -> None:
        """Queue claimed tasks for the slots. ``overflow``: tasks recovered from a claim
        whose reply was lost may exceed the free slots; they wait for one."""
        with self._free_changed:
            if len(tasks) > self._free and not overflow:
                raise RuntimeError("claimed more tasks than free slots")
            self._free -= len(tasks)
        for task in tasks:
            self._work.put(task)

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        for _ in range(self.size):
            self._spawn()
        self._watchdog.start()

    def stop(self) -> None:
        """Tell idle threads to exit; running handlers are not interrupted."""
        self._stopping.set()
        with self._slots_lock:
            count = len(self._slots)
        for _ in range(count):
            self._work.put(_STOP)

    def busy(self) -> list[ClaimedTask]:
        with self._slots_lock:
            return [s.task for s in self._slots if s.task is not None and not s.written_off]

    def _spawn(self) -> None:
        with self._slots_lock:
            slot = _Slot(self._next_number)
            self._next_number += 1
            self._slots.append(slot)
        slot.thread = threading.Thread(
            target=self._run, args=(slot,), name=f"pgqueue-slot-{slot.number}", daemon=True
        )
        slot.thread.start()

    def _run(self, slot: _Slot) -> None:
        while True:
            task = self._work.get()
            if task is _STOP:
                return
            task.mark_started()
            with slot.lock:
                slot.task = task
            outcome = self._execute(task)
            self._observe(time.monotonic() - task.started_monotonic)
            with slot.lock:
                slot.task = None
                if slot.written_off:
                    logger.warning(
                        "task %s attempt %s: handler returned after its slot was written off "
                        "(outcome %s discarded; the attempt was already settled as a timeout)",
                        task.id,
                        task.attempt,
                        outcome.label,
                        extra=task_fields(task, outcome=outcome.label),
                    )
                    self._stats.incr("late_return")
                    return
            self._on_outcome(outcome)
            self._freed()

    def _observe(self, seconds: float) -> None:
        """Feed the adaptive prefetch: a moving average over about the last 20 tasks."""
        previous = self._runtime
        self._runtime = seconds if previous is None else previous + (seconds - previous) / 20

    def _freed(self) -> None:
        with self._free_changed:
            self._free += 1
            self._free_changed.notify_all()

    # -- watchdog ---------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stopping.wait(0.5):
            now = time.monotonic()
            with self._slots_lock:
                slots = list(self._slots)
            for slot in slots:
                self._check(slot, now)

    def _check(self, slot: _Slot, now: float) -> None:
        with slot.lock:
            task = slot.task
            if task is None or slot.written_off or task.deadline_monotonic is None:
                return
            if now < task.deadline_monotonic + self._timeout_grace:
                return
            slot.written_off = True
        self.written_off += 1
        self._stats.incr("written_off")
        logger.error(
            "task %s (%s) attempt %s overran its timeout of %gs by more than the %gs grace; "
            "its thread cannot be interrupted, so slot %s is written off (%s of %s allowed) "
            "and the attempt is settled as a timeout. The handler may still be running: "
            "check context.should_stop() in long handlers.",
            task.id,
            task.task_name,
            task.attempt,
            task.timeout,
            self._timeout_grace,
            slot.number,
            self.written_off,
            self._write_off_limit,
            extra=task_fields(
                task, outcome=TIMEOUT, duration=round(now - task.started_monotonic, 6)
            ),
        )
        self._on_outcome(
            timed_out(
                task,
                f"the attempt overran its timeout of {task.timeout:g}s plus "
                f"{self._timeout_grace:g}s grace; its slot was written off",
            )
        )
        with self._slots_lock:
            self._slots.remove(slot)
        if not self._stopping.is_set():
            self._spawn()
        self._freed()
        if self.written_off >= self._write_off_limit:
            self._on_recycle()
