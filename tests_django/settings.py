"""Settings for Django's Tasks tests on PgQueueBackend (tests_django/run.py).

DATABASE_URL names the PostgreSQL server; Django's test runner creates (and drops) a
``test_`` database next to the one it names.
"""

import os
from urllib.parse import unquote, urlsplit

_url = urlsplit(os.environ["DATABASE_URL"])

SECRET_KEY = "tests-only"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_pgqueue"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/") or "postgres",
        "USER": unquote(_url.username or "postgres"),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
    }
}

# Django's test tasks (the package "tasks", extracted by run.py) are imported at startup,
# which registers them for the workers the tests run in this process.
PGQUEUE = {"QUEUES": ["default"], "TASK_MODULES": ["tasks.tasks"], "POLL_INTERVAL": 0.2}
TASKS = {"default": {"BACKEND": "tests_django.backends.InspectablePgQueueBackend"}}

# Keep the worker's own INFO lines out of the test output; Django's "django.tasks"
# logger is left alone, since the tests read it.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"django_pgqueue": {"level": "WARNING"}},
}
