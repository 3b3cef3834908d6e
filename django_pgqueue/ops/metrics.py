"""Prometheus metrics of the queue, read from the database (docs/metrics.md lists every
metric). A worker's own counters and its ``/metrics`` server are the worker's:
``django_pgqueue.worker.metrics_server``.

* ``QueueCollector`` reads the queue from the database (pending, unroutable,
  scheduled, running, waiting and dead tasks by queue and task name; the ages of the
  oldest due task and of the oldest running attempt, live workers and slots by queue;
  pauses, concurrency limits and throttled tasks, as overview.group_by_queue decides;
  waiting tasks by queue and what they wait for).
  With ``PGQUEUE["QUEUE_METRICS"]`` (the default) the app registers it in
  prometheus_client's default registry at startup, which is what django-prometheus
  serves from the web process. A worker serves it too only with
  ``PGQUEUE["WORKER_QUEUE_METRICS"]``. Scrapes cannot hammer the database: the
  collector reads at most once per ``METRICS_CACHE_SECONDS`` (concurrent scrapes share
  one read), through the index-backed ``queue_overview`` and ``queue_capacity``
  statements and ``queue_pauses`` (one row per queue), under a statement timeout,
  from the read database: ``READ_DATABASE`` (a replica) when it is set, and then
  ``pgqueue_read_replica_lag_seconds`` says how far behind those numbers are.
* ``DoctorCollector``: ``pgqueue_doctor_findings``, the queue doctor's findings
  (doctor.py) counted by check and severity, read at most once per
  ``DOCTOR_METRICS_SECONDS``; registered beside the queue gauges unless that is None.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from django_pgqueue.core.conf import get_settings, read_database
from django_pgqueue.core.limits import queue_limits

if TYPE_CHECKING:
    from django_pgqueue.ops.operations import ReplicaLag

logger = logging.getLogger("django_pgqueue.metrics")

# -- the queue gauges -----------------------------------------------------------------

_TASK_GAUGES = (
    ("pending", "pgqueue_tasks_pending", "Tasks due and waiting to be claimed"),
    (
        "pending_unroutable",
        "pgqueue_tasks_unroutable",
        "Tasks due that no live worker can run (no worker registered the task name and "
        "version for the queue); included in pgqueue_tasks_pending",
    ),
    ("scheduled", "pgqueue_tasks_scheduled", "Scheduled tasks (run_at in the future)"),
    ("running", "pgqueue_tasks_running", "Tasks under a worker's lease"),
    (
        "waiting",
        "pgqueue_tasks_waiting",
        "Tasks waiting (not due): for their parents, a signal, or a task they suspended on",
    ),
    ("failed", "pgqueue_tasks_failed", "Dead letters: tasks failed for good, kept until DEAD_TTL"),
)
_QUEUE_GAUGES = (
    (
        "oldest_due_seconds",
        "pgqueue_queue_oldest_due_seconds",
        "Age of the oldest due task of the queue (0 when nothing is due)",
    ),
    (
        "oldest_running_seconds",
        "pgqueue_queue_oldest_running_seconds",
        "Age of the oldest running attempt of the queue, since its claim (0 when nothing "
        "runs); a handler hung past its timeout keeps growing it",
    ),
    ("workers", "pgqueue_queue_workers", "Live workers serving the queue"),
    ("slots", "pgqueue_queue_slots", "Handler slots of the live workers serving the queue"),
    ("paused", "pgqueue_queue_paused", "1 while the queue is paused, else 0"),
    (
        "throttled",
        "pgqueue_queue_throttled",
        "Due routable tasks held back by a pause (of the queue or of their task name) or "
        "by a limit (the queue at its concurrency limit, or out of rate budget)",
    ),
    (
        "oldest_unthrottled_seconds",
        "pgqueue_queue_oldest_unthrottled_seconds",
        "Age of the oldest due task of the queue that no pause or limit holds back (0 "
        "when there is none): what the starvation alerts watch",
    ),
)
# Only for the queues (and task names) they apply to.
_TASK_PAUSED = ("pgqueue_task_paused", "1 while the task name is paused in the queue")
_CONCURRENCY_LIMIT = (
    "pgqueue_queue_concurrency_limit",
    "The queue's fleet-wide concurrency limit (QUEUE_LIMITS)",
)
# Every queue, one series per reason (0 included), so a reason with no waiting task
# reads 0 rather than absent.
_QUEUE_WAITING = (
    "pgqueue_queue_waiting",
    "Waiting tasks of the queue by what they wait for: reason parents (after=, a chain, "
    "group or chord), signal (Suspend) or child (context.wait_for); not due, so in no age",
)
# Only with READ_DATABASE, and only while it has a lag to report (see replica_lag).
_REPLICA_LAG = (
    "pgqueue_read_replica_lag_seconds",
    "How far READ_DATABASE, which the queue gauges are read from, is behind its primary: "
    "seconds since the primary committed the last transaction it replayed (0 when "
    "READ_DATABASE is not a replica)",
)


class QueueCollector(Collector):
    """Gauges of the queue read from the database, cached for ``ttl`` seconds."""

    def __init__(self, ttl: float | None = None, statement_timeout: float = 5.0) -> None:
        self.ttl = ttl
        self.statement_timeout = statement_timeout
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._metrics: list[Metric] = []

    def describe(self) -> Iterable[Metric]:
        # Defined so that registering does not read the database.
        for _key, name, documentation in _TASK_GAUGES:
            yield GaugeMetricFamily(name, documentation, labels=["queue", "task_name"])
        for _key, name, documentation in _QUEUE_GAUGES:
            yield GaugeMetricFamily(name, documentation, labels=["queue"])
        yield GaugeMetricFamily(*_TASK_PAUSED, labels=["queue", "task_name"])
        yield GaugeMetricFamily(*_CONCURRENCY_LIMIT, labels=["queue"])
        yield GaugeMetricFamily(*_QUEUE_WAITING, labels=["queue", "reason"])
        yield GaugeMetricFamily(*_REPLICA_LAG)
        yield GaugeMetricFamily("pgqueue_queue_metrics_up", "1 if the last read succeeded")

    def collect(self) -> Iterable[Metric]:
        ttl = get_settings().METRICS_CACHE_SECONDS if self.ttl is None else self.ttl
        with self._lock:  # concurrent scrapes wait for one read and share it
            now = time.monotonic()
            if self._read_at is None or now - self._read_at >= ttl:
                self._metrics = self._read()
                self._read_at = now
            return list(self._metrics)

    def _read(self) -> list[Metric]:
        try:
            overview, capacity, pauses, lag = self._query()
        except Exception:
            logger.exception("queue metrics: could not read the queue from the database")
            return [
                GaugeMetricFamily("pgqueue_queue_metrics_up", "1 if the last read succeeded", 0)
            ]
        return [
            *queue_metric_families(overview, capacity, pauses),
            *replica_lag_families(lag),
            GaugeMetricFamily("pgqueue_queue_metrics_up", "1 if the last read succeeded", 1),
        ]

    def _query(
        self,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], ReplicaLag | None]:
        """The reads of every alias with a task table (PGQUEUE['DATABASES']), each on
        its read database, concatenated: queue names are per deployment, so the gauges
        keep their labels. A queue's pause comes from its own database."""
        from django_pgqueue.core.conf import queue_databases
        from django_pgqueue.ops.operations import (
            own_pauses,
            queue_capacity,
            queue_overview,
            replica_lag,
        )

        overview: list[dict[str, Any]] = []
        capacity: list[dict[str, Any]] = []
        queue_pauses: dict[str, Any] = {}
        lag = None
        for index, alias in enumerate(queue_databases()):
            with self._bounded(read_database(alias)) as using:
                if index == 0:
                    lag = replica_lag()
                overview += queue_overview(using=using)
                capacity += queue_capacity(using=using)
                queue_pauses.update(own_pauses(alias, using))
        return overview, capacity, queue_pauses, lag

    @contextmanager
    def _bounded(self, alias: str) -> Iterator[str]:
        """A transaction on ``alias`` whose statements time out after
        ``statement_timeout`` seconds."""
        from django.db import connections, transaction

        connection = connections[alias]
        nested = connection.in_atomic_block
        try:
            with transaction.atomic(using=alias), connection.cursor() as cursor:
                # Bounded: SET LOCAL, so the timeout ends with this transaction.
                cursor.execute("SELECT current_setting('statement_timeout')")
                (previous,) = cursor.fetchone()
                cursor.execute(
                    "SELECT set_config('statement_timeout', %s, true)",
                    [f"{int(self.statement_timeout * 1000)}ms"],
                )
                yield alias
                if nested:  # inside the caller's transaction: give its timeout back
                    cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])
        finally:
            if not nested:
                # Scrapes of a worker's /metrics come on short-lived threads, each with
                # its own Django connection: do not leave one open per scrape.
                connection.close()


def replica_lag_families(lag: ReplicaLag | None) -> list[Metric]:
    """``pgqueue_read_replica_lag_seconds``: none without READ_DATABASE, nor while its
    standby has replayed no transaction since it started (no lag to tell)."""
    if lag is None or (lag.replica and lag.seconds is None):
        return []
    return [GaugeMetricFamily(*_REPLICA_LAG, value=lag.seconds if lag.replica else 0.0)]


def queue_metric_families(
    overview: list[dict[str, Any]],
    capacity: list[dict[str, Any]],
    pauses: dict[str, dict[str, Any]],
) -> list[Metric]:
    """The gauges for one read of ``queue_overview``, ``queue_capacity`` and
    ``pauses``, with the limits of QUEUE_LIMITS."""
    from django_pgqueue.ops.overview import WAIT_REASONS, group_by_queue

    task_families = {
        key: GaugeMetricFamily(name, documentation, labels=["queue", "task_name"])
        for key, name, documentation in _TASK_GAUGES
    }
    queue_values: dict[str, dict[str, float]] = {}

    def per_queue_values(queue: str) -> dict[str, float]:
        return queue_values.setdefault(queue, {key: 0 for key, _name, _doc in _QUEUE_GAUGES})

    # The overview has a row per handler version; the gauges sum the versions of a task.
    per_task: dict[tuple[str, str], dict[str, float]] = {}
    for row in overview:
        values = per_task.setdefault(
            (row["queue"], row["task_name"]), {key: 0 for key in task_families}
        )
        row_values = {**row, "pending": row["pending_routable"] + row["pending_unroutable"]}
        for key in task_families:
            values[key] += row_values[key]
        per_queue = per_queue_values(row["queue"])
        for age in ("oldest_due_seconds", "oldest_running_seconds"):
            per_queue[age] = max(per_queue[age], row[age] or 0.0)
    for (queue, task_name), values in per_task.items():
        for key, family in task_families.items():
            family.add_metric([queue, task_name], values[key])
    limits = queue_limits()
    task_paused = GaugeMetricFamily(*_TASK_PAUSED, labels=["queue", "task_name"])
    queue_waiting = GaugeMetricFamily(*_QUEUE_WAITING, labels=["queue", "reason"])
    for group in group_by_queue(overview, capacity, pauses, limits):
        per_queue = per_queue_values(group.name)
        per_queue["workers"] = group.workers
        per_queue["slots"] = group.slots
        per_queue["paused"] = int(group.paused)
        per_queue["throttled"] = group.totals["throttled"]
        per_queue["oldest_unthrottled_seconds"] = group.totals["oldest_unthrottled_seconds"] or 0.0
        for task_name in group.paused_tasks:
            task_paused.add_metric([group.name, task_name], 1)
        for reason in WAIT_REASONS:
            queue_waiting.add_metric([group.name, reason], group.waiting[reason])
    concurrency_limit = GaugeMetricFamily(*_CONCURRENCY_LIMIT, labels=["queue"])
    for queue, limit in sorted(limits.items()):
        if limit.concurrency is not None:
            concurrency_limit.add_metric([queue], limit.concurrency)
    queue_families = []
    for key, name, documentation in _QUEUE_GAUGES:
        family = GaugeMetricFamily(name, documentation, labels=["queue"])
        for queue, values in sorted(queue_values.items()):
            family.add_metric([queue], values[key])
        queue_families.append(family)
    return [
        *task_families.values(),
        *queue_families,
        task_paused,
        concurrency_limit,
        queue_waiting,
    ]


# -- the doctor's findings ------------------------------------------------------------

_DOCTOR_FINDINGS = (
    "pgqueue_doctor_findings",
    "Findings of the queue doctor (pgqueue_doctor) by check and severity: every check's "
    "warning and problem series exist, 0 when it found none",
)
_DOCTOR_UP = ("pgqueue_doctor_up", "1 if the doctor's last run succeeded")


class DoctorCollector(Collector):
    """``pgqueue_doctor_findings{check, severity}``: the doctor's findings on every
    database with a task table, counted; the doctor runs at most once per ``ttl``
    seconds (DOCTOR_METRICS_SECONDS), concurrent scrapes sharing one run."""

    def __init__(self, ttl: float | None = None) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._metrics: list[Metric] = []

    def describe(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(*_DOCTOR_FINDINGS, labels=["check", "severity"])
        yield GaugeMetricFamily(*_DOCTOR_UP)

    def collect(self) -> Iterable[Metric]:
        ttl = get_settings().DOCTOR_METRICS_SECONDS if self.ttl is None else self.ttl
        with self._lock:
            now = time.monotonic()
            if self._read_at is None or now - self._read_at >= (ttl or 0):
                self._metrics = self._read()
                self._read_at = now
            return list(self._metrics)

    def _read(self) -> list[Metric]:
        from django.db import connections

        from django_pgqueue.core.conf import queue_databases
        from django_pgqueue.ops import doctor

        try:
            findings = doctor.diagnose()
        except Exception:
            logger.exception("doctor metrics: the doctor could not run")
            return [GaugeMetricFamily(*_DOCTOR_UP, value=0)]
        finally:
            # Scrapes of a worker's /metrics come on short-lived threads, each with its
            # own Django connections: do not leave them open (as QueueCollector).
            for alias in queue_databases():
                if not connections[alias].in_atomic_block:
                    connections[alias].close()
        return [doctor_families(findings), GaugeMetricFamily(*_DOCTOR_UP, value=1)]


def doctor_families(findings: Iterable[Any]) -> Metric:
    """The findings counted by (check, severity); a warning and a problem series for
    every check the doctor has, so that an alert sees one go back to 0."""
    from django_pgqueue.ops import doctor

    counts = {(check, s): 0 for check in doctor.CHECK_IDS for s in (doctor.WARNING, doctor.PROBLEM)}
    for finding in findings:
        key = (finding.check, finding.severity)
        counts[key] = counts.get(key, 0) + 1
    family = GaugeMetricFamily(*_DOCTOR_FINDINGS, labels=["check", "severity"])
    for (check, severity), count in sorted(counts.items()):
        family.add_metric([check, severity], count)
    return family


_queue_collector: QueueCollector | None = None
_doctor_collector: DoctorCollector | None = None
_queue_collector_lock = threading.Lock()


def register_queue_collector(registry: CollectorRegistry = REGISTRY) -> QueueCollector:
    """Register the queue gauges in ``registry`` (once; the app does it at startup), and
    the doctor's unless DOCTOR_METRICS_SECONDS is None."""
    global _queue_collector, _doctor_collector
    with _queue_collector_lock:
        if _queue_collector is None:
            _queue_collector = QueueCollector()
            registry.register(_queue_collector)
        if _doctor_collector is None and get_settings().DOCTOR_METRICS_SECONDS is not None:
            _doctor_collector = DoctorCollector()
            registry.register(_doctor_collector)
        return _queue_collector


def unregister_queue_collector(registry: CollectorRegistry = REGISTRY) -> None:
    global _queue_collector, _doctor_collector
    with _queue_collector_lock:
        if _queue_collector is not None:
            registry.unregister(_queue_collector)
            _queue_collector = None
        if _doctor_collector is not None:
            registry.unregister(_doctor_collector)
            _doctor_collector = None
