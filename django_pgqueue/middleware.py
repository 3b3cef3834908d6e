"""Task middleware: the public path, ``django_pgqueue.middleware`` (docs/middleware.md,
docs/api.md).

The code lives in django_pgqueue/tasking/middleware.py, in its layer
(docs/architecture.md); this module only names what a project may import from here.
"""

from django_pgqueue.tasking.middleware import (
    TaskMiddleware,
)

__all__ = [
    "TaskMiddleware",
]
