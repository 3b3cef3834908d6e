"""Celery's task signals (``celery.signals``), with Celery's arguments.

Sent where a project hooks them for logging and tracing:

- ``before_task_publish`` / ``after_task_publish``: around the INSERT of
  ``delay()``, ``apply_async()`` and ``send_task()``, in the caller's process and
  transaction. ``sender`` is the task's name; ``body`` is ``(args, kwargs, embed)``,
  ``headers`` Celery's protocol-2 headers (``id``, ``task``, ``eta``, ``expires``,
  ``retries``, ...), ``routing_key`` the queue, ``exchange`` ``""``. The task's id is
  the row's, given by the INSERT: ``headers["id"]`` is None before it (unless the call
  passed ``task_id=``) and the id after. Keys a receiver of ``before_task_publish`` adds
  to ``headers`` travel with the task (its metadata) and reach ``self.request.headers``.
- ``task_prerun``, ``task_postrun``, ``task_success``, ``task_failure``,
  ``task_retry``: in the worker, on the task's thread, around its function; ``sender``
  is the task object. They run before the outcome is written (as Celery sends them
  before the message is acknowledged).

``connect`` works as Celery's: ``@task_failure.connect``, ``@task_failure.connect(sender=
task)``, and returns the receiver. Receivers take ``**kwargs``. An exception in a
receiver is logged and does not change the task. Every other Celery signal
(``worker_ready``, ``worker_process_init``, ``celeryd_init``, ``setup_logging``,
``beat_init``...) raises an ImportError that names what to use instead.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal as DjangoSignal

from django_pgqueue.celery.exceptions import UnsupportedImport

logger = logging.getLogger("django_pgqueue.celery")


class Signal(DjangoSignal):
    """A Django signal that connects as Celery's does: as a decorator with or without
    arguments, returning the receiver, and with a task name as ``sender`` matched by
    value."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def connect(  # type: ignore[override]
        self,
        receiver: Callable[..., Any] | None = None,
        sender: Any = None,
        weak: bool = True,
        dispatch_uid: Any = None,
    ) -> Any:
        if receiver is None:

            def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
                self.connect(fn, sender=sender, weak=weak, dispatch_uid=dispatch_uid)
                return fn

            return decorate
        super().connect(receiver, _sender(sender), weak, dispatch_uid)
        return receiver

    def disconnect(  # type: ignore[override]
        self, receiver: Any = None, sender: Any = None, dispatch_uid: Any = None
    ) -> bool:
        return super().disconnect(receiver, _sender(sender), dispatch_uid)

    def send(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:  # type: ignore[override]
        """Every receiver, each exception logged (never raised), as Celery sends."""
        if not self.receivers:
            return []
        responses = super().send_robust(_sender(sender), **named)
        for receiver, response in responses:
            if isinstance(response, Exception):
                logger.error(
                    "Signal handler %r of %s raised: %r",
                    receiver, self.name, response, exc_info=response,
                )  # fmt: skip
        return responses

    def __repr__(self) -> str:
        return f"<Signal: {self.name}>"


def _sender(sender: Any) -> Any:
    """A task name is matched by value (Django matches senders by identity)."""
    return sys.intern(sender) if isinstance(sender, str) else sender


before_task_publish = Signal("before_task_publish")
after_task_publish = Signal("after_task_publish")
task_prerun = Signal("task_prerun")
task_postrun = Signal("task_postrun")
task_success = Signal("task_success")
task_failure = Signal("task_failure")
task_retry = Signal("task_retry")

# Celery's other signals, and what to use here instead.
_UNSUPPORTED = {
    "task_sent": "use before_task_publish / after_task_publish",
    "task_received": (
        "use task_prerun (a task is claimed and started in one step), or "
        "django_pgqueue.signals.task_started"
    ),
    "task_revoked": "use django_pgqueue.signals.task_settled (outcome 'cancelled')",
    "task_rejected": "a row names only registered tasks, and a worker claims only those",
    "task_unknown": (
        "use the queue overview's pending_unroutable count: a task no worker has stays "
        "pending and is counted (docs/tasks.md, routing)"
    ),
    "task_internal_error": "use django_pgqueue.signals.task_settled",
    "worker_init": "use your AppConfig.ready(), which every worker process runs",
    "worker_process_init": "use your AppConfig.ready(), which every worker process runs",
    "worker_process_shutdown": "use atexit in your AppConfig.ready()",
    "worker_ready": "use your AppConfig.ready(); the worker logs 'started' once it claims",
    "worker_shutting_down": "use atexit in your AppConfig.ready()",
    "worker_shutdown": "use atexit in your AppConfig.ready()",
    "worker_before_create_process": "use your AppConfig.ready()",
    "heartbeat_sent": "use the worker table (pgqueue_worker.last_heartbeat)",
    "celeryd_init": "use your AppConfig.ready()",
    "celeryd_after_setup": "use your AppConfig.ready()",
    "import_modules": "use your AppConfig.ready()",
    "setup_logging": "use Django's LOGGING setting (docs/logging.md)",
    "after_setup_logger": "use Django's LOGGING setting (docs/logging.md)",
    "after_setup_task_logger": "use Django's LOGGING setting (docs/logging.md)",
    "beat_init": "there is no beat process, workers run the schedules",
    "beat_embedded_init": "there is no beat process, workers run the schedules",
    "eventlet_pool_started": "the worker has no eventlet pool",
    "eventlet_pool_preshutdown": "the worker has no eventlet pool",
    "eventlet_pool_postshutdown": "the worker has no eventlet pool",
    "eventlet_pool_apply": "the worker has no eventlet pool",
    "user_preload_options": "use runtaskworker's options (docs/worker.md)",
}


def unsupported_signal(name: str) -> UnsupportedImport:
    return UnsupportedImport(
        f"celery.signals.{name} has no counterpart in django_pgqueue.celery: "
        f"{_UNSUPPORTED[name]} (docs/celery.md, 'Signals')"
    )


def __getattr__(name: str) -> Any:
    if name in _UNSUPPORTED:
        raise unsupported_signal(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
