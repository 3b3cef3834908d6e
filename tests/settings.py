"""Settings for the test suite and for the worker subprocesses the tests start.

With DATABASE_URL set, the tests use that server. Without it, conftest.py starts an
embedded PostgreSQL once per test run and fills in the connection below; worker
subprocesses always receive DATABASE_URL (pointing at the test database).
"""

import os

import django
import environ

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_pgqueue",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": environ.Env.db_url_config(os.environ["DATABASE_URL"])}
else:
    # Filled in by the session fixture in tests/conftest.py (embedded server).
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "pgqueue",
            "USER": "postgres",
        }
    }

# tests/test_databases.py: a second database for the queues of PGQUEUE['DATABASES'],
# on the same server (pytest-django creates its test database only for the tests that
# ask for it: databases=[..., "queue2"]). Its name follows the default's, so a worker
# subprocess given the test database's URL finds the second test database too.
DATABASES["queue2"] = {**DATABASES["default"], "NAME": DATABASES["default"]["NAME"] + "_queue2"}

PGQUEUE = {
    "QUEUES": ["default"],
    "TASK_MODULES": [
        "tests.tasks", "tests.framework_tasks", "tests.fault_tasks", "tests.ledger_tasks",
        "tests.prefork_tasks", "tests.workflow_tasks", "tests.periodic_tasks",
        "tests.testing_tasks",

        "tests.rule_tasks", "tests.atomic_tasks",
    ],
    "DEFAULT_BACKOFF": {"base": 0.05, "factor": 2.0, "cap": 0.2, "jitter": 0.0},
    "POLL_INTERVAL": 0.5,
    # Queues of tests/test_limits.py only (a worker applies the limits of its queues).
    "QUEUE_LIMITS": {
        "limited": {"concurrency": 3},
        "rated": {"rate": "10/s"},
        "limited_rated": {"concurrency": 2, "rate": "20/s"},
    },
}
# tests/conftest.py, PLAIN_CLAIM_ENV: a worker without the ledger's tasks limited by key
# (key_concurrency, key_rate), so that its claims are claim_plain (the full claim, once
# per starvation window).
if os.environ.get("PGQUEUE_TEST_PLAIN_CLAIM"):
    PGQUEUE["TASK_MODULES"].remove("tests.ledger_tasks")
# tests/test_pgbouncer.py: workers behind a transaction pooler, with a direct address for
# LISTEN (or without one, polling).
if os.environ.get("PGQUEUE_TEST_TRANSACTION_POOLER"):
    PGQUEUE["TRANSACTION_POOLER"] = True
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
if os.environ.get("PGQUEUE_TEST_LISTEN_URL"):
    DATABASES["direct"] = environ.Env.db_url_config(os.environ["PGQUEUE_TEST_LISTEN_URL"])
    PGQUEUE["LISTEN_DATABASE"] = "direct"
# tests/test_databases.py: queues "q2" and "q2b" on the second database.
TEST_DATABASES = {"q2": "queue2", "q2b": "queue2"}
if os.environ.get("PGQUEUE_TEST_DATABASES"):
    PGQUEUE["DATABASES"] = TEST_DATABASES
# tests/test_watchdog.py shrinks the watchdog's thresholds in the workers it starts.
if "PGQUEUE_TEST_TIMEOUT_GRACE" in os.environ:
    PGQUEUE["TIMEOUT_GRACE"] = float(os.environ["PGQUEUE_TEST_TIMEOUT_GRACE"])
if "PGQUEUE_TEST_WRITE_OFF_LIMIT" in os.environ:
    PGQUEUE["WRITE_OFF_LIMIT"] = int(os.environ["PGQUEUE_TEST_WRITE_OFF_LIMIT"])
if "PGQUEUE_TEST_WRITE_OFF_EXIT_AFTER" in os.environ:
    PGQUEUE["WRITE_OFF_EXIT_AFTER"] = float(os.environ["PGQUEUE_TEST_WRITE_OFF_EXIT_AFTER"])
# tests/test_outage.py shortens dead-connection detection in the workers it starts.
if "PGQUEUE_TEST_DEAD_CONNECTION_TIMEOUT" in os.environ:
    PGQUEUE["DEAD_CONNECTION_TIMEOUT"] = float(os.environ["PGQUEUE_TEST_DEAD_CONNECTION_TIMEOUT"])
# tests/test_fair.py: the many-tenants tasks, in the workers these tests start only.
if os.environ.get("PGQUEUE_TEST_TENANTS"):
    PGQUEUE["TASK_MODULES"].append("tests.tenant_tasks")
# tests/test_sizes.py: its tasks, and the claim batch bound of the workers it starts.
PGQUEUE["TASK_MODULES"].append("tests.size_tasks")
PGQUEUE["TASK_MODULES"].append("tests.recycle_tasks")
PGQUEUE["TASK_MODULES"].append("tests.unique_tasks")
# tests/test_encryption.py: its tasks, and the keys of encrypted payloads (newest first;
# test keys, nothing else uses them), which the workers it starts may be given others of.
PGQUEUE["TASK_MODULES"].append("tests.encrypt_tasks")
TEST_ENCRYPTION_KEY = "98AifONNE6A_AnH56jr4LB-Iwg3mqDo_cdaMGTLbJfs="
PGQUEUE["ENCRYPTION_KEYS"] = [
    key
    for key in os.environ.get("PGQUEUE_TEST_ENCRYPTION_KEYS", TEST_ENCRYPTION_KEY).split(",")
    if key
]

# tests/test_task_logs.py: its tasks, and the task logs of the workers it starts.
PGQUEUE["TASK_MODULES"].append("tests.task_log_tasks")
for _key in ("TASK_LOGS", "TASK_LOG_RECORDS", "TASK_LOG_BYTES", "TASK_LOG_TASK_BYTES"):
    if f"PGQUEUE_TEST_{_key}" in os.environ:
        _value = os.environ[f"PGQUEUE_TEST_{_key}"]
        PGQUEUE[_key] = _value if _key == "TASK_LOGS" else int(_value)
# tests/test_setup_mistakes.py: a module that does not exist (a typo), in the processes
# it starts.
if os.environ.get("PGQUEUE_TEST_MISSING_TASK_MODULE"):
    PGQUEUE["TASK_MODULES"].append(os.environ["PGQUEUE_TEST_MISSING_TASK_MODULE"])
if "PGQUEUE_TEST_CLAIM_BATCH_BYTES" in os.environ:
    PGQUEUE["CLAIM_BATCH_BYTES"] = int(os.environ["PGQUEUE_TEST_CLAIM_BATCH_BYTES"])

# Django's Tasks framework on this queue (tests/test_backend.py). "patient" retries an
# hour later and times attempts out after 1 s, so a test can watch a task between tries.
TASKS = {
    "default": {
        "BACKEND": "django_pgqueue.backends.PgQueueBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "max_attempts": 3,
            "backoff": {"base": 0.05, "factor": 1.0, "cap": 0.05, "jitter": 0.0},
        },
    },
    "patient": {
        "BACKEND": "django_pgqueue.backends.PgQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"max_attempts": 2, "backoff": 3600, "timeout": 1},
    },
}
if django.VERSION < (6, 0):  # the backport; Django 6 has django.tasks built in
    INSTALLED_APPS.append("django_tasks")
# "emails" and "other" are served by workers started with --queues, and the queues of
# QUEUE_LIMITS and DATABASES are named only at enqueue (their warnings would fill worker
# logs); tests/test_checks.py runs these checks with nothing silenced.
SILENCED_SYSTEM_CHECKS = [
    "django_pgqueue.W101", "django_pgqueue.W003", "django_pgqueue.W004", "django_pgqueue.W005",
]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(process)d %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_pgqueue": {"handlers": ["console"], "level": "INFO"},
        "tests.task_log_tasks": {"level": "DEBUG"},
    },
}
# tests/test_logging.py: LOGGING with no handler (the worker adds its own), or with
# django_pgqueue at another level.
if os.environ.get("PGQUEUE_TEST_LOGGING") == "no-handlers":
    LOGGING["loggers"] = {"tests.tasks": {"level": "INFO"}}
if os.environ.get("PGQUEUE_TEST_LOGGING_LEVEL"):
    LOGGING["loggers"]["django_pgqueue"]["level"] = os.environ["PGQUEUE_TEST_LOGGING_LEVEL"]
# tests/test_logging.py: Sentry in the workers it starts, its events written to a file.
if os.environ.get("PGQUEUE_TEST_SENTRY_EVENTS"):
    from tests import sentry_capture

    sentry_capture.init()
# tests/test_middleware.py: the task middleware of the workers it starts (comma-separated
# dotted paths), and the module of its middleware, tasks and task_started receivers.
PGQUEUE["TASK_MODULES"].append("tests.middleware_fixtures")
if os.environ.get("PGQUEUE_TEST_MIDDLEWARE"):
    PGQUEUE["MIDDLEWARE"] = os.environ["PGQUEUE_TEST_MIDDLEWARE"].split(",")
# tests/test_tracing.py: OpenTelemetry in the workers it starts, its spans written to a file.
if os.environ.get("PGQUEUE_TEST_SPANS"):
    from tests import span_capture

    span_capture.init()
# tests/test_soak.py: the soak's tasks, queues, limits and a short retention, in the
# workers and the enqueuer it starts.
if os.environ.get("PGQUEUE_TEST_SOAK"):
    # The same names and limits as tests/soak_tasks.py (not imported here: it declares
    # tasks, which needs the apps loaded).
    PGQUEUE["TASK_MODULES"].append("tests.soak_tasks")
    PGQUEUE["QUEUES"] = ["default", "soak_limited", "soak_rated"]
    PGQUEUE["QUEUE_LIMITS"] = {"soak_limited": {"concurrency": 2}, "soak_rated": {"rate": "10/s"}}
    PGQUEUE["RESULT_TTL"] = PGQUEUE["DEAD_TTL"] = float(os.environ["PGQUEUE_TEST_SOAK"])
    PGQUEUE["PRUNE_INTERVAL"] = 2.0
# tools/mutate_sql.py: a file of named statements (a mutant's) that replace the
# package's, in the test process and in every worker subprocess it starts.
if os.environ.get("PGQUEUE_TEST_QUERIES"):
    from pathlib import Path

    from django_pgqueue.db import sql

    sql.QUERIES.update(sql._load(Path(os.environ["PGQUEUE_TEST_QUERIES"])))
