"""Defining, enqueuing and scheduling tasks: ``@task`` and the registry, the enqueue,
middleware and tracing, workflows, what a handler receives (``context``, ``batch``),
and the schedules (``schedule``, ``periodic``, ``runtime_schedules``).

Named ``tasking`` rather than ``tasks``: Django and Celery import every installed app's
``tasks`` module as its task definitions, and this package is an installed app. The
documented modules keep their public paths (``django_pgqueue.registry``,
``.middleware``, ``.workflows``, ``.periodic``); docs/architecture.md.
"""
