"""W1's Django Tasks framework variant: a no-op decorated with the framework's own
``@task`` (django.tasks on Django 6, the django_tasks backport on 5.2), enqueued through
``django_pgqueue.backends.PgQueueBackend`` (TASKS in benchmarks/settings.py)."""

from django_pgqueue.core.compat import task


@task
def noop(n: int) -> None:
    return None
