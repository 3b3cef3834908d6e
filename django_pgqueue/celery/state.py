"""What is current in this thread: the running task (``current_task``), and the
current Celery app (``current_app``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_local = threading.local()


def push_task(task: Any) -> None:
    stack = getattr(_local, "tasks", None)
    if stack is None:
        stack = _local.tasks = []
    stack.append(task)


def pop_task() -> None:
    _local.tasks.pop()


def get_current_task() -> Any:
    """The task whose function runs in this thread now (None outside one)."""
    stack = getattr(_local, "tasks", None)
    return stack[-1] if stack else None


_current_app: Any = None
_default_app: Any = None
# Makes the default app (app.py sets it: an app is made only where apps are defined).
default_app_factory: Callable[[], Any] | None = None


def set_current_app(app: Any) -> None:
    global _current_app
    _current_app = app


def get_current_app() -> Any:
    """The app set as current (the last Celery(...) created), else a default one."""
    global _default_app
    if _current_app is not None:
        return _current_app
    if _default_app is None:
        assert default_app_factory is not None, "django_pgqueue.celery.app sets it"
        _default_app = default_app_factory()
    return _default_app


class Proxy:
    """``current_app`` / ``current_task``: an object that forwards to what is current
    when used."""

    def __init__(self, target: Any, name: str) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_name", name)

    def _get_current_object(self) -> Any:
        return self._target()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target(), name, value)

    def __bool__(self) -> bool:
        return bool(self._target())

    def __eq__(self, other: object) -> bool:
        return self._target() == other

    def __hash__(self) -> int:
        return hash(self._target())

    def __repr__(self) -> str:
        return repr(self._target())
