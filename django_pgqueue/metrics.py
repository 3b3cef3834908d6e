"""Prometheus metrics of a worker process.

The worker serves its own ``/metrics`` (``runtaskworker --metrics-port``). Counters
follow the worker's own stats: outcomes (success, failure, timeout, lost, cancelled,
continued, snoozed, released), lease renewals and losses, written-off slots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, start_http_server

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

TASK_OUTCOMES = Counter(
    "pgqueue_task_outcomes_total", "Settled task attempts by outcome", ["outcome"]
)
LEASE_RENEWALS = Counter("pgqueue_lease_renewals_total", "Leases renewed by heartbeats")
LEASES_LOST = Counter(
    "pgqueue_leases_lost_total", "Leases found lost while the handler was running"
)
SLOTS_WRITTEN_OFF = Counter(
    "pgqueue_slots_written_off_total", "Handler slots written off after overrunning"
)
TASKS_CLAIMED = Counter("pgqueue_tasks_claimed_total", "Tasks claimed by this process")
WORKER_SLOTS = Gauge("pgqueue_worker_slots", "Handler slots of this worker process")

_STAT_COUNTERS = {
    "lease_renewals": LEASE_RENEWALS,
    "lease_lost": LEASES_LOST,
    "written_off": SLOTS_WRITTEN_OFF,
    "claimed": TASKS_CLAIMED,
}


def serve_worker_metrics(port: int) -> None:
    start_http_server(port)


def watch_worker(worker: Worker) -> None:
    """Mirror the worker's stats into the Prometheus counters."""
    WORKER_SLOTS.set(worker.options.concurrency)

    def on_stat(name: str, amount: int) -> None:
        if name in OUTCOME_LABELS:
            TASK_OUTCOMES.labels(outcome=name).inc(amount)
        elif name in _STAT_COUNTERS:
            _STAT_COUNTERS[name].inc(amount)

    worker.stats.add_listener(on_stat)
