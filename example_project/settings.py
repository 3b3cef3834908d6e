"""Settings of the example site.

DATABASE_URL selects the database (any postgres:// URL). Without it, an embedded
PostgreSQL is started in .pgdata/example (see django_pgqueue.embedded).
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env(DEBUG=(bool, False))

SECRET_KEY = env("SECRET_KEY", default="example-only-not-secret")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "django_pgqueue",
    "example_project.shop",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # The admin's CSS and JavaScript, collected into STATIC_ROOT (manage.py collectstatic;
    # the demo runs it), served with DEBUG=False as in production.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
WSGI_APPLICATION = "example_project.wsgi.application"

if "DATABASE_URL" in env:
    DATABASES = {"default": env.db("DATABASE_URL")}
else:
    from django_pgqueue.core.embedded import embedded_database_url

    DATABASES = {
        "default": env.db_url_config(embedded_database_url(BASE_DIR / ".pgdata" / "example"))
    }

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
STATIC_ROOT = env("STATIC_ROOT", default=str(BASE_DIR / "staticfiles"))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

PGQUEUE = {
    "QUEUES": ["default", "emails"],
    # The email provider takes 4 sends a second, however many workers run (docs/limits.md).
    "QUEUE_LIMITS": {"emails": {"rate": "4/s"}},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"pgqueue": {"()": "django_pgqueue.worker.logging.ExecutionFilter"}},
    "formatters": {
        "plain": {
            "format": "%(asctime)s %(levelname)s %(name)s [%(pgqueue_execution)s]: %(message)s"
        }
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["pgqueue"],
        }
    },
    "loggers": {"django_pgqueue": {"handlers": ["console"], "level": "INFO"}},
}
