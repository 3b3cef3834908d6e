"""One worker process: composes the components and owns startup and shutdown."""

from __future__ import annotations

import copy
import gc
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import field, make_dataclass, replace
from functools import partial

from django_pgqueue import __version__
from django_pgqueue.core.conf import SETTINGS, database_for, get_settings
from django_pgqueue.core.limits import queue_limits
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.tasking.middleware import stack as middleware_stack
from django_pgqueue.tasking.registry import registry
from django_pgqueue.tasking.schedule import schedule_registry
from django_pgqueue.worker import task_logs
from django_pgqueue.worker.async_slots import AsyncSlots
from django_pgqueue.worker.asyncio_runner import AsyncRunner
from django_pgqueue.worker.batcher import Batcher, settle_each
from django_pgqueue.worker.claimed import ClaimedTask
from django_pgqueue.worker.claimer import Claimer
from django_pgqueue.worker.connection import CONNECTION_ERRORS, Session, is_pooled
from django_pgqueue.worker.execution import execute, execute_batch
from django_pgqueue.worker.heartbeat import Heartbeat
from django_pgqueue.worker.inflight import InFlight
from django_pgqueue.worker.logging import task_fields
from django_pgqueue.worker.outcomes import (
    CANCELLED,
    CONTINUED,
    FAILURE,
    LOST,
    RELEASED,
    SNOOZED,
    SUCCESS,
    SUSPENDED,
    TIMEOUT,
    Outcome,
    abandoned,
    expired_before_start,
    released,
)
from django_pgqueue.worker.periodic import Fleet
from django_pgqueue.worker.prefork import DEADLINE_MARGIN, PreforkPool
from django_pgqueue.worker.pruner import Pruner
from django_pgqueue.worker.recycle import Recycling
from django_pgqueue.worker.scheduler import Scheduler
from django_pgqueue.worker.settler import Settler
from django_pgqueue.worker.slots import SlotPool
from django_pgqueue.worker.stats import WorkerStats
from django_pgqueue.worker.sweeper import Sweeper
from django_pgqueue.worker.vacuumer import Vacuumer

logger = logging.getLogger("django_pgqueue.worker")

# Exit code of a worker that stopped to be replaced (a written-off handler ran on for
# WRITE_OFF_EXIT_AFTER, or too many written-off slots).
EXIT_RECYCLE = 75
# A claimed task whose lease holds for less than this (seconds) is not started.
LEASE_MARGIN = 1.0
# The counters of what became of this process's tasks, in the line it logs as it stops
# (at INFO; every counter, the statements' too, at DEBUG): the outcomes, and the tasks
# that expired before they could start or whose slot was written off.
TASK_COUNTERS = (SUCCESS, FAILURE, TIMEOUT, LOST, CANCELLED, CONTINUED, SNOOZED, SUSPENDED,
                 RELEASED, "expired", "written_off")  # fmt: skip
# How often a worker with MAX_TASKS or MAX_MEMORY checks them (seconds).
RECYCLE_CHECK = 0.1


# The settings the worker takes from its options (conf.SETTINGS rows with an ``option``).
_OPTION_SETTINGS = [s for s in SETTINGS if s.option is not None]


class _WorkerOptionsMethods:
    @classmethod
    def from_settings(cls, **overrides: object) -> WorkerOptions:
        """The effective settings, with each override that is not None on top."""
        conf = get_settings()
        options = cls(**{s.option: copy.deepcopy(getattr(conf, s.name)) for s in _OPTION_SETTINGS})
        return replace(options, **{k: v for k, v in overrides.items() if v is not None})


# Everything ``runtaskworker`` can set: one field per row of conf.SETTINGS that names an
# ``option`` (with that setting's default), and what only the command decides.
WorkerOptions = make_dataclass(
    "WorkerOptions",
    [
        *(
            (s.option, s.annotation, field(default_factory=partial(copy.deepcopy, s.default)))
            for s in _OPTION_SETTINGS
        ),
        ("burst", bool, False),
        ("prune", bool, True),
        # The alias of the queues (PGQUEUE['DATABASES']); None: DATABASE.
        ("database", str | None, None),
    ],
    bases=(_WorkerOptionsMethods,),
    namespace={
        "__doc__": "Everything runtaskworker can set; defaults from settings.PGQUEUE.",
        "__module__": __name__,
    },
)


def _with_logs(outcome: Outcome) -> Outcome:
    """An outcome written while its handler still runs (a release, an abandoned
    written-off handler), with the records its attempt logged so far (in thread mode;
    a killed handler process kept none)."""
    outcome.logs = task_logs.take(outcome.task)
    return outcome


def reexec() -> None:
    """Replace this process with a fresh run of the same command, under the same pid.
    Every thread of the old process, a stuck handler's too, ends here."""
    sys.stderr.write("recycling: starting a fresh worker process\n")
    sys.stderr.flush()
    # sys.orig_argv keeps "-m django" when that is how the worker was started.
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


class Worker:
    def __init__(self, options: WorkerOptions, supervised: bool = False) -> None:
        """``supervised``: a child of the supervisor, which replaces it when it exits
        (EXIT_RECYCLE when it recycles). A worker on its own recycles in place: it runs
        its command again (``reexec``)."""
        conf = get_settings()
        self.options = options
        # The database of this worker's queues (PGQUEUE['DATABASES']): runtaskworker
        # starts one worker per database when its queues are on several.
        self.alias = options.database or conf.DATABASE
        elsewhere = [q for q in options.queues if database_for(q) != self.alias]
        if elsewhere:
            raise ValueError(
                f"a worker serves the queues of one database ({self.alias!r}), and "
                f"{', '.join(elsewhere)} are on another (PGQUEUE['DATABASES'])"
            )
        # LISTEN_DATABASE is the direct address of DATABASE: a worker of another
        # database listens on its own connection (or, behind a pooler, polls).
        self.listen_database = conf.LISTEN_DATABASE if self.alias == conf.DATABASE else None
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.stats = WorkerStats()
        self.inflight = InFlight()
        definitions = registry.all()
        middleware_stack()  # PGQUEUE['MIDDLEWARE'], imported once, before any task runs
        self.routes = [(d.name, d.version) for d in definitions]
        # EXECUTION = "process": each slot's handlers run in a child process (prefork.py).
        self.pool = (
            PreforkPool(
                options.concurrency,
                self.alias,
                options.kill_grace,
                self.stats,
                max_tasks=options.max_tasks_per_child,
                max_memory=options.max_memory_per_child,
            )
            if options.execution == "process"
            else None
        )
        if self.pool is None:  # the handlers run here: keep their records (TASK_LOGS)
            task_logs.install_from_settings()
        # MAX_TASKS, MAX_MEMORY: this process makes way for a new one (recycle.py).
        self.recycling = Recycling(options.max_tasks, options.max_memory)
        self._recycling = False
        self._hard_cancel_warned = False
        self._async_runner = (
            AsyncRunner() if self.pool is None and any(d.is_async for d in definitions) else None
        )
        self._stop_requested = threading.Event()
        self._signals = 0
        self._first_signal_at = 0.0
        self._started = False
        self.supervised = supervised
        self.exit_code = 0

        # Fleet-wide limits (docs/limits.md): of this worker's queues, and per key.
        self.limits = {q: lim for q, lim in queue_limits().items() if q in options.queues}
        key_limits = {(d.name, d.version): d.key_concurrency for d in definitions
                      if d.key_concurrency is not None}  # fmt: skip
        key_rates = {(d.name, d.version): d.key_rate for d in definitions if d.key_rate}
        # Fair share (docs/tenants.md): the routes whose claim walks by key's turn.
        fair_routes = {(d.name, d.version) for d in definitions if d.fair_key is not None}
        self.settler = Settler(
            self.alias,
            self.inflight,
            self.stats,
            self.worker_id,
            concurrency_limits={
                q: lim.concurrency for q, lim in self.limits.items() if lim.concurrency
            },
        )
        self.slots = SlotPool(
            options.concurrency,
            prefetch=options.prefetch,  # None: adaptive (slots.py)
            execute=self._execute,
            on_outcome=settle_each(self._on_outcome),  # a batch's: one per call
            stats=self.stats,
            # In process mode the pool kills an overrunning handler; the watchdog is a backstop.
            timeout_grace=options.timeout_grace
            + (options.kill_grace + DEADLINE_MARGIN if self.pool is not None else 0),
            write_off_limit=options.write_off_limit,
            on_recycle=self.request_recycle,
            exit_after=options.write_off_exit_after,
        )
        # Async handlers get async slots (no thread each) when they run in this process.
        self.async_slots: AsyncSlots | None = None
        # Batch handlers (docs/tenants.md) are claimed by the batcher, into batches.
        batched = [d for d in definitions if d.batch_size is not None]
        claim_routes = [(d.name, d.version) for d in definitions if d.batch_size is None]
        async_lane = None
        if self._async_runner is not None:
            self.async_slots = AsyncSlots(
                options.async_concurrency,
                self._async_runner,
                self.alias,
                on_outcome=self._on_outcome,
                changed=self.slots._free_changed,
                stale=lambda task: (
                    self._expired_before_start(task)
                    if task.lease_left(options.lease_seconds) < LEASE_MARGIN
                    else None
                ),
            )
            claim_routes = [(d.name, d.version) for d in definitions
                            if not d.is_async and d.batch_size is None]  # fmt: skip
            async_routes = [(d.name, d.version) for d in definitions if d.is_async]
            async_lane = (self.async_slots, async_routes)
        self.claimer = Claimer(
            self.alias,
            self.worker_id,
            options.queues,
            claim_routes,
            self.slots,
            self.inflight,
            self.stats,
            lease_seconds=options.lease_seconds,
            poll_interval=options.poll_interval,
            starvation_timeout=options.starvation_timeout,
            durable=not conf.ASYNC_CLAIMS,
            async_lane=async_lane,
            limits=self.limits,
            key_limits=key_limits,
            key_rates=key_rates,
            listen_alias=self._listen_alias(conf),
            claim_batch_bytes=conf.CLAIM_BATCH_BYTES,
            fair_routes=fair_routes,
        )
        self.batcher = (
            Batcher(
                self.alias,
                self.worker_id,
                options.queues,
                batched,
                self.slots,
                self.inflight,
                self.stats,
                lease_seconds=options.lease_seconds,
                poll_interval=options.poll_interval,
                release=self.settler.put,
                durable=not conf.ASYNC_CLAIMS,
                claim_batch_bytes=conf.CLAIM_BATCH_BYTES,
            )
            if batched
            else None
        )
        if self.batcher is not None:
            # A notification that wakes the claimer wakes the batcher too.
            self.claimer.on_wake = self.batcher.wake
        # The live workers, counted by the heartbeat: the fleet-wide duties (sweeper,
        # vacuumer, pruner) tick N times less often in each of N processes.
        self.fleet = Fleet()
        self.heartbeat = Heartbeat(
            self.alias,
            options.heartbeat_seconds,
            options.lease_seconds,
            self.worker_id,
            self.inflight,
            self.stats,
            self._register,
            on_hard_cancel=self._on_hard_cancel,
            fleet=self.fleet,
            stale_after=conf.WORKER_STALE_AFTER,
        )
        # One connection for the duties whose statements are short and rare: sweeps,
        # vacuum checks, pruning, schedule ticks and registration take turns on it,
        # so a worker holds four connections of its own whatever its concurrency
        # (claimer, settler, heartbeat, maintenance; docs/worker.md, "Connections").
        # Registration retries until the database answers or the worker is told to stop.
        self._maintenance_session = Session(self.alias, "maintenance", self._stop_requested)
        self.sweeper = Sweeper(
            self.alias,
            options.sweep_interval,
            conf.WORKER_STALE_AFTER,
            conf.UNROUTABLE_TTL,
            self.stats,
            fleet=self.fleet,
            session=self._maintenance_session,
        )
        # The vacuumer's fleet-wide lock is a session lock: behind a transaction pooler
        # it takes it, and vacuums, over the direct LISTEN_DATABASE, or not at all.
        vacuum_alias = self.listen_database if is_pooled(self.alias) else self.alias
        self.vacuumer = (
            Vacuumer(
                vacuum_alias,
                conf.VACUUM_INTERVAL,
                conf.VACUUM_THRESHOLD,
                self.stats,
                self.fleet,
                session=self._maintenance_session if vacuum_alias == self.alias else None,
            )
            if conf.VACUUM_INTERVAL and vacuum_alias
            else None
        )
        self.pruner = (
            Pruner(
                self.alias,
                conf.PRUNE_INTERVAL,
                conf.RESULT_TTL,
                conf.DEAD_TTL,
                conf.PRUNE_BATCH,
                self.stats,
                fleet=self.fleet,
                session=self._maintenance_session,
                archive_dir=conf.PRUNE_ARCHIVE_DIR,
            )
            if options.prune
            else None
        )
        # Periodic schedules (docs/periodic.md): those of this worker's queues whose task
        # it runs, from code and added at runtime (read every POLL_INTERVAL); every such
        # worker fires them, the database enqueues each tick once.
        schedules = [
            s
            for s in schedule_registry.all()
            if s.queue in options.queues and (s.task.name, s.task.version) in self.routes
        ]
        self.scheduler = (
            Scheduler(
                self.alias,
                self.worker_id,
                schedules,
                self.stats,
                self._maintenance_session,
                queues=list(options.queues),
                routes=self.routes,
                refresh=options.poll_interval,
            )
            if options.scheduler
            else None
        )
        if self.scheduler is not None and self.claimer.listen_session is not None:
            # Changes of the schedules arrive as notifications (runtime_schedules.py):
            # the scheduler reads the rows then, not every POLL_INTERVAL.
            self.scheduler.notified_by(self.claimer.listener)

    def _listen_alias(self, conf) -> str | None:
        """Where the claimer LISTENs: "" on its own connection, an alias, or None (poll)."""
        if not is_pooled(self.alias):
            return self.listen_database or ""
        if self.listen_database is None:
            logger.warning(
                "TRANSACTION_POOLER is set and LISTEN_DATABASE is not: LISTEN does not work "
                "through a transaction pooler, so this worker polls every %gs instead of "
                "being woken (set PGQUEUE['LISTEN_DATABASE'] to an alias with a direct "
                "address of the database for wake-ups); it does not vacuum the task table "
                "either (its lock needs a session): autovacuum does",
                self.options.poll_interval,
            )
        return self.listen_database

    # -- running ----------------------------------------------------------------------
    def _execute(self, task: ClaimedTask) -> Outcome | list[Outcome]:
        if task.batch is not None:  # a batch handler's batch: in this slot's thread
            if task.lease_left(self.options.lease_seconds) < LEASE_MARGIN:
                return [self._expired_before_start(each) for each in task.batch]
            return execute_batch(task.batch, self.alias)
        if task.lease_left(self.options.lease_seconds) < LEASE_MARGIN:
            return self._expired_before_start(task)
        if self.pool is not None:
            return self.pool.execute(task)
        return execute(task, self.alias, self._async_runner)

    def _on_outcome(self, outcome: Outcome) -> None:
        self.recycling.count()
        self.settler.put(outcome)

    def _expired_before_start(self, task: ClaimedTask) -> Outcome:
        logger.warning(
            "%s: its lease expired before it could start (this process stalled for longer "
            "than the lease); not running it",
            task.log_prefix(),
            extra=task_fields(task, outcome="lost", worker=self.worker_id, database=self.alias),
        )
        self.stats.incr("expired_before_start")
        return expired_before_start(task)

    def _on_hard_cancel(self, task: ClaimedTask) -> None:
        if self.pool is not None:
            self.pool.kill(task.lease)
        elif self.async_slots is not None and self.async_slots.cancel(task):
            pass  # an async handler is interrupted at its current await
        elif not self._hard_cancel_warned:
            self._hard_cancel_warned = True
            logger.warning(
                "%s: cancelled with hard=True, but this worker runs handlers in threads, "
                "which cannot be killed: the handler only sees context.cancel_requested. "
                "Run workers with --execution process for hard cancels.",
                task.log_prefix(),
            )

    def run(
        self, install_signals: bool = True, on_started: Callable[[], None] | None = None
    ) -> int:
        """Run until stopped (signal, burst drained, recycle). Returns the exit code.

        ``on_started`` is called once the worker has registered and started its
        components, right after it logs "started" (never if it stops before that).
        """
        if not self.routes:
            logger.warning("no tasks are registered in this process: nothing can be claimed")
        if install_signals:
            signal.signal(signal.SIGTERM, self._on_signal)
            # A supervised child leaves Ctrl-C to its supervisor, which forwards SIGTERM.
            signal.signal(signal.SIGINT, signal.SIG_IGN if self.supervised else self._on_signal)
        if self.pool is not None:
            self.pool.start()
        try:
            self._register()
        except CONNECTION_ERRORS:  # raised only once a stop was requested
            logger.info(
                "worker %s stopped before it could register: the database was unreachable",
                self.worker_id,
            )
            self._maintenance_session.close()
            return self.exit_code
        # Everything loaded so far (Django, the app, the tasks) lives as long as the
        # process: move it out of the collector's sight, so that full collections stay
        # short and do not add milliseconds to a task's start.
        gc.collect()
        gc.freeze()
        for component in self._components():
            component.start()
        names = sorted({name for name, _version in self.routes})
        logger.info(
            "worker %s started: queues %s; %d slots; %s",
            self.worker_id,
            ", ".join(self.options.queues),
            self.options.concurrency,
            f"{len(names)} task(s): {', '.join(names)}" if names else "no task registered",
        )
        logger.debug(
            "worker %s: lease=%gs heartbeat=%gs poll_interval=%gs shutdown_grace=%gs "
            "execution=%s routes=%s",
            self.worker_id,
            self.options.lease_seconds,
            self.options.heartbeat_seconds,
            self.options.poll_interval,
            self.options.shutdown_grace,
            self.options.execution,
            ",".join(f"{name}@{version}" for name, version in self.routes),
        )
        self._started = True
        try:
            if on_started is not None:
                on_started()
            # Recycling reads the task count and the memory every RECYCLE_CHECK seconds.
            tick = 0.05 if self.options.burst else RECYCLE_CHECK if self.recycling else 1.0
            while not self._stop_requested.wait(tick):
                if self.recycling and self._recycled():
                    break
                if self.options.burst and self._burst_done():
                    logger.info("--burst: no task is due and none is running; stopping")
                    break
        finally:
            self._shutdown()
        return self.exit_code

    def _components(self) -> list:
        parts = [
            self.settler,
            self.slots,
            self.heartbeat,
            self.sweeper,
            self.claimer,
            *([self.batcher] if self.batcher is not None else []),
        ]
        if self.pruner is not None:
            parts.insert(4, self.pruner)
        if self.vacuumer is not None:
            parts.insert(4, self.vacuumer)
        if self.scheduler is not None:
            parts.append(self.scheduler)
        return parts

    def _recycled(self) -> bool:
        """MAX_TASKS, MAX_MEMORY: once past a limit, stop claiming; True once every task
        this process holds has run (written-off handlers aside), for an exit with status
        0 that releases nothing: the process manager, or the supervisor, starts anew."""
        if not self._recycling:
            reason = self.recycling.reason()
            if reason is None:
                return False
            self._recycling = True
            self.claimer.stop()
            logger.info(
                "recycling: %s; claims stopped, finishing the %d task(s) this process "
                "holds, then exiting with status 0 to be started anew",
                reason,
                len(self._unfinished()),
            )
        return not self._unfinished()

    def _burst_done(self) -> bool:
        if self.inflight:
            return False
        if self.batcher is not None and not self.batcher.idle.is_set():
            return False  # its last round found batch tasks to claim
        if self.claimer.idle.is_set():
            return True
        # Everything is settled but the last claim began before that: claim once more.
        self.claimer.wake()
        return False

    def stop(self) -> None:
        self._stop_requested.set()

    def request_recycle(self, reason: str) -> None:
        logger.error("%s; stopping so this process is replaced", reason)
        self.exit_code = EXIT_RECYCLE
        self._stop_requested.set()

    def _on_signal(self, signum: int, _frame: object) -> None:
        now = time.monotonic()
        if self.supervised and self._first_signal_at and now - self._first_signal_at < 1.0:
            # Under a supervisor the same stop can arrive twice at once: from the
            # supervisor and from whoever signalled the whole process group or cgroup
            # (systemd's KillMode=control-group). That is one request, not two.
            return
        self._first_signal_at = self._first_signal_at or now
        self._signals += 1
        if self._signals > 1:
            logger.warning(
                "second signal (%s): exiting now; unfinished leases will expire",
                signal.Signals(signum).name,
            )
            os._exit(1)
        if self._started:
            logger.info(
                "%s: stopping. No new task is claimed; running tasks get up to %gs to "
                "finish (another signal exits at once)",
                signal.Signals(signum).name,
                self.options.shutdown_grace,
            )
        else:
            logger.info(
                "signal %s: stopping before the worker has started",
                signal.Signals(signum).name,
            )
        self._stop_requested.set()

    # -- shutdown ---------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Stop claiming at once, let handlers finish within the grace period, then
        release what is still running (fenced; the attempt is not refunded).

        Written-off handlers (stuck past their timeout, their leases held) are not waited
        for; those still running then are settled as timeouts (``outcomes.abandoned``).

        A handler thread cannot be stopped, so a release must never let another worker
        start the task while its handler still runs here: the released row becomes due
        only ``RELEASE_DELAY`` after the release commits, and this process exits right
        after the release is written (its handler threads die with it). In process
        mode the handlers' processes are killed, and gone, before the release is put
        on the settler: the release does not need this process to exit.
        """
        self.claimer.stop()
        if self.batcher is not None:
            self.batcher.stop()  # the rows of batches still filling are released
        logger.debug("claims stopped: no task is claimed from now on")
        deadline = time.monotonic() + self.options.shutdown_grace
        while time.monotonic() < deadline and self._unfinished():
            time.sleep(0.02)
        stuck = self.slots.abandon_stuck()
        unfinished = self._unfinished()
        for component in self._maintenance():
            component.stop()
        self._unregister()
        if (unfinished or stuck) and self.pool is not None:
            self.pool.kill_running()
        for task in stuck:
            logger.warning(
                "%s: its written-off handler is still running; settling the attempt as a "
                "timeout, and exiting right after the write to end the handler",
                task.log_prefix(),
                extra=task_fields(task, outcome="timeout", worker=self.worker_id,
                                  database=self.alias),
            )  # fmt: skip
            for each in task.batch or [task]:  # a batch's every call
                self.settler.put(_with_logs(abandoned(each, self.slots.exit_message(task))))
        for task in unfinished:
            logger.warning(
                "%s was still running after the %gs shutdown grace: released, to run again "
                "on the next free worker; %s",
                task.log_prefix(),
                self.options.shutdown_grace,
                f"its attempts are spent ({task.attempt} of {task.max_attempts}): it fails"
                if task.attempt >= task.max_attempts
                else f"this attempt counts ({task.attempt} of {task.max_attempts} used)",
                extra=task_fields(
                    task, outcome="released", worker=self.worker_id, database=self.alias
                ),
            )
            self.settler.put(_with_logs(released(task)))
        self.slots.stop()
        if self.pool is not None:
            self.pool.stop()
        self.settler.stop(timeout=10)
        counts = self.stats.snapshot()
        claimed = counts.get("claimed", 0)
        outcomes = " ".join(f"{k}={counts[k]}" for k in TASK_COUNTERS if counts.get(k))
        logger.info(
            "worker %s stopped: %s%s",
            self.worker_id,
            f"{claimed} task(s) claimed" if claimed else "no task claimed",
            f"; {outcomes}" if outcomes else "",
        )
        logger.debug(
            "worker %s counters: %s",
            self.worker_id,
            " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none",
        )
        if (unfinished or stuck) and self.pool is None:
            logger.debug(
                "exiting now: %d released and %d written-off handler(s) are still running "
                "and must not outlive their settlement",
                len(unfinished),
                len(stuck),
            )
            logging.shutdown()
            if self.exit_code == EXIT_RECYCLE and not self.supervised:
                reexec()
            os._exit(self.exit_code)
        if self._async_runner is not None:
            self._async_runner.stop()

    def _unfinished(self) -> list[ClaimedTask]:
        """Claims whose handler has not returned, but for written-off ones."""
        stuck = {each.lease for task in self.slots.stuck() for each in task.batch or [task]}
        return [task for task in self.inflight.running() if task.lease not in stuck]

    def _maintenance(self) -> list:
        """The periodic components: stopped before the final release is written."""
        parts = [self.heartbeat, self.sweeper]
        if self.pruner is not None:
            parts.append(self.pruner)
        if self.vacuumer is not None:
            parts.append(self.vacuumer)
        if self.scheduler is not None:
            parts.append(self.scheduler)
        return parts

    # -- registry ---------------------------------------------------------------------
    def _register(self) -> None:
        params = {
            "id": self.worker_id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "queues": json.dumps(self.options.queues),
            "routes": json.dumps([[d.name, d.version] for d in registry.all()]),
            "concurrency": self.options.concurrency,
            "version": __version__,
        }
        queues = {"queues": self.options.queues}

        def register(conn) -> None:
            conn.execute(QUERIES["register_worker"], params)
            conn.execute(QUERIES["ensure_queues"], queues)

        self._maintenance_session.call(register)

    def _unregister(self) -> None:
        # After an outage the maintenance connection may be dead without knowing it (a
        # silent one would hold the exit for DEAD_CONNECTION_TIMEOUT), so leave over a
        # fresh one, once, or leave the row to the sweep. The duties that share it are
        # stopped by now.
        self._maintenance_session.close()
        try:
            self._maintenance_session.call(
                lambda conn: conn.execute(QUERIES["unregister_worker"], {"id": self.worker_id}),
                retry=False,
            )
        except Exception:
            logger.warning("could not remove worker row %s; the sweep will", self.worker_id)
        self._maintenance_session.close()
