"""Shapes of waiting work (docs/workflows.md): a chain, a group, a chord.

Each is made of ordinary enqueues in the caller's transaction, tied by ``after=``
(``pgqueue_dependency`` edges): roll the transaction back and none of it exists; commit
it and the database moves each step on when its parents end (the
pgqueue_release_dependents trigger), with no coordinator process::

    from django_pgqueue.tasking.workflows import chain, chord, group

    chain(fetch.step(url), parse.step(), store.step())     # one after the other
    group(resize.step(img, size) for size in (64, 256))    # side by side
    chord([render.step(page) for page in pages], bundle.step(doc_id))  # then once

A step is ``task.step(*args, **kwargs)``, or ``task.using(...).step(...)`` for options.
A step reads what its parents returned with ``context.parent_results()`` (tasks with
``takes_context=True``): arguments are fixed when the workflow is enqueued.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django_pgqueue.core.conf import database_for
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.options import call
from django_pgqueue.tasking.registry import Step as Step


def _steps(steps: Iterable[Step], what: str, extra: Iterable[Step] = ()) -> list[Step]:
    """The steps, checked: each a Step, and all of them (with ``extra``) on one
    database, since a task waits only for tasks of its own table."""
    steps = list(steps)
    for step in steps:
        if not isinstance(step, Step):
            raise InvalidTaskError(f"{what} takes steps (task.step(*args, **kwargs)), not {step!r}")
    by_alias: dict[str, str] = {}
    for step in [*steps, *extra]:
        queue = step.task.options.queue or step.task.queue
        by_alias.setdefault(database_for(queue), queue)
    if len(by_alias) > 1:
        named = ", ".join(f"queue {q!r} on {a!r}" for a, q in by_alias.items())
        raise InvalidTaskError(
            f"a {what} must be on one database, and its steps are not ({named}): a task "
            "waits only for tasks of its own database (PGQUEUE['DATABASES']); nothing was "
            "enqueued"
        )
    return steps


def chain(*steps: Step, after: Iterable[int] = (), after_failure: str | None = None) -> list[int]:
    """Enqueue ``steps`` so that each waits for the one before (the first for
    ``after``); returns their ids in order. If a step fails or is cancelled, the steps
    after it are cancelled (``after_failure="run"``: they run anyway)."""
    ids: list[int] = []
    previous = list(after)
    for step in _steps(steps, "chain"):
        task_id = step.enqueue(after=previous, after_failure=after_failure)
        ids.append(task_id)
        previous = [task_id]
    return ids


def group(
    steps: Iterable[Step], *, after: Iterable[int] = (), after_failure: str | None = None
) -> list[int]:
    """Enqueue ``steps`` to run side by side (each after ``after``, if given); returns
    their ids in order. Steps of one task without ``after`` share one statement
    (enqueue_many), so a group of 10,000 is a few statements."""
    steps = _steps(steps, "group")
    after = list(after)
    if after or after_failure is not None:
        return [s.enqueue(after=after, after_failure=after_failure) for s in steps]
    ids: list[int | None] = [None] * len(steps)
    by_task: dict[int, list[int]] = {}
    for index, step in enumerate(steps):
        by_task.setdefault(id(step.task), []).append(index)
    for indexes in by_task.values():
        definition = steps[indexes[0]].task
        calls = [_call(steps[i]) for i in indexes]
        for index, task_id in zip(indexes, definition.enqueue_many(calls), strict=True):
            ids[index] = task_id
    return ids  # type: ignore[return-value]


def chord(
    steps: Iterable[Step], callback: Step, *, after_failure: str | None = None
) -> tuple[list[int], int]:
    """A group and a callback that runs once, after every member has ended; returns
    (the members' ids, the callback's id). If a member fails or is cancelled, the
    callback is cancelled (``after_failure="run"``: it runs anyway and reads each
    member's outcome with ``context.parent_results()``)."""
    if not isinstance(callback, Step):
        raise InvalidTaskError(f"chord's callback is a step, not {callback!r}")
    members = group(_steps(steps, "chord", extra=[callback]))
    if not members:
        return [], callback.enqueue(after_failure=after_failure)
    return members, callback.enqueue(after=members, after_failure=after_failure)


def _call(step: Step) -> Any:
    return call(*step.args, **step.kwargs)
