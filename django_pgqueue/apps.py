from __future__ import annotations

from django.apps import AppConfig


class PgQueueConfig(AppConfig):
    name = "django_pgqueue"
    label = "django_pgqueue"
    verbose_name = "Task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_pgqueue import checks  # noqa: F401  (registers the system checks)
        from django_pgqueue.registry import autodiscover
        from django_pgqueue.signals import tasks_imported

        autodiscover()
        tasks_imported.send(sender=self)

        from django_pgqueue.conf import get_settings

        if get_settings().QUEUE_METRICS:
            # The queue gauges join the default Prometheus registry, which
            # django-prometheus serves (docs/metrics.md). Nothing is read until a scrape.
            from django_pgqueue.metrics import register_queue_collector

            register_queue_collector()
