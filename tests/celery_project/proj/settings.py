"""The suite's settings (its database and PGQUEUE), with the Celery project's app and
Celery settings."""

from django_pgqueue.celery import crontab  # was: from celery.schedules import crontab
from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, PGQUEUE

INSTALLED_APPS = [*INSTALLED_APPS, "tests.celery_project.shop"]
PGQUEUE = {**PGQUEUE, "QUEUES": ["default", "emails"]}

# Celery's settings, as the project had them.
CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"  # no longer used: priorities read as Redis's
CELERY_RESULT_BACKEND = "redis://127.0.0.1:6379/1"  # no longer used: results are rows
CELERY_TIMEZONE = "Europe/Paris"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ROUTES = {
    "tests.celery_project.shop.tasks.send_welcome_email": {"queue": "emails"},
}
CELERY_BEAT_SCHEDULE = {
    "add-every-second": {
        "task": "tests.celery_project.shop.tasks.add",
        "schedule": 1.0,
        "args": (16, 16),
    },
    "report-monday-morning": {
        "task": "tests.celery_project.shop.tasks.report",
        "schedule": crontab(hour=7, minute=30, day_of_week=1),
        "options": {"queue": "emails"},
    },
}
