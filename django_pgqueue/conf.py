"""Settings, read in one place.

Everything is configured through one dict in the project's settings::

    PGQUEUE = {"LEASE_SECONDS": 30, "QUEUES": ["default", "emails"]}

``docs/settings.md`` documents each key; ``DEFAULTS`` below is the source of truth for
the default values, and ``checks.py`` turns bad values into ``manage.py check`` errors.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings as django_settings

DEFAULTS: dict[str, Any] = {
    # Which database alias holds the task table.
    "DATABASE": "default",
    # Extra modules to import so their @task functions are registered (each installed
    # app's ``tasks`` module is imported automatically).
    "TASK_MODULES": [],
    # Enqueue defaults.
    "DEFAULT_QUEUE": "default",
    "DEFAULT_PRIORITY": 0,
    "DEFAULT_MAX_ATTEMPTS": 3,
    # Seconds one attempt may run unless its task says otherwise: every task gets a
    # ceiling, so a hung handler cannot hold its slot forever. @task(timeout=None) opts
    # one task out; None here removes the default ceiling for all tasks.
    "DEFAULT_TIMEOUT": 3600.0,
    "DEFAULT_BACKOFF": {"base": 5.0, "factor": 2.0, "cap": 600.0, "jitter": 0.25},
    # Worker.
    "QUEUES": ["default"],
    "CONCURRENCY": 10,
    "PROCESSES": 1,
    "LEASE_SECONDS": 30.0,
    "HEARTBEAT_SECONDS": 10.0,
    "POLL_INTERVAL": 2.0,
    "SWEEP_INTERVAL": 1.0,
    "SHUTDOWN_GRACE": 25.0,
    "STARVATION_TIMEOUT": 60.0,
    "TIMEOUT_GRACE": 10.0,
    "WRITE_OFF_LIMIT": 3,
    # "thread": handlers run in the worker's slot threads. "process": each slot owns a
    # child process (the prefork pool), so a handler past its timeout, or cancelled with
    # hard=True, is killed: told to stop, then SIGKILLed after KILL_GRACE seconds.
    "EXECUTION": "thread",
    "KILL_GRACE": 2.0,
    "PREPARED_STATEMENTS": True,
    # How long a worker connection may go without an answer from PostgreSQL before it is
    # taken for dead and dropped: bounds each statement (a server that is working on it
    # is left alone), a connection attempt (at most 5 s) and, through TCP keepalives and
    # tcp_user_timeout, an idle or sending socket whose packets are lost.
    "DEAD_CONNECTION_TIMEOUT": 15.0,
    # Commit claims without waiting for the WAL flush. Faster, but a
    # PostgreSQL crash can forget a claim whose handler is already running, and another
    # worker then starts the same attempt beside it (docs/guarantees.md). Opt-in only.
    "ASYNC_CLAIMS": False,
    "METRICS_PORT": None,
    # Queue gauges read from the database (docs/metrics.md): registered in
    # prometheus_client's default registry, which django-prometheus serves from the web
    # process; served by a worker's --metrics-port only with WORKER_QUEUE_METRICS; read
    # at most once per METRICS_CACHE_SECONDS per process, however often it is scraped.
    "QUEUE_METRICS": True,
    "WORKER_QUEUE_METRICS": False,
    "METRICS_CACHE_SECONDS": 10.0,
    # Retention (seconds).
    "RESULT_TTL": 24 * 3600.0,
    "DEAD_TTL": 7 * 24 * 3600.0,
    "PRUNE_INTERVAL": 60.0,
    "PRUNE_BATCH": 1000,
    "WORKER_STALE_AFTER": 60.0,
    # The worker vacuums the task table itself once this many dead tuples pile up
    # (checked every VACUUM_INTERVAL seconds; None disables it and leaves autovacuum).
    "VACUUM_INTERVAL": 5.0,
    "VACUUM_THRESHOLD": 20000,
    # A pending task that no live worker can run (unknown name or version) is failed
    # with an explanation after waiting this long; None keeps it pending forever.
    "UNROUTABLE_TTL": 24 * 3600.0,
}


@dataclass(frozen=True)
class PgQueueSettings:
    DATABASE: str
    TASK_MODULES: list[str]
    DEFAULT_QUEUE: str
    DEFAULT_PRIORITY: int
    DEFAULT_MAX_ATTEMPTS: int
    DEFAULT_TIMEOUT: float | None
    DEFAULT_BACKOFF: dict[str, float]
    QUEUES: list[str]
    CONCURRENCY: int
    PROCESSES: int
    LEASE_SECONDS: float
    HEARTBEAT_SECONDS: float
    POLL_INTERVAL: float
    SWEEP_INTERVAL: float
    SHUTDOWN_GRACE: float
    STARVATION_TIMEOUT: float
    TIMEOUT_GRACE: float
    WRITE_OFF_LIMIT: int
    EXECUTION: str
    KILL_GRACE: float
    PREPARED_STATEMENTS: bool
    DEAD_CONNECTION_TIMEOUT: float
    ASYNC_CLAIMS: bool
    METRICS_PORT: int | None
    QUEUE_METRICS: bool
    WORKER_QUEUE_METRICS: bool
    METRICS_CACHE_SECONDS: float
    RESULT_TTL: float
    DEAD_TTL: float
    PRUNE_INTERVAL: float
    PRUNE_BATCH: int
    WORKER_STALE_AFTER: float
    VACUUM_INTERVAL: float | None
    VACUUM_THRESHOLD: int
    UNROUTABLE_TTL: float | None


def unknown_keys() -> list[str]:
    """Keys in settings.PGQUEUE that this version does not know (reported by checks)."""
    configured = getattr(django_settings, "PGQUEUE", {}) or {}
    return sorted(set(configured) - set(DEFAULTS))


def get_settings() -> PgQueueSettings:
    """The effective settings: DEFAULTS overlaid with ``settings.PGQUEUE``.

    Read on every call (cheap) so ``override_settings`` works in tests.
    """
    configured = getattr(django_settings, "PGQUEUE", {}) or {}
    values = {f.name: configured.get(f.name, DEFAULTS[f.name]) for f in fields(PgQueueSettings)}
    backoff = dict(DEFAULTS["DEFAULT_BACKOFF"])
    backoff.update(values["DEFAULT_BACKOFF"] or {})
    values["DEFAULT_BACKOFF"] = backoff
    return PgQueueSettings(**values)
