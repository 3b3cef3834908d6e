"""Settings of the benchmark: DATABASE_URL, or an embedded server in .pgdata/bench."""

import json
import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "benchmark"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_pgqueue"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": environ.Env.db_url_config(os.environ["DATABASE_URL"])}
else:
    from django_pgqueue.core.embedded import embedded_database_url

    DATABASES = {
        "default": environ.Env.db_url_config(
            embedded_database_url(BASE_DIR / ".pgdata" / "bench", dbname="pgqueue_bench")
        )
    }

# python -m benchmarks.connections: the handlers' Django connections from Django's
# connection pool of this max_size (needs psycopg_pool), or kept between tasks for this
# CONN_MAX_AGE. The worker's own connections use neither.
if os.environ.get("PGQUEUE_BENCH_POOL"):
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 2,
        "max_size": int(os.environ["PGQUEUE_BENCH_POOL"]),
    }
if os.environ.get("PGQUEUE_BENCH_CONN_MAX_AGE"):
    DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ["PGQUEUE_BENCH_CONN_MAX_AGE"])

PGQUEUE = {
    "TASK_MODULES": ["benchmarks.tasks"]
    + (["benchmarks.async_tasks"] if os.environ.get("PGQUEUE_BENCH_ASYNC_TASKS") == "1" else [])
    # W2a-keys: tasks with a per-key rate or concurrency that never binds.
    + (["benchmarks.key_tasks"] if os.environ.get("PGQUEUE_BENCH_KEYS") == "1" else [])
    # python -m benchmarks.tenants: fair, sequenced and batch tasks.
    + (["benchmarks.tenant_tasks"] if os.environ.get("PGQUEUE_BENCH_TENANTS") == "1" else []),
    # benchmarks/history.py: retention at a sustained rate, with a short time to live and
    # a short prune interval (the suite's other workloads keep every row for the run).
    "PRUNE_INTERVAL": float(os.environ.get("PGQUEUE_BENCH_PRUNE_INTERVAL", 3600.0)),
    **(
        {"RESULT_TTL": float(os.environ["PGQUEUE_BENCH_RESULT_TTL"])}
        if os.environ.get("PGQUEUE_BENCH_RESULT_TTL")
        else {}
    ),
    **(
        {"PRUNE_BATCH": int(os.environ["PGQUEUE_BENCH_PRUNE_BATCH"])}
        if os.environ.get("PGQUEUE_BENCH_PRUNE_BATCH")
        else {}
    ),
    # W1 encrypted and W2a-encrypt: the key of sealed_noop's payloads (a benchmark's own;
    # plain tasks never use it).
    "ENCRYPTION_KEYS": ["b3vb8cHi1DDFP1yuXr3wqfjILx9lIGn0wbqVc1ExmF4="],
    # W2a-async: the opt-in asynchronous claims, measured against the default.
    "ASYNC_CLAIMS": os.environ.get("PGQUEUE_BENCH_ASYNC_CLAIMS") == "1",
    # To measure other prefetch depths than the default (CONCURRENCY).
    "PREFETCH": int(os.environ["PGQUEUE_BENCH_PREFETCH"])
    if os.environ.get("PGQUEUE_BENCH_PREFETCH")
    else None,
    # W2a-limits: a concurrency and a rate limit on the drained queue that never bind
    # (the drain runs at most CONCURRENCY x 4 tasks and some 20,000/s): their cost alone.
    # PGQUEUE_BENCH_LIMITS may also be the JSON of the default queue's limits.
    "QUEUE_LIMITS": {
        "default": json.loads(os.environ["PGQUEUE_BENCH_LIMITS"])
        if os.environ["PGQUEUE_BENCH_LIMITS"] != "1"
        else {"concurrency": 1000, "rate": "1000000/s"}
    }
    if os.environ.get("PGQUEUE_BENCH_LIMITS")
    else {},
    # W2a-tasklogs: the handlers' records kept with their tasks, at this level.
    "TASK_LOGS": os.environ.get("PGQUEUE_BENCH_TASK_LOGS") or None,
}

# W2a-middleware: one no-op task middleware (benchmarks/middleware.py).
if os.environ.get("PGQUEUE_BENCH_MIDDLEWARE") == "1":
    PGQUEUE["MIDDLEWARE"] = ["benchmarks.middleware.Passthrough"]
# W2a-otel: "sdk" sets up OpenTelemetry's SDK (a TracerProvider without an exporter:
# no span could reach anyone, so none is made); "export" adds a batch processor with an
# exporter that drops what it is given (every span made, batched and handed over: the
# cost of tracing itself); "off" makes opentelemetry unimportable, as if it were not
# installed (docs/tracing.md).
if os.environ.get("PGQUEUE_BENCH_OTEL") in ("sdk", "export"):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    if os.environ["PGQUEUE_BENCH_OTEL"] == "export":
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class _Dropped(SpanExporter):
            def export(self, spans: object) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    trace.set_tracer_provider(provider)
elif os.environ.get("PGQUEUE_BENCH_OTEL") == "off":
    import sys

    sys.modules["opentelemetry"] = None

# W1's framework variant (benchmarks/framework_tasks.py): Django's Tasks framework on
# this queue, when the framework is there (Django 6, or the django-tasks backport).
try:
    import django.tasks  # noqa: F401

    _framework = True
except ImportError:
    try:
        import django_tasks  # noqa: F401

        _framework = True
        INSTALLED_APPS.append("django_tasks")
    except ImportError:
        _framework = False
if _framework:
    TASKS = {"default": {"BACKEND": "django_pgqueue.backends.PgQueueBackend"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_pgqueue": {"handlers": ["console"], "level": "WARNING"},
        # W2a-tasklogs: benchmarks.tasks.chatty's records are made (and written nowhere
        # but to the tasks' logs, with TASK_LOGS).
        "benchmarks.tasks": {"level": "INFO"},
    },
}
