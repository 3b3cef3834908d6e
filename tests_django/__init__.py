"""Django's own Tasks tests (Django 6's tests/tasks) run against PgQueueBackend.

Not collected by the main pytest run (its testpaths is tests/). Run it with
``tox -e django-tasks`` or ``python tests_django/run.py``; docs/tasks-framework.md
says what is run, adapted or skipped, and why.
"""
