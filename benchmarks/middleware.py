"""The no-op task middleware of W2a-middleware: the cost of the execution hook's
machinery alone (a TaskContext per task, one closure per middleware)."""

from collections.abc import Callable
from typing import Any

from django_pgqueue.tasking.context import TaskContext
from django_pgqueue.tasking.middleware import TaskMiddleware


class Passthrough(TaskMiddleware):
    def execute(self, context: TaskContext, call_next: Callable[[], Any]) -> Any:
        return call_next()
