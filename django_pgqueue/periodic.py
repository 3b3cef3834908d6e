"""Schedules declared in code: the public path, ``django_pgqueue.periodic``
(docs/periodic.md, docs/api.md).

The code lives in django_pgqueue/tasking/periodic.py, in its layer
(docs/architecture.md); this module only names what a project may import from here.
"""

from django_pgqueue.tasking.periodic import (
    ScheduleDefinition,
    ScheduleNotDeclared,
    periodic,
    run_now,
    schedules,
)

__all__ = [
    "ScheduleDefinition",
    "ScheduleNotDeclared",
    "periodic",
    "run_now",
    "schedules",
]
