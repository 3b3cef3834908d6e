from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "tests.celery_project.shop"
    label = "shop"

    def ready(self):
        from tests.celery_project.shop import signals  # noqa: F401  (connects the receivers)
