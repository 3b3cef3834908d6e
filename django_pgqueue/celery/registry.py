"""The Celery-style tasks of this process, by name (Celery's ``app.tasks``), and
Celery's default task naming.

Each one is also a task of django_pgqueue's registry (registry.py) under the same
name, registered once Django's settings are loaded: a worker finds it there, by name,
like any other task.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from django_pgqueue.celery.exceptions import NotRegistered

if TYPE_CHECKING:
    from django_pgqueue.celery.task import Task

_tasks: dict[str, Task] = {}
_lock = threading.Lock()


def task_name(module: str, name: str, main: str | None) -> str:
    """Celery's default name of a task: its module's dotted path and its function's
    name (a function of ``__main__`` takes the app's main name instead)."""
    if module == "__main__" and main:
        module = main
    return ".".join(part for part in (module, name) if part)


def register(task: Task) -> None:
    with _lock:
        _tasks[task.name] = task


def unregister(name: str) -> None:
    with _lock:
        _tasks.pop(name, None)


def get(name: str) -> Task:
    try:
        return _tasks[name]
    except KeyError:
        known = ", ".join(sorted(_tasks)) or "(none)"
        raise NotRegistered(
            f"task {name!r} is not registered in this process; known Celery-style "
            f"tasks: {known}"
        ) from None


def find(name: str) -> Task | None:
    return _tasks.get(name)


def all_tasks() -> dict[str, Task]:
    return dict(_tasks)
