from __future__ import annotations

from django.apps import AppConfig


class PgQueueConfig(AppConfig):
    name = "django_pgqueue"
    label = "django_pgqueue"
    verbose_name = "Task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_pgqueue import checks  # noqa: F401  (registers the system checks)
        from django_pgqueue.core.signals import tasks_imported
        from django_pgqueue.tasking.registry import autodiscover

        autodiscover()
        tasks_imported.send(sender=self)

        from django_pgqueue.core.conf import get_settings

        if get_settings().QUEUE_METRICS:
            # The queue gauges join the default Prometheus registry, which
            # django-prometheus serves (docs/metrics.md). Nothing is read until a scrape.
            from django_pgqueue.ops.metrics import register_queue_collector

            register_queue_collector()
