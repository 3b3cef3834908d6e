"""Celery's results (``celery.result``), read from the task's row: there is no result
backend, the row is the result.

``AsyncResult(id)`` reads the row each time it is asked (``state``, ``result``,
``traceback``...); ``get()`` polls it until the task has ended. An id is the row's id
as a string (``"1234"``), or the ``task_id=`` a call chose (stored as the row's
unique_key). Rows are kept for PGQUEUE["RESULT_TTL"] (succeeded, cancelled) and
PGQUEUE["DEAD_TTL"] (failed); after that the id reads PENDING, as an expired result
does in Celery.
"""

from __future__ import annotations

import builtins
import re
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from django_pgqueue.celery import states
from django_pgqueue.celery.encoding import decode
from django_pgqueue.celery.exceptions import TaskRevokedError, TimeoutError, Unsupported
from django_pgqueue.celery.state import get_current_task
from django_pgqueue.core.conf import get_settings
from django_pgqueue.ops.operations import cancel, delete_finished

# The unique_key of a call given task_id=: AsyncResult(task_id) finds its row by it.
TASK_ID_KEY = "celery:"
# A retry's error message, as the worker writes it (task.py): "Retry in 5s: type: message".
_RETRY_MESSAGE = re.compile(r"Retry (?:in|at) [^:]*?: ([\w.<>]+): (.*)\Z", re.S)
# How often get() reads the row: soon at first, then every ``interval`` at most.
_FIRST_POLL = 0.005


class AsyncResult:
    """A task's result, by id (``delay()`` and ``apply_async()`` return one)."""

    def __init__(
        self,
        id: Any,
        backend: Any = None,
        task_name: str | None = None,
        app: Any = None,
        parent: Any = None,
        database: str | None = None,
    ) -> None:
        if id is None:
            raise ValueError("AsyncResult needs a task id, not None")
        self.id = str(id)
        self.task_name = task_name
        self.app = app
        self.parent = parent
        self.database = database

    @property
    def task_id(self) -> str:
        return self.id

    # -- the row --------------------------------------------------------------------
    def _row(self) -> Any:
        """The task's row, or None (unknown, or pruned)."""
        from django_pgqueue.models import Task  # not at import: the app may be loading

        rows = Task.objects.using(self.database or get_settings().DATABASE)
        if self.id.isascii() and self.id.isdigit():
            return rows.filter(pk=int(self.id)).first()
        return rows.filter(unique_key=TASK_ID_KEY + self.id).order_by("-id").first()

    @property
    def state(self) -> str:
        return _state(self._row())

    status = state

    @property
    def result(self) -> Any:
        """The return value (SUCCESS), the exception (FAILURE, RETRY, REVOKED), the meta
        of ``update_state`` (a custom state), else None."""
        return _result(self._row())

    info = result

    @property
    def traceback(self) -> str | None:
        row = self._row()
        if row is None or not row.errors or row.state == "succeeded":
            return None
        return row.errors[-1].get("traceback")

    @property
    def date_done(self) -> datetime | None:
        row = self._row()
        return None if row is None else row.finished_at

    @property
    def name(self) -> str | None:
        row = self._row()
        return self.task_name if row is None else row.task_name

    @property
    def args(self) -> list[Any] | None:
        row = self._row()
        return None if row is None else decode(row.cleartext("args"))

    @property
    def kwargs(self) -> dict[str, Any] | None:
        row = self._row()
        return None if row is None else decode(row.cleartext("kwargs"))

    @property
    def retries(self) -> int | None:
        row = self._row()
        return None if row is None else max(0, row.attempt - 1)

    @property
    def queue(self) -> str | None:
        row = self._row()
        return None if row is None else row.queue

    @property
    def worker(self) -> str | None:
        row = self._row()
        return None if row is None else row.worker_id

    def ready(self) -> bool:
        return self.state in states.READY_STATES

    def successful(self) -> bool:
        return self.state == states.SUCCESS

    def failed(self) -> bool:
        return self.state == states.FAILURE

    # -- waiting --------------------------------------------------------------------
    def get(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = 0.5,
        no_ack: bool = True,
        follow_parents: bool = True,
        callback: Callable[..., Any] | None = None,
        on_message: Any = None,
        on_interval: Callable[[], Any] | None = None,
        disable_sync_subtasks: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Wait until the task has ended and return its result; raise its exception
        (FAILURE, REVOKED) if ``propagate``, TimeoutError after ``timeout`` seconds."""
        if disable_sync_subtasks:
            _refuse_inside_task()
        if on_message is not None:
            raise Unsupported(
                "AsyncResult.get(on_message=...) has no counterpart: there are no result "
                "messages; read self.state in a loop, or report progress with "
                "self.update_state(...) and read result.info"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = _FIRST_POLL
        while True:
            row = self._row()
            state = _state(row)
            if state in states.READY_STATES:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("The operation timed out.")
            if on_interval is not None:
                on_interval()
            pause = min(wait, interval)
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)
            wait *= 2
        value = _result(row)
        if callback is not None:
            callback(self.id, value)
        if propagate and state in states.PROPAGATE_STATES:
            raise value
        return value

    wait = get

    def maybe_throw(self, propagate: bool = True, callback: Any = None) -> None:
        row = self._row()
        if propagate and _state(row) in states.PROPAGATE_STATES:
            raise _result(row)

    # -- operations -----------------------------------------------------------------
    def revoke(
        self,
        connection: Any = None,
        terminate: bool = False,
        signal: Any = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Cancel the task: a task not started yet never starts; a running one is asked
        to stop (``terminate=True``: its process is killed, with EXECUTION = "process")."""
        row = self._row()
        if row is not None:
            cancel(row.id, hard=terminate, database=self.database)
        if wait:
            self.get(timeout=timeout, propagate=False)

    def forget(self) -> None:
        """Delete the row of a task that has ended (Celery deletes its stored result);
        a task still to run is left alone."""
        row = self._row()
        if row is not None:
            delete_finished([row.id], database=self.database)

    def then(self, *args: Any, **kwargs: Any) -> Any:
        raise Unsupported(
            "AsyncResult.then has no counterpart: there are no result messages to wait "
            "on; link a task instead (apply_async(link=...)) or chain one"
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AsyncResult):
            return other.id == self.id
        if isinstance(other, str | int):
            return str(other) == self.id
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.id)

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.id}>"


class ResultSet:
    """Several results: ``get()`` returns their results in order."""

    def __init__(self, results: list[Any], app: Any = None, **kwargs: Any) -> None:
        self.results = list(results)
        self.app = app

    def __iter__(self) -> Iterator[Any]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, index: int) -> Any:
        return self.results[index]

    def add(self, result: Any) -> None:
        if result not in self.results:
            self.results.append(result)

    def ready(self) -> bool:
        return all(r.ready() for r in self.results)

    def successful(self) -> bool:
        return all(r.successful() for r in self.results)

    def failed(self) -> bool:
        return any(r.failed() for r in self.results)

    def waiting(self) -> bool:
        return not self.ready()

    def completed_count(self) -> int:
        return sum(1 for r in self.results if r.successful())

    def revoke(self, connection: Any = None, terminate: bool = False, **kwargs: Any) -> None:
        for r in self.results:
            r.revoke(terminate=terminate)

    def forget(self) -> None:
        for r in self.results:
            r.forget()

    def get(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = 0.5,
        callback: Callable[..., Any] | None = None,
        disable_sync_subtasks: bool = True,
        **kwargs: Any,
    ) -> list[Any]:
        """Every member's result, in order, waiting ``timeout`` seconds at most in all."""
        deadline = None if timeout is None else time.monotonic() + timeout
        values = []
        for r in self.results:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            values.append(
                r.get(timeout=left, propagate=propagate, interval=interval, callback=callback,
                      disable_sync_subtasks=disable_sync_subtasks)
            )  # fmt: skip
        return values

    join = get

    def join_native(self, *args: Any, **kwargs: Any) -> list[Any]:
        return self.get(*args, **kwargs)

    @property
    def children(self) -> list[Any]:
        return self.results


class GroupResult(ResultSet):
    """A group's results (``group(...).apply_async()``). Its id is made up by the call:
    there is no group row, so ``save()`` and ``restore()`` are refused."""

    def __init__(
        self,
        id: str | None = None,
        results: list[Any] | None = None,
        parent: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(results or [], **kwargs)
        self.id = id
        self.parent = parent

    def save(self, backend: Any = None) -> None:
        raise Unsupported(_NO_GROUP_ROW)

    def delete(self, backend: Any = None) -> None:
        raise Unsupported(_NO_GROUP_ROW)

    @classmethod
    def restore(cls, id: str, backend: Any = None, app: Any = None) -> GroupResult:
        raise Unsupported(_NO_GROUP_ROW)

    def __repr__(self) -> str:
        return f"<GroupResult: {self.id} [{', '.join(r.id for r in self.results)}]>"


_NO_GROUP_ROW = (
    "GroupResult.save/restore/delete have no counterpart: a group is its members' rows, "
    "with no row of its own; keep the members' ids ([r.id for r in result.results]) and "
    "rebuild it with GroupResult(results=[AsyncResult(i) for i in ids])"
)


class EagerResult(AsyncResult):
    """The result of ``apply()``: the task ran here, in this process."""

    def __init__(
        self,
        id: str,
        ret_value: Any,
        state: str,
        traceback: str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(id, task_name=name)
        self._result = ret_value
        self._state = state
        self._traceback = traceback

    @property
    def state(self) -> str:
        return self._state

    status = state

    @property
    def result(self) -> Any:
        return self._result

    info = result

    @property
    def traceback(self) -> str | None:
        return self._traceback

    @property
    def name(self) -> str | None:
        return self.task_name

    def ready(self) -> bool:
        return True

    def get(self, timeout: float | None = None, propagate: bool = True, **kwargs: Any) -> Any:
        if propagate and self._state in states.PROPAGATE_STATES:
            raise self._result
        return self._result

    wait = get

    def revoke(self, *args: Any, **kwargs: Any) -> None:
        self._state = states.REVOKED

    def forget(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<EagerResult: {self.id}>"


def _refuse_inside_task() -> None:
    if get_current_task() is not None:
        raise RuntimeError(
            "Never call result.get() within a task!\nSee "
            "https://docs.celeryq.dev/en/latest/userguide/tasks.html"
            "#avoid-launching-synchronous-subtasks (here: a chain or a chord, or "
            "self.request.task_context.wait_for(...), wait without holding a slot)"
        )


def _state(row: Any) -> str:
    if row is None:
        return states.PENDING
    progress = row.cleartext("progress")
    if row.state == "running" and isinstance(progress, dict) and progress.get("state"):
        return str(progress["state"])
    return states.celery_state(row.state, row.attempt, row.errors)


def _result(row: Any) -> Any:
    state = _state(row)
    if row is None or state == states.PENDING:
        return None
    if state == states.SUCCESS:
        return decode(row.cleartext("result"))
    if state in (states.FAILURE, states.RETRY):
        return exception_from_error(row.errors[-1]) if row.errors else None
    if state == states.REVOKED:
        message = row.errors[-1].get("message") if row.errors else None
        return TaskRevokedError(message or "revoked")
    progress = row.cleartext("progress")
    return decode(progress.get("meta")) if isinstance(progress, dict) else None


def exception_from_error(error: dict[str, Any]) -> BaseException:
    """A stored error entry as an exception: of its own class when that is a builtin,
    or a class of a module this process has already imported (nothing is imported for
    a row), else of a stand-in class with the same module and name. A retry's entry
    gives the exception that was retried."""
    kind, message = str(error.get("type") or "Exception"), str(error.get("message") or "")
    retried = _RETRY_MESSAGE.match(message) if kind.endswith(".Retry") else None
    if retried:
        kind, message = retried[1], retried[2]
    return _exception_class(kind)(message)


_STAND_INS: dict[str, type[Exception]] = {}


def _exception_class(kind: str) -> type[BaseException]:
    """The class a stored ``module.qualname`` names, if it is loaded here (the longest
    prefix that is a loaded module, then attributes: nested classes too), else a
    stand-in."""
    parts = kind.split(".")
    found: Any = getattr(builtins, kind, None) if len(parts) == 1 else None
    for split in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:split]))
        if module is None:
            continue
        found = module
        for part in parts[split:]:
            found = getattr(found, part, None)
        break
    if isinstance(found, type) and issubclass(found, BaseException):
        try:
            found("probe")
        except Exception:
            pass
        else:
            return found
    if kind not in _STAND_INS:
        module, _, qualname = kind.rpartition(".")
        _STAND_INS[kind] = type(
            qualname or "Exception",
            (Exception,),
            {"__module__": module or "builtins", "__qualname__": qualname},
        )
    return _STAND_INS[kind]
