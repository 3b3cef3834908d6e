"""A module of tasks under another name than tasks.py (autodiscover_tasks(related_name=...))."""

from django_pgqueue.celery import shared_task  # was: from celery import shared_task


@shared_task
def nightly_cleanup():
    return "cleaned"
