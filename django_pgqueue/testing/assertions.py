"""What a test asks about the queue: which tasks its code enqueued.

``enqueued`` returns the matching rows; ``assert_enqueued`` and ``refute_enqueued``
fail the test with a message listing what *was* enqueued, so a mismatch (another
argument, another queue) shows at once. Matching (docs/testing.md):

* ``task``: a TaskDefinition (``send_receipt``) or a task name.
* ``args``: the positional arguments, exactly (after the JSON round trip: a tuple
  matches the stored list). Left out: any.
* ``kwargs``: partial, like Oban's ``assert_enqueued``: every given key must be stored
  with an equal value; other stored keys are ignored. Left out: any.
* ``queue``: exactly. Left out: any.
* ``states``: by default ``ENQUEUED_STATES``, the tasks that have not run yet
  (scheduled, pending and waiting). Running and finished tasks do not count.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django_pgqueue.core.conf import database_for, get_setting
from django_pgqueue.core.payload import check_json, dumps

if TYPE_CHECKING:
    from django_pgqueue.models import Task
    from django_pgqueue.tasking.registry import TaskDefinition

# Tasks that have not run yet: "enqueued" in a test's sense.
ENQUEUED_STATES: tuple[str, ...] = ("scheduled", "pending", "waiting")
# A failure message lists at most this many rows.
LISTED = 20


def enqueued(
    task: TaskDefinition | str | None = None,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    states: Iterable[str] = ENQUEUED_STATES,
    database: str | None = None,
) -> list[Task]:
    """The Task rows that match, oldest first (every enqueued task when ``task`` is
    None). ``database``: the alias of the queue's table (default: the queue's, or the
    task's default queue's, by PGQUEUE["DATABASES"])."""
    name = _task_name(task)
    expected_args = _normalised(args, "args")
    expected_kwargs = _normalised(kwargs, "kwargs")
    rows = _candidates(name, queue, states, _alias(task, queue, database))
    return [row for row in rows if _matches(row, expected_args, expected_kwargs)]


def assert_enqueued(
    task: TaskDefinition | str,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    count: int | None = None,
    states: Iterable[str] = ENQUEUED_STATES,
    database: str | None = None,
) -> list[Task]:
    """Fail unless a task matching ``task``, ``args``, ``kwargs`` and ``queue`` is
    enqueued (exactly ``count`` of them, when given). Returns the matching rows."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise TypeError(f"count must be an int >= 0, not {count!r}")
    states = tuple(states)
    found = enqueued(
        task, args=args, kwargs=kwargs, queue=queue, states=states, database=database
    )
    if (count is None and found) or len(found) == count:
        return found
    expected = _expected(task, args, kwargs, queue, states)
    if count is None:
        wanted = f"expected {expected}"
    else:
        wanted = f"expected {count} task(s) matching {expected}; {len(found)} match"
    alias = _alias(task, queue, database)
    raise AssertionError(f"{wanted}; {_found(_task_name(task), states, alias)}")


def refute_enqueued(
    task: TaskDefinition | str,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    states: Iterable[str] = ENQUEUED_STATES,
    database: str | None = None,
) -> None:
    """Fail if a task matching ``task``, ``args``, ``kwargs`` and ``queue`` is enqueued."""
    states = tuple(states)
    found = enqueued(
        task, args=args, kwargs=kwargs, queue=queue, states=states, database=database
    )
    if not found:
        return
    expected = _expected(task, args, kwargs, queue, states)
    raise AssertionError(
        f"expected no {expected}; found {len(found)}: {_listing(found)}"
    )


def _task_name(task: TaskDefinition | str | None) -> str | None:
    from django_pgqueue.tasking.registry import TaskDefinition

    if task is None or isinstance(task, str):
        return task
    if isinstance(task, TaskDefinition):
        return task.name
    raise TypeError(
        f"task must be a task (a function decorated with @task) or a task name, not {task!r}"
    )


def _alias(task: TaskDefinition | str | None, queue: str | None, database: str | None) -> str:
    from django_pgqueue.tasking.registry import TaskDefinition

    if database is not None:
        return database
    if queue is None and isinstance(task, TaskDefinition):
        queue = task.options.queue or task.queue
    if queue is None:
        return get_setting("DATABASE")
    return database_for(queue)


def _normalised(value: Any, what: str) -> Any:
    """The expected value as it reads back from the row: through JSON, as enqueue
    stores it (tuples become lists). A value enqueue would refuse matches nothing, so
    it is refused here too, saying where."""
    if value is None:
        return None
    if what == "args":
        if isinstance(value, str | bytes | Mapping):
            raise TypeError(
                f"args must be a list or tuple of the positional arguments, not {value!r}"
            )
        value = list(value)
    elif not isinstance(value, Mapping):
        raise TypeError(f"kwargs must be a dict, not {value!r}")
    else:
        value = dict(value)
    return json.loads(dumps(check_json(value, what)))


def _candidates(
    name: str | None, queue: str | None, states: Iterable[str], alias: str
) -> list[Task]:
    from django_pgqueue.models import Task

    rows = Task.objects.using(alias).filter(state__in=list(states))
    if name is not None:
        rows = rows.filter(task_name=name)
    if queue is not None:
        rows = rows.filter(queue=queue)
    return list(rows.order_by("id"))


def _matches(row: Task, args: list[Any] | None, kwargs: dict[str, Any] | None) -> bool:
    """An encrypted task's arguments are compared in clear."""
    if args is not None and row.cleartext("args") != args:
        return False
    if kwargs is not None:
        stored = row.cleartext("kwargs") or {}
        return all(key in stored and stored[key] == value for key, value in kwargs.items())
    return True


def _expected(
    task: TaskDefinition | str,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    queue: str | None,
    states: tuple[str, ...],
) -> str:
    parts = ["..."] if args is None else [repr(a) for a in _normalised(args, "args")]
    if kwargs:
        parts += [f"{k}={v!r}" for k, v in _normalised(kwargs, "kwargs").items()]
        if args is not None:
            parts.append("...")  # kwargs match partially
    where = f" in queue {queue!r}" if queue is not None else ""
    return f"{_task_name(task)}({', '.join(parts)}){where} ({_states(states)})"


def _found(name: str | None, states: tuple[str, ...], alias: str) -> str:
    """What is enqueued instead: every row of the task, or (none) every row."""
    same = _candidates(name, None, states, alias)
    if same:
        return f"found {len(same)} {name} task(s): {_listing(same)}"
    others = _candidates(None, None, states, alias)
    if others:
        return f"found no {name} task; other tasks: {_listing(others)}"
    return f"found no task at all (database {alias!r})"


def _listing(rows: list[Task]) -> str:
    described = [
        f"#{row.id} {_call(row.task_name, row.cleartext('args'), row.cleartext('kwargs'))} "
        f"in {row.queue!r} [{row.state}]"
        for row in rows[:LISTED]
    ]
    if len(rows) > LISTED:
        described.append(f"and {len(rows) - LISTED} more")
    return "; ".join(described)


def _call(name: str, args: Any, kwargs: Any) -> str:
    parts = [repr(a) for a in args or []]
    parts += [f"{k}={v!r}" for k, v in (kwargs or {}).items()]
    return f"{name}({', '.join(parts)})"


def _states(states: tuple[str, ...]) -> str:
    if len(states) == 1:
        return states[0]
    return f"{', '.join(states[:-1])} or {states[-1]}"
