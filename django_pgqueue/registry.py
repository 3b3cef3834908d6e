"""``@task`` and the task definitions it makes: the public path,
``django_pgqueue.registry`` (docs/tasks-arguments.md, docs/api.md).

The code lives in django_pgqueue/tasking/registry.py, in its layer
(docs/architecture.md); this module only names what a project may import from here.
"""

# Once defined in the registry, and docs/architecture.md names this path; the check
# lives in core/options.py. Importable from here, not part of __all__.
from django_pgqueue.core.options import validate_queue as validate_queue
from django_pgqueue.tasking.registry import (
    ContextTaskDefinition,
    TaskDefinition,
    TaskOptions,
    UsingOptions,
    task,
)

__all__ = [
    "ContextTaskDefinition",
    "TaskDefinition",
    "TaskOptions",
    "UsingOptions",
    "task",
]
