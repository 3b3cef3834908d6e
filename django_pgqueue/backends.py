"""A backend for Django's Tasks framework (``django.tasks`` / the ``django_tasks`` backport).

::

    TASKS = {
        "default": {
            "BACKEND": "django_pgqueue.backends.PgQueueBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"max_attempts": 5, "backoff": {"base": 10}, "timeout": 60, "expires": 3600},
        }
    }

Tasks decorated with the framework's own ``@task`` are enqueued into the queue's table
(in the caller's transaction), run by ``runtaskworker`` beside native tasks, and read
back with ``get_result``. docs/tasks-framework.md describes the mapping and the choices.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.core import checks

from django_pgqueue import framework
from django_pgqueue.core import exceptions as queue_errors
from django_pgqueue.core.compat import (
    BaseTaskBackend,
    InvalidTaskBackendError,
    InvalidTaskError,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from django_pgqueue.core.conf import database_for, get_settings, queue_databases
from django_pgqueue.core.options import (
    validate_backoff,
    validate_expires,
    validate_max_attempts,
    validate_queue,
    validate_timeout,
)
from django_pgqueue.core.retry import RetryPolicy
from django_pgqueue.tasking.enqueue import insert as insert_row

OPTION_NAMES = ("max_attempts", "backoff", "timeout", "expires", "atomic")
_MAX_ID = 2**63 - 1


class PgQueueBackend(BaseTaskBackend):
    """Runs framework Tasks on django_pgqueue's table and workers.

    ``OPTIONS`` (all optional; defaults from ``PGQUEUE``): ``max_attempts``,
    ``backoff`` (a number of seconds or a dict of base/factor/cap/jitter) and
    ``timeout`` (seconds per attempt), ``expires`` (seconds after the enqueue by
    which a task must have started, else it never starts) and ``atomic`` (True: each
    task's handler runs in a transaction that commits with its success, fenced by its
    lease; sync tasks only: an ``async def`` task is refused at enqueue), applied to
    every task enqueued through it.
    """

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = params.get("OPTIONS") or {}
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise InvalidTaskBackendError(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown key(s) {unknown}; "
                f"valid keys: {', '.join(OPTION_NAMES)}"
            )
        conf = get_settings()
        try:
            for queue in self.queues:
                validate_queue(queue)
            self.max_attempts: int = validate_max_attempts(
                options.get("max_attempts", conf.DEFAULT_MAX_ATTEMPTS)
            )
            self.backoff: RetryPolicy = validate_backoff(
                options.get("backoff", conf.DEFAULT_BACKOFF)
            )
            self.timeout: float | None = validate_timeout(
                options.get("timeout", conf.DEFAULT_TIMEOUT)
            )
            expires = options.get("expires")
            self.expires: float | None = (
                None if expires is None else validate_expires(expires, datetime_allowed=False)
            )
            atomic = options.get("atomic", False)
            if not isinstance(atomic, bool):
                raise queue_errors.InvalidTaskError(
                    f"atomic must be True or False, not {atomic!r}"
                )
            self.atomic: bool = atomic
        except queue_errors.InvalidTaskError as exc:
            raise InvalidTaskBackendError(f"TASKS[{alias!r}]: {exc}") from exc

    def validate_task(self, task: Task) -> None:
        """The framework's checks, then register the task so workers can run it.

        Runs when ``@task`` decorates a function (so importing a tasks module fills the
        registry), for every ``using()`` copy, and again on enqueue.
        """
        super().validate_task(task)
        if not self.queues:  # the framework accepts any queue name: check ours
            try:
                validate_queue(task.queue_name)
            except queue_errors.InvalidTaskError as exc:
                raise InvalidTaskError(str(exc)) from exc
        framework.register(task)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Insert the task in the caller's transaction; returns its READY TaskResult."""
        self.validate_task(task)
        definition = framework.register(task)
        args, kwargs = _normalized(task, args, kwargs)
        run_after = task.run_after.isoformat() if task.run_after is not None else None
        if self.atomic and definition.is_async:
            raise queue_errors.InvalidTaskError(
                f"cannot enqueue {task.module_path}: TASKS[{self.alias!r}]['OPTIONS'] has "
                "atomic=True, which needs a plain def task, and this one is an async def "
                "(its awaits share the worker's event loop with other tasks, so its writes "
                "cannot be kept in a transaction of its own); enqueue it through a backend "
                "without atomic, or make it a plain def; nothing was enqueued"
            )
        call = definition.using(
            queue=task.queue_name,
            priority=int(task.priority),
            run_at=task.run_after,
            max_attempts=self.max_attempts,
            backoff=self.backoff,
            timeout=self.timeout,
            expires=self.expires,
            **({"atomic": True} if self.atomic else {}),
            metadata={framework.MARKER: {"backend": self.alias, "run_after": run_after}},
        )
        try:
            task_id, enqueued_at = insert_row(call, args, kwargs)
        except queue_errors.InvalidTaskError as exc:  # its kind kept (TransactionDatabaseError)
            raise type(exc)(f"cannot enqueue {task.module_path}: {exc}") from exc
        result = TaskResult(
            task=task,
            id=framework.result_id(task_id, database_for(task.queue_name)),
            status=TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        framework.send_robust(task_enqueued, result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's current state, or TaskResultDoesNotExist."""
        from django_pgqueue.models import Task as Row

        database, task_id = _parse_id(result_id)
        try:
            row = Row.objects.using(database).get(pk=task_id)
        except Row.DoesNotExist:
            raise TaskResultDoesNotExist(f"no task result with id {result_id!r}") from None
        return framework.result_from_row(row)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        yield from super().check(**kwargs)
        if not apps.is_installed("django_pgqueue"):
            yield checks.Error(
                f"TASKS[{self.alias!r}] uses {type(self).__name__}, but django_pgqueue is "
                "not in INSTALLED_APPS",
                hint="Add 'django_pgqueue' to INSTALLED_APPS and run migrate.",
                id="django_pgqueue.E101",
            )
        unserved = sorted(self.queues - set(get_settings().QUEUES))
        if unserved:
            yield checks.Warning(
                f"TASKS[{self.alias!r}]['QUEUES'] has {unserved}, which are not in "
                "PGQUEUE['QUEUES']: runtaskworker without --queues will not run them",
                hint="Add them to PGQUEUE['QUEUES'], or start a worker with --queues.",
                id="django_pgqueue.W101",
            )


def _normalized(task: Task, args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """The framework's JSON rules (tuples -> lists, bytes -> str); jsonb's stricter
    ones (no NaN, no NUL, string keys only) are applied by the enqueue itself."""
    try:
        return normalize_json(list(args)), normalize_json(dict(kwargs))
    except TypeError as exc:
        raise TypeError(
            f"cannot enqueue {task.module_path}: arguments must be JSON values ({exc}); "
            "pass ids or ISO-8601 strings instead of objects"
        ) from exc
    except ValueError as exc:
        raise ValueError(
            f"cannot enqueue {task.module_path}: arguments must be JSON values ({exc})"
        ) from exc


def _parse_id(result_id: Any) -> tuple[str, int]:
    """(alias, task id) of a result id: ``123`` (on DATABASE) or ``queue2:123``."""
    database, _, text = str(result_id).rpartition(":")
    if database and database not in queue_databases():
        raise TaskResultDoesNotExist(
            f"no task result with id {result_id!r}: {database!r} is not a database of "
            "PGQUEUE['DATABASES']"
        )
    if not text.isascii() or not text.isdigit() or int(text) > _MAX_ID:
        raise TaskResultDoesNotExist(
            f"no task result with id {result_id!r}: ids are the queue's positive integers"
        )
    return database or get_settings().DATABASE, int(text)
