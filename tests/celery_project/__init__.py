"""A Django project written for Celery, as Celery's documentation writes one, ported
to django_pgqueue.celery by changing its imports only (tests/test_celery_port.py runs
it with real workers: ``DJANGO_SETTINGS_MODULE=tests.celery_project.proj.settings``).

Every line that differs from the Celery original carries ``# was: from celery...``.
"""
