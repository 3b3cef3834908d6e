"""The package's Django signals: the public path, ``django_pgqueue.signals``
(docs/logging.md, docs/api.md).

The code lives in django_pgqueue/core/signals.py, in its layer (docs/architecture.md);
this module only names what a project may import from here.
"""

from django_pgqueue.core.signals import (
    task_settled,
    task_started,
    tasks_imported,
)

__all__ = [
    "task_settled",
    "task_started",
    "tasks_imported",
]
