"""Slots: threads that only run handlers, and the watchdog that writes off stuck ones.

A thread cannot be interrupted. A handler that ignores its deadline keeps its thread;
past ``timeout + grace`` the watchdog writes the slot off: a new thread takes the
slot's place so capacity is not lost, and the stuck thread is abandoned, visibly, on a
counter and in the log. Its task keeps its lease (it stays in flight, so the heartbeat
renews it): no other run of the task can start while the handler may still run. The
attempt is settled as a timeout when the handler returns, whatever it returned or
raised. A handler still running ``exit_after`` seconds after its write-off, or too
many write-offs, make the process ask to be recycled: it then settles what is still
stuck (``abandon_stuck``) and exits right after that write.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable

from django_pgqueue.worker.claimed import ClaimedTask
from django_pgqueue.worker.logging import task_fields
from django_pgqueue.worker.outcomes import TIMEOUT, Outcome, timed_out
from django_pgqueue.worker.stats import WorkerStats

logger = logging.getLogger("django_pgqueue.worker")

_STOP = object()
# Put on the work queue for each task that goes ahead (SlotPool.submit): it wakes a
# slot, which then takes the task from the front.
_AHEAD = object()

# PREFETCH None (the default): claimed tasks may wait for a slot up to this many times
# the slots, as long as the queue they form is about PREFETCH_WAIT seconds of work.
ADAPTIVE_PREFETCH = 3
PREFETCH_WAIT = 0.1


class _Slot:
    def __init__(self, number: int) -> None:
        self.number = number
        self.lock = threading.Lock()
        self.task: ClaimedTask | None = None
        # monotonic: when the watchdog wrote the slot off (None: it was not).
        self.written_off_at: float | None = None
        # Its written-off attempt was settled (by the handler's return, or by the exit):
        # whoever comes second writes nothing.
        self.settled = False
        self.thread: threading.Thread | None = None


class SlotPool:
    def __init__(
        self,
        size: int,
        execute: Callable[[ClaimedTask], Outcome | list[Outcome]],
        *,
        prefetch: int | None = 0,
        on_outcome: Callable[[Outcome | list[Outcome]], None],
        stats: WorkerStats,
        timeout_grace: float,
        write_off_limit: int,
        on_recycle: Callable[[str], None],
        exit_after: float = 60.0,
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
        self._exit_after = exit_after
        self._on_recycle = on_recycle
        self._recycle_asked = False
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        # Fair tasks (docs/tenants.md) of a key with no task waiting here go ahead of the
        # tasks waiting for a slot: a key whose turn came does not wait behind the
        # prefetched tasks of a busy key. _waiting_keys: tasks waiting per fair key
        # (under _free_changed).
        self._ahead: deque[ClaimedTask] = deque()
        self._waiting_keys: Counter[str] = Counter()
        self._free = self.capacity
        # Shared with the async slots, if any: the claimer waits for either to free up.
        self._free_changed = changed or threading.Condition()
        self._slots: list[_Slot] = []
        # Written-off slots whose handler has not returned: their threads and leases.
        self._stuck: list[_Slot] = []
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
        ahead = set()
        with self._free_changed:
            if len(tasks) > self._free and not overflow:
                raise RuntimeError("claimed more tasks than free slots")
            self._free -= len(tasks)
            for task in tasks:
                if task.fair_key is not None:
                    if not self._waiting_keys[task.fair_key]:
                        ahead.add(task.id)
                    self._waiting_keys[task.fair_key] += 1
        for task in tasks:
            if task.id in ahead:
                self._ahead.append(task)
                self._work.put(_AHEAD)
            else:
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
            return [s.task for s in self._slots if s.task is not None]

    def stuck(self) -> list[ClaimedTask]:
        """The tasks of written-off handlers that have not returned, abandoned or not:
        never released, never waited for at shutdown."""
        with self._slots_lock:
            return [s.task for s in self._stuck if s.task is not None]

    def abandon_stuck(self) -> list[ClaimedTask]:
        """For the exit: the tasks of written-off handlers still running, each marked
        settled so that a handler returning from now on writes nothing. The caller
        settles them (``outcomes.abandoned``) and the process exits right after."""
        with self._slots_lock:
            stuck = list(self._stuck)
        tasks = []
        for slot in stuck:
            with slot.lock:
                if slot.task is None or slot.settled:
                    continue
                slot.settled = True
                tasks.append(slot.task)
        return tasks

    def _spawn(self) -> None:
        with self._slots_lock:
            slot = _Slot(self._next_number)
            self._next_number += 1
            self._slots.append(slot)
        slot.thread = threading.Thread(
            target=self._run, args=(slot,), name=f"pgqueue-slot-{slot.number}", daemon=True
        )
        slot.thread.start()

    def _take(self) -> ClaimedTask:
        """The next task for a slot (or _STOP): one that goes ahead first."""
        while True:
            if self._ahead:
                try:
                    task = self._ahead.popleft()
                    break
                except IndexError:  # another slot took it since
                    pass
            task = self._work.get()
            if task is not _AHEAD:
                break
            # A token: its task is at the front, unless a slot that came free took it.
        if task is not _STOP and task.fair_key is not None:
            with self._free_changed:
                self._waiting_keys[task.fair_key] -= 1
                if not self._waiting_keys[task.fair_key]:
                    del self._waiting_keys[task.fair_key]
        return task

    def _run(self, slot: _Slot) -> None:
        while True:
            task = self._take()
            if task is _STOP:
                return
            if task.picked_up is not None:
                task.picked_up.set()
            task.mark_started()
            with slot.lock:
                slot.task = task
            outcome = self._execute(task)
            self._observe(time.monotonic() - task.started_monotonic)
            with slot.lock:
                slot.task = None
                written_off = slot.written_off_at is not None
                settle = written_off and not slot.settled
                slot.settled = written_off
            if written_off:
                # The slot was replaced at the write-off: this thread ends here.
                with self._slots_lock:
                    self._stuck.remove(slot)
                if settle:
                    self._late_return(task, outcome)
                return
            self._on_outcome(outcome)
            self._freed()

    def _late_return(self, task: ClaimedTask, outcome: Outcome | list[Outcome]) -> None:
        """A written-off handler returned: settle its attempt as the timeout it was."""
        ran = time.monotonic() - task.started_monotonic
        logger.warning(
            "%s: its handler returned %.1fs after its start, after its slot was written "
            "off; the attempt is settled as a timeout (its %s outcome is discarded) and "
            "the task's lease is given up",
            task.log_prefix(),
            ran,
            outcome.label if isinstance(outcome, Outcome) else "batch's",
            extra=task_fields(task, outcome=TIMEOUT, duration=round(ran, 6)),
        )
        self._stats.incr("late_return")
        message = self._overran(task, f"its handler returned {ran:.1f}s after its start")
        for each in task.batch or [task]:  # a batch's every call (worker/batcher.py)
            late = timed_out(each, message)
            if isinstance(outcome, Outcome):  # what the attempt logged, as any attempt's
                late.logs = outcome.logs
            self._on_outcome(late)

    def _overran(self, task: ClaimedTask, then: str) -> str:
        return (
            f"the attempt overran its timeout of {task.timeout:g}s plus "
            f"{self._timeout_grace:g}s grace; its slot was written off and {then}"
        )

    def exit_message(self, task: ClaimedTask) -> str:
        """The error of an attempt abandoned at the exit (``abandon_stuck``)."""
        return self._overran(task, "its handler was still running when its process exited")

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
                stuck = list(self._stuck)
            for slot in slots:
                self._check(slot, now)
            held = [s for s in stuck if now - s.written_off_at >= self._exit_after]
            if held and not self._recycle_asked:
                self._recycle(
                    f"{held[0].task.log_prefix() if held[0].task else 'a handler'} has run "
                    f"on for {self._exit_after:g}s (WRITE_OFF_EXIT_AFTER) since its slot was "
                    "written off; its task keeps its lease until this process exits"
                )

    def _recycle(self, reason: str) -> None:
        self._recycle_asked = True
        self._on_recycle(reason)

    def _check(self, slot: _Slot, now: float) -> None:
        # Both locks: the handler's thread, returning now, sees the slot either still in
        # service or written off and among the stuck ones.
        with self._slots_lock, slot.lock:
            task = slot.task
            if task is None or slot.written_off_at is not None or task.deadline_monotonic is None:
                return
            if now < task.deadline_monotonic + self._timeout_grace:
                return
            slot.written_off_at = now
            self._slots.remove(slot)
            self._stuck.append(slot)
        self.written_off += 1
        self._stats.incr("written_off")
        logger.error(
            "task %s (%s) attempt %s overran its timeout of %gs by more than the %gs grace; "
            "its thread cannot be interrupted, so slot %s is written off (%s of %s allowed) "
            "and a new thread takes its place. The task keeps its lease until the handler "
            "returns (the attempt is then settled as a timeout), or at most %gs "
            "(WRITE_OFF_EXIT_AFTER), when this process exits to end it: check "
            "context.should_stop() in long handlers.",
            task.id,
            task.task_name,
            task.attempt,
            task.timeout,
            self._timeout_grace,
            slot.number,
            self.written_off,
            self._write_off_limit,
            self._exit_after,
            extra=task_fields(
                task, outcome=TIMEOUT, duration=round(now - task.started_monotonic, 6)
            ),
        )
        if not self._stopping.is_set():
            self._spawn()
        self._freed()
        if self.written_off >= self._write_off_limit and not self._recycle_asked:
            self._recycle("too many slots written off")
