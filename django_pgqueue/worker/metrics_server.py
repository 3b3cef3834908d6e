"""A worker process's own Prometheus metrics and the HTTP server that serves them
(``runtaskworker --metrics-port``, ``--metrics-addr``; docs/metrics.md lists every
metric).

The worker counts what it does (outcomes, claims, lease renewals and losses,
write-offs, handler processes killed or dead, run time, queue wait): ``watch_worker``
mirrors its stats and settlements into ``WorkerMetrics``, and ``serve_worker_metrics``
serves the default registry. The queue gauges read from the database are the web
side's (``django_pgqueue.ops.metrics``): a worker serves them only with
``PGQUEUE["WORKER_QUEUE_METRICS"]``, and imports that module only then.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from django_pgqueue.core.conf import get_settings

if TYPE_CHECKING:
    from django_pgqueue.worker.worker import Worker

OUTCOME_LABELS = (
    "success",
    "failure",
    "timeout",
    "lost",
    "cancelled",
    "continued",
    "snoozed",
    "released",
)

# Seconds: from a few milliseconds to the longest sensible attempt / wait.
RUNTIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)


class WorkerMetrics:
    """The counters, gauges and histograms of one worker process."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.outcomes = Counter(
            "pgqueue_task_outcomes_total",
            "Settled task attempts by outcome",
            ["outcome"],
            registry=registry,
        )
        self.claimed = Counter(
            "pgqueue_tasks_claimed_total", "Tasks claimed by this process", registry=registry
        )
        self.lease_renewals = Counter(
            "pgqueue_lease_renewals_total", "Leases renewed by heartbeats", registry=registry
        )
        self.leases_lost = Counter(
            "pgqueue_leases_lost_total",
            "Leases found lost while the handler was running",
            registry=registry,
        )
        self.leases_recovered = Counter(
            "pgqueue_leases_recovered_total",
            "Expired leases (of dead or stalled workers) recovered by this process's sweep",
            registry=registry,
        )
        self.written_off = Counter(
            "pgqueue_slots_written_off_total",
            "Handler slots written off after overrunning",
            registry=registry,
        )
        self.late_returns = Counter(
            "pgqueue_late_returns_total",
            "Written-off handlers that returned, their attempt settled as a timeout",
            registry=registry,
        )
        self.claims_cut = Counter(
            "pgqueue_claims_cut_total",
            "Claims that took fewer rows than asked to stay within CLAIM_BATCH_BYTES",
            registry=registry,
        )
        self.handler_processes_killed = Counter(
            "pgqueue_handler_processes_killed_total",
            "Handler processes killed (--execution process): past the task's timeout, on "
            "a hard cancel, or still running at the end of the shutdown grace",
            registry=registry,
        )
        self.handler_processes_died = Counter(
            "pgqueue_handler_processes_died_total",
            "Handler processes (--execution process) that died on their own with a task "
            "handed to them: a segfault, os._exit, the OOM killer",
            registry=registry,
        )
        self.handler_processes_recycled = Counter(
            "pgqueue_handler_processes_recycled_total",
            "Handler processes (--execution process) that exited after a task past "
            "MAX_TASKS_PER_CHILD or MAX_MEMORY_PER_CHILD, each replaced by a new one",
            registry=registry,
        )
        self.expired = Counter(
            "pgqueue_tasks_expired_total",
            "Tasks this process's claims and stager ended cancelled because they expired "
            "before they started",
            registry=registry,
        )
        self.pruned = Counter(
            "pgqueue_tasks_pruned_total",
            "Terminal tasks deleted by this process's retention",
            registry=registry,
        )
        self.slots = Gauge(
            "pgqueue_worker_slots", "Handler slots of this worker process", registry=registry
        )
        self.in_flight = Gauge(
            "pgqueue_worker_in_flight",
            "Tasks this worker process holds a lease on",
            registry=registry,
        )
        self.runtime = Histogram(
            "pgqueue_task_runtime_seconds",
            "Run time of settled attempts",
            ["queue", "task_name"],
            buckets=RUNTIME_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "pgqueue_task_queue_wait_seconds",
            "Time from a task being due (run_at) to its claim, by the database's clock",
            ["queue", "task_name"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self._stat_counters = {
            "claimed": self.claimed,
            "lease_renewals": self.lease_renewals,
            "lease_lost": self.leases_lost,
            "leases_recovered": self.leases_recovered,
            "written_off": self.written_off,
            "late_return": self.late_returns,
            "claims_cut": self.claims_cut,
            "handler_processes_killed": self.handler_processes_killed,
            "handler_processes_died": self.handler_processes_died,
            "handler_processes_recycled": self.handler_processes_recycled,
            "pruned": self.pruned,
            "expired": self.expired,
        }
        for label in OUTCOME_LABELS:
            self.outcomes.labels(outcome=label)  # export zeros, so rate() sees the start

    def on_stat(self, name: str, amount: int) -> None:
        """A WorkerStats listener."""
        if name in OUTCOME_LABELS:
            self.outcomes.labels(outcome=name).inc(amount)
        elif name in self._stat_counters:
            self._stat_counters[name].inc(amount)

    def on_settled(self, sender: Any, **kwargs: Any) -> None:
        """A task_settled receiver: the run-time and queue-wait histograms."""
        labels = {"queue": kwargs["queue"], "task_name": sender.name}
        self.runtime.labels(**labels).observe(kwargs["runtime"])
        self.queue_wait.labels(**labels).observe(kwargs["queue_wait"])


_worker_metrics: WorkerMetrics | None = None


def serve_worker_metrics(port: int, addr: str = "0.0.0.0") -> None:
    """Serve this process's default registry on ``addr``:``port`` (``/metrics``).

    The queue gauges are left out unless ``PGQUEUE["WORKER_QUEUE_METRICS"]``: every
    worker would otherwise read the same numbers from the database.
    """
    if get_settings().WORKER_QUEUE_METRICS:
        from django_pgqueue.ops.metrics import register_queue_collector

        register_queue_collector()
    elif "django_pgqueue.ops.metrics" in sys.modules:
        # The app registered the queue gauges at startup (QUEUE_METRICS): take them out
        # of this process's /metrics, without importing the collector otherwise.
        sys.modules["django_pgqueue.ops.metrics"].unregister_queue_collector()
    start_http_server(port, addr=addr)


def watch_worker(worker: Worker) -> None:
    """Mirror the worker's stats and settlements into the Prometheus metrics."""
    global _worker_metrics
    from django_pgqueue.core.signals import task_settled

    if _worker_metrics is None:
        _worker_metrics = WorkerMetrics()
    metrics = _worker_metrics
    metrics.slots.set(worker.options.concurrency)
    metrics.in_flight.set_function(lambda: len(worker.inflight))
    worker.stats.add_listener(metrics.on_stat)
    task_settled.connect(metrics.on_settled, dispatch_uid="django_pgqueue.worker.metrics_server")
